"""The model role's settings section (host-data keys ``model_*``), and the draft's settings."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional

from llamarack.settings_fields import (PATH_PART, Section, control_file, git_revision, remote_url, setting,
                                       sha256_hex)  # fmt: skip

if TYPE_CHECKING:
    from llamarack.settings import Settings

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


@dataclass(frozen=True)
class ModelSettings(Section):
    """Which model is served and how it is quantized."""

    prefix = "model"

    source: Literal["hf", "gguf", "url"] = setting(
        "hf", "hf (convert a checkpoint), gguf (a prequantized file from a hub) or url"
    )
    repo: Optional[str] = setting(None, "hub repository id, e.g. Qwen/Qwen2.5-7B-Instruct", _hub_repo)
    revision: Optional[str] = setting(
        None, "hub commit sha the repository is pinned to; given in full (40 hex digits), a llama.cpp "
        "bump asks the hub nothing", git_revision
    )
    file: Optional[str] = setting(None, "file name in the repository (source gguf)", _repo_file)
    url: Optional[str] = setting(None, "download URL (source url)", remote_url)
    sha256: Optional[str] = setting(None, "sha256 of the file at url (source url)", sha256_hex)
    hf_endpoint: str = setting("https://huggingface.co", "Hugging Face endpoint or mirror", remote_url)
    hf_token_file: Optional[str] = setting(
        None,
        "file on the control machine holding the hub token (never printed; mode 600 or 400)",
        control_file,
    )
    quant: str = setting("Q4_K_M", "llama-quantize type", choices=QUANT_TYPES)
    hf_include: tuple[str, ...] = setting(
        ("*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt"),
        "repository files fetched for source hf (shell patterns on their paths)",
        _repo_pattern,
    )
    convert_outtype: Literal["f16", "bf16", "f32"] = setting(
        "f16", "GGUF type convert_hf_to_gguf.py writes before llama-quantize"
    )
    keep_intermediates: bool = setting(
        False, "keep the downloaded checkpoint and the unquantized GGUF after quantizing"
    )
    fetch_retries: int = setting(
        5, "times a dropped download is resumed (HTTP Range) before the run fails", between=(1, 100)
    )
    # -- the draft model (speculative decoding): fetched, converted and quantized as the model is --
    draft_repo: Optional[str] = setting(
        None,
        "hub repository of a draft model for speculative decoding (it must share the model's "
        "vocabulary, e.g. a 0.5B of the same family); None: no draft",
        _hub_repo,
    )
    draft_revision: Optional[str] = setting(None, "hub commit sha the draft repository is pinned to", git_revision)
    draft_source: Literal["hf", "gguf"] = setting(
        "hf", "hf (convert the draft's checkpoint) or gguf (a prequantized file of draft_repo)"
    )
    draft_file: Optional[str] = setting(None, "file name in the draft repository (draft source gguf)", _repo_file)
    draft_quant: str = setting("Q8_0", "llama-quantize type of the draft (draft source hf)", choices=QUANT_TYPES)

    def problems(self) -> list[str]:
        problems = []
        if self.source in ("hf", "gguf") and self.repo and not self.revision:
            problems.append(
                f"model_revision: given None; allowed: a commit sha of {self.repo} "
                "(a branch can move under you)"
            )
        if self.source == "gguf" and self.repo and not self.file:
            problems.append("model_file: given None; allowed: the GGUF file name in model_repo")
        if self.source == "url" and not (self.url and self.sha256):
            problems.append("model_url/model_sha256: a url source needs both")
        if self.draft_repo and not self.draft_revision:
            problems.append(
                f"model_draft_revision: given None; allowed: a commit sha of {self.draft_repo} "
                "(a branch can move under you)"
            )
        if self.draft_repo and self.draft_source == "gguf" and not self.draft_file:
            problems.append("model_draft_file: given None; allowed: the draft GGUF's file name in model_draft_repo")
        return problems


def draft_settings(s: Settings) -> Optional[Settings]:
    """The settings the model role makes the draft artifact from: the model's, with the
    draft's source, repository, revision, file and quant; None when no draft is asked.
    Endpoint, token, include patterns, converter type and retries are the model's."""
    m = s.model
    if not m.draft_repo:
        return None
    draft = dataclasses.replace(m, source=m.draft_source, repo=m.draft_repo, revision=m.draft_revision,
                                file=m.draft_file, quant=m.draft_quant, url=None, sha256=None)  # fmt: skip
    return dataclasses.replace(s, model=draft)
