"""The model role's settings section (host-data keys ``model_*``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

from llamarack.settings_fields import (PATH_PART, Section, control_file, git_revision, remote_url, setting,
                                       sha256_hex)  # fmt: skip

QUANT_TYPES = (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
    "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K",
    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ3_S", "IQ4_NL", "IQ4_XS",
    "F16", "BF16",
)  # fmt: skip


def _hub_repo(value: str) -> Optional[str]:
    part = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
    if not re.fullmatch(f"{part}(/{part})?", value) or ".." in value:
        return "a hub repository id: owner/name of letters, digits, . _ - (no .., no leading /), e.g. Qwen/Qwen2.5-7B-Instruct"
    return None


def _repo_file(value: str) -> Optional[str]:
    parts = value.split("/")
    if not all(re.fullmatch(PATH_PART, part) and part not in (".", "..") for part in parts):
        return "a file path inside the repository, of names made of letters, digits, . _ + - (no .., no leading /)"
    return None


def _repo_pattern(value: str) -> Optional[str]:
    parts = value.split("/")
    if not all(re.fullmatch(r"[A-Za-z0-9_.+*?\[\]-]+", part) and part not in (".", "..") for part in parts):
        return ("a shell pattern on the repository's file paths, of letters, digits, . _ + - and * ? [ ] "
                "(no spaces, no .., no leading /), e.g. *.safetensors")
    return None


def _group_size(value: int) -> Optional[str]:
    return None if value in (32, 64, 128) else "32, 64 or 128 (the group sizes AutoAWQ takes)"


@dataclass(frozen=True)
class ModelSettings(Section):
    """Which model is served and how it is quantized."""

    prefix = "model"

    source: Literal["hf", "gguf", "url"] = setting("hf", "hf (convert a checkpoint), gguf (a prequantized file "
                                                   "from a hub) or url")
    repo: Optional[str] = setting(None, "hub repository id, e.g. Qwen/Qwen2.5-7B-Instruct", _hub_repo)
    revision: Optional[str] = setting(
        None, "hub commit sha the repository is pinned to; given in full (40 hex digits), a llama.cpp "
        "bump asks the hub nothing", git_revision)
    file: Optional[str] = setting(None, "file name in the repository (source gguf)", _repo_file)
    url: Optional[str] = setting(None, "download URL (source url)", remote_url)
    sha256: Optional[str] = setting(None, "sha256 of the file at url (source url)", sha256_hex)
    hf_endpoint: str = setting("https://huggingface.co", "Hugging Face endpoint or mirror", remote_url)
    hf_token_file: Optional[str] = setting(
        None, "file on the control machine holding the hub token (never printed; mode 600 or 400)", control_file)
    quant: str = setting("Q4_K_M", "llama-quantize type", choices=QUANT_TYPES)
    hf_include: tuple[str, ...] = setting(("*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt"),
                                          "repository files fetched for source hf (shell patterns on their paths)",
                                          _repo_pattern)
    convert_outtype: Literal["f16", "bf16", "f32"] = setting("f16", "GGUF type convert_hf_to_gguf.py writes before "
                                                             "llama-quantize")
    keep_intermediates: bool = setting(False, "keep the downloaded checkpoint and the unquantized GGUF after "
                                       "quantizing")
    fetch_retries: int = setting(5, "times a dropped download is resumed (HTTP Range) before the run fails",
                                 between=(1, 100))
    ship_artifacts: bool = setting(
        True, "make each model artifact once in a run (fetch, AWQ, convert, quantize, quality), on a host whose "
        "blob cache holds the checkpoint where one does, and ship it, sealed, through the control machine to "
        "the other hosts that need the same artifact (a receiving host keeps no intermediates and no "
        "checkpoint); False makes it on every host")
    # -- the quantization route, and AutoAWQ's quant_config for route awq --
    route: Literal["gguf", "awq"] = setting(
        "gguf", "gguf (convert_hf_to_gguf.py, then llama-quantize) or awq (AutoAWQ's scales applied into the "
        "fp16 weights in the AWQ env, calibrated on the host's GPU when it has one, then the same convert "
        "and llama-quantize); source hf only")
    awq_zero_point: bool = setting(True, "AutoAWQ quant_config zero_point (route awq)")
    awq_q_group_size: int = setting(128, "AutoAWQ quant_config q_group_size (route awq)", _group_size,
                                    between=(32, 128))
    awq_w_bit: int = setting(4, "AutoAWQ quant_config w_bit (route awq; its kernels take 4 only)",
                         between=(4, 4))
    awq_version: Literal["GEMM", "GEMV"] = setting("GEMM", "AutoAWQ quant_config version (route awq)")
    awq_calibration_file: Optional[str] = setting(
        None, "text file on the control machine AutoAWQ calibrates on (paragraphs split by blank lines; "
        "route awq); None: the text shipped in roles/model/files/calibration.txt", control_file)
    # -- the quality of a new artifact: llama-perplexity against its f16 GGUF --
    quality: bool = setting(
        False, "measure a new converted artifact with llama-perplexity on a held-out text: perplexity, and KL "
        "divergence against its f16 GGUF with f16, q8_0 and q4_0 KV; recorded in its stamp.json (builds "
        "llama-perplexity too: one rebuild of llama.cpp when turned on)")
    quality_text_file: Optional[str] = setting(
        None, "held-out text file on the control machine the quality is measured on (never the calibration "
        "text); None: roles/model/files/quality.txt", control_file)
    quality_max_kld: Optional[float] = setting(
        None, "refuse a new artifact whose mean KL divergence (any KV type measured) is above this; the "
        "served one stays; None: no bound", between=(0.0, 100.0))
    keep_f16: bool = setting(False, "keep the f16 GGUF the quality is measured against, beside the artifact")
    # -- the draft model (speculative decoding): fetched, converted and quantized as the model is --
    draft_repo: Optional[str] = setting(
        None, "hub repository of a draft model for speculative decoding (it must share the model's "
        "vocabulary, e.g. a 0.5B of the same family); None: no draft", _hub_repo)
    draft_revision: Optional[str] = setting(None, "hub commit sha the draft repository is pinned to", git_revision)
    draft_source: Literal["hf", "gguf"] = setting("hf", "hf (convert the draft's checkpoint) or gguf (a "
                                                  "prequantized file of draft_repo)")
    draft_file: Optional[str] = setting(None, "file name in the draft repository (draft source gguf)", _repo_file)
    draft_quant: str = setting("Q8_0", "llama-quantize type of the draft (draft source hf)", choices=QUANT_TYPES)

    def problems(self) -> list[str]:
        problems = []
        if self.source in ("hf", "gguf") and self.repo and not self.revision:
            problems.append(f"model_revision: given None; allowed: a commit sha of {self.repo} "
                            "(a branch can move under you)")
        if self.source == "gguf" and self.repo and not self.file:
            problems.append("model_file: given None; allowed: the GGUF file name in model_repo")
        if self.source == "url" and not (self.url and self.sha256):
            problems.append("model_url/model_sha256: a url source needs both")
        if self.route == "awq" and self.source != "hf":
            problems.append(f"model_route: given 'awq' with model_source={self.source!r}; allowed: 'gguf' "
                            "(AWQ calibrates a checkpoint: model_source='hf')")
        if self.route == "awq" and self.quant in ("F16", "BF16"):
            problems.append(f"model_route: given 'awq' with model_quant={self.quant!r}; allowed: 'gguf' "
                            "(AWQ's scales serve a quantized type, e.g. Q4_K_M)")
        if self.quality_max_kld is not None and not (self.quality and self.source == "hf"):
            problems.append(f"model_quality_max_kld: given {self.quality_max_kld}; allowed: None unless "
                            "model_quality is True and model_source is 'hf' (nothing else is measured)")
        if self.draft_repo and not self.draft_revision:
            problems.append(f"model_draft_revision: given None; allowed: a commit sha of {self.draft_repo} "
                            "(a branch can move under you)")
        if self.draft_repo and self.draft_source == "gguf" and not self.draft_file:
            problems.append("model_draft_file: given None; allowed: the draft GGUF's file name in model_draft_repo")
        return problems
