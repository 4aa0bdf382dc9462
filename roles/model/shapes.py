"""Where ``llamarack plan`` gets a model's shape: a GGUF header (a local file, or read from
the hub with HTTP ranges) or a ``config.json`` and a quant; the shape is the dict
``roles/model/files/gguf_header.py`` makes, as the ``GgufShape`` fact does on a host.

From a ``config.json`` the weights are estimated: the tensors llama.cpp's
converter writes for the architecture, each counted with the type
``llama-quantize`` would give it (src/llama-quant.cpp,
``llama_tensor_get_type``), at ggml's block sizes. For Q4_K_M and Q5_K_M
that is: 1-D tensors (norms, biases) f32; the output layer, and the token
embedding when it is also the output (tied), Q6_K; ``attn_v`` and
``ffn_down`` Q6_K on the layers ``use_more_bits`` picks (the first and last
eighth, and every third between); the rest Q4_K (Q5_K). A 256-block type on
a row not a multiple of 256 falls back as llama.cpp does (Q4_K to Q5_0, Q5_K
to Q5_1, Q6_K to Q8_0). Left out: imatrix-driven choices, MoE and fused-QKV
rules, and the architectures not listed in ``LAYER_NORMS``.
"""

from __future__ import annotations

import io
import os
from typing import Optional
from urllib.parse import quote

import requests

from llamarack.errors import ModelSourceError
from roles.model.files.gguf_header import (GGML_BLOCKS, GgufError, check_shape, check_values, read_shape,
                                                     shape_of)  # fmt: skip

# ggml type ids (GGML_BLOCKS' keys) by name.
GGML = {"F32": 0, "F16": 1, "Q4_0": 2, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14,
        "BF16": 30}  # fmt: skip
# quant name: (base type, Q6_K on attn_v/ffn_down where use_more_bits, the GGUF
# general.file_type llama-quantize writes for it: llama.h, enum llama_ftype)
QUANTS = {"Q4_K_M": ("Q4_K", True, 15), "Q5_K_M": ("Q5_K", True, 17), "Q4_K_S": ("Q4_K", False, 14),
          "Q6_K": ("Q6_K", False, 18), "Q8_0": ("Q8_0", False, 7), "Q4_0": ("Q4_0", False, 2),
          "F16": ("F16", False, 1), "BF16": ("BF16", False, 32)}  # fmt: skip
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
# config.json model_type -> (GGUF architecture, norms per layer, q/k norms, attention biases)
LAYER_NORMS = {
    "llama": ("llama", 2, False, False), "mistral": ("llama", 2, False, False),
    "qwen2": ("qwen2", 2, False, True), "qwen3": ("qwen3", 2, True, False),
    "gemma2": ("gemma2", 4, False, False), "gemma3_text": ("gemma3", 4, True, False),
}  # fmt: skip
# What transformers' config classes default to, when a published config.json leaves a
# key out (Gemma3TextConfig: google/gemma-3-27b-it's config.json names no vocab_size,
# context, pattern or tying).
CONFIG_DEFAULTS = {
    "gemma3_text": {"vocab_size": 262208, "max_position_embeddings": 131072,
                    "sliding_window_pattern": 6, "tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True},
}  # fmt: skip
HEADER_CHUNK = 4 * 2**20  # bytes per HTTP range request
# The config.json key each count of a shape is read from (the same checks as a GGUF's).
CONFIG_KEYS = {"n_embd": "hidden_size", "n_ff": "intermediate_size", "n_layer": "num_hidden_layers",
               "n_head": "num_attention_heads", "n_vocab": "vocab_size", "n_ctx_train": "max_position_embeddings",
               "n_head_kv": "num_key_value_heads", "head_dim_k": "head_dim"}  # fmt: skip


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _tensor_bytes(type_name: str, ne0: int, rows: int) -> int:
    if GGML_BLOCKS[GGML[type_name]][0] == 256 and ne0 % 256:
        type_name = _FALLBACK.get(type_name, type_name)
    per_block, block_bytes = GGML_BLOCKS[GGML[type_name]]
    return ne0 * rows // per_block * block_bytes


def quant_type(quant: str, role: str, i_layer: int = 0, n_layer: int = 1, tied: bool = False) -> str:
    """The type llama-quantize gives a 2-D tensor (``role``: output, token_embd,
    attn_v, ffn_down, or any other) under ``quant``."""
    base, more_bits, _ = QUANTS[quant]
    if base in ("F16", "BF16"):
        return base
    if role == "output" or (role == "token_embd" and tied):
        return "Q8_0" if base == "Q8_0" else "Q6_K"
    if more_bits and role in ("attn_v", "ffn_down") and _use_more_bits(i_layer, n_layer):
        return "Q6_K"
    return base


def shape_from_config(config: dict, quant: str, name: str = "config.json") -> dict:
    """The planner's shape for a Hugging Face ``config.json`` quantized to ``quant``."""
    if quant not in QUANTS:
        raise ModelSourceError(f"{name}: quant {quant!r} is not estimated here; known: {', '.join(QUANTS)}")
    if not isinstance(config, dict) or not isinstance(config.get("text_config") or {}, dict):
        raise ModelSourceError(f"{name}: not a model's config (a JSON object, its text_config one too)")
    c = dict(config.get("text_config") or config)
    model_type = c.get("model_type") or config.get("model_type")
    model_type = "gemma3_text" if model_type == "gemma3" else model_type
    if model_type not in LAYER_NORMS:
        raise ModelSourceError(f"{name}: model_type {model_type!r} is not estimated here; known: "
                               f"{', '.join(LAYER_NORMS)} (or plan from the GGUF itself)")  # fmt: skip
    c = {**CONFIG_DEFAULTS.get(model_type, {}), **c}
    arch, norms, qk_norm, biases = LAYER_NORMS[model_type]
    try:
        n_embd, n_ff, n = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
        n_head, vocab, trained = c["num_attention_heads"], c["vocab_size"], c["max_position_embeddings"]
    except KeyError as e:
        raise ModelSourceError(f"{name}: no {e.args[0]} (a {model_type} config.json names it)") from None
    try:  # before anything is counted with them
        check_values({"n_embd": n_embd, "n_ff": n_ff, "n_layer": n, "n_head": n_head, "n_vocab": vocab,
                      "n_ctx_train": trained}, CONFIG_KEYS)  # fmt: skip
        # as the converter writes them and llama.cpp takes them: a value given (0 too) as it is
        n_kv = n_head if c.get("num_key_value_heads") is None else c["num_key_value_heads"]
        hd = n_embd // n_head if c.get("head_dim") is None else c["head_dim"]
        check_values({"n_head_kv": n_kv, "head_dim_k": hd}, CONFIG_KEYS)
    except GgufError as e:
        raise ModelSourceError(f"{name}: {e}") from None
    if not isinstance(c.get("rope_scaling") or {}, dict) or not isinstance(c.get("layer_types") or [], list):
        raise ModelSourceError(f"{name}: rope_scaling is not an object, or layer_types not a list")
    tied = bool(c.get("tie_word_embeddings", False))
    norm_bytes = 4 * (norms * n_embd + (2 * hd if qk_norm else 0) + ((n_head + 2 * n_kv) * hd if biases else 0))
    matrices = (("attn_q", n_embd, n_head * hd), ("attn_k", n_embd, n_kv * hd), ("attn_v", n_embd, n_kv * hd),
                ("attn_output", n_head * hd, n_embd), ("ffn_gate", n_embd, n_ff), ("ffn_up", n_embd, n_ff),
                ("ffn_down", n_ff, n_embd))  # fmt: skip
    layers = [norm_bytes + sum(_tensor_bytes(quant_type(quant, role, i, n), ne0, rows) for role, ne0, rows in matrices)
              for i in range(n)]  # fmt: skip
    embd = _tensor_bytes(quant_type(quant, "token_embd", tied=tied), n_embd, vocab)
    output = 4 * n_embd + (0 if tied else _tensor_bytes(quant_type(quant, "output"), n_embd, vocab))
    swa = c.get("sliding_window") if c.get("use_sliding_window", True) else None
    layer_types = c.get("layer_types")
    pattern = [t == "sliding_attention" for t in layer_types] if layer_types else c.get("sliding_window_pattern")
    rope = c.get("rope_scaling") or {}
    rope_type = rope.get("rope_type") or rope.get("type")
    shape = {"path": name, "size": sum(layers) + embd + output, "architecture": arch, "file_type": QUANTS[quant][2],
             "n_layer": n, "n_ctx_train": trained, "n_head": n_head, "n_head_kv": n_kv,
             "head_dim_k": hd, "head_dim_v": hd, "n_embd": n_embd, "n_ff": n_ff, "n_vocab": vocab,
             "n_swa": swa or 0, "swa_pattern": pattern if swa else None,
             # as the converter writes them: a type llama.cpp names (llama3's goes into a tensor), and
             # the original context for YaRN only
             "rope_scaling": rope_type if rope_type in ("linear", "yarn") else None,
             "rope_scale": rope.get("factor") if rope_type in ("linear", "yarn") else None,
             "rope_orig_ctx": rope.get("original_max_position_embeddings") if rope_type == "yarn" else None,
             "layer_bytes": layers, "token_embd_bytes": embd, "output_bytes": output, "tied_embeddings": tied,
             "estimated_from": f"{name} at {quant} (llama-quantize's type rules, ggml block sizes)"}  # fmt: skip
    try:
        check_shape(shape)
    except GgufError as e:
        raise ModelSourceError(f"{name}: {e}") from None
    return shape


class RangeFile(io.RawIOBase):
    """A remote file read forward with HTTP Range requests, HEADER_CHUNK at a time:
    enough of a file object for the GGUF header reader (read, seek forward)."""

    def __init__(self, url: str, headers: dict, timeout: float = 30.0):
        self.url, self.headers, self.timeout = url, headers, timeout
        self.pos, self.size, self.requests = 0, None, 0
        self.buf_start, self.buf = 0, b""

    def _fetch(self, start: int) -> None:
        try:
            r = requests.get(self.url, headers={**self.headers, "Range": f"bytes={start}-{start + HEADER_CHUNK - 1}"},
                             timeout=self.timeout, allow_redirects=True)  # fmt: skip
        except requests.RequestException as e:
            raise ModelSourceError(f"cannot read {self.url}: {e.__class__.__name__}: {e}") from None
        self.requests += 1
        if r.status_code == 416:
            self.buf_start, self.buf = start, b""
            return
        if r.status_code != 206:
            raise ModelSourceError(f"{self.url}: HTTP {r.status_code} to a Range request "
                                   "(the hub must answer 206 Partial Content)")  # fmt: skip
        total = r.headers.get("Content-Range", "").rpartition("/")[2]
        self.size = int(total) if total.isdigit() else self.size
        self.buf_start, self.buf = start, r.content

    def read(self, n: int = -1) -> bytes:
        out = b""
        while n > 0:
            offset = self.pos - self.buf_start
            if not 0 <= offset < len(self.buf):
                self._fetch(self.pos)
                offset = 0
                if not self.buf:
                    break
            piece = self.buf[offset:offset + n]
            out += piece
            self.pos += len(piece)
            n -= len(piece)
        return out

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self.pos = offset if whence == os.SEEK_SET else self.pos + offset
        return self.pos


def hub_gguf_shape(endpoint: str, repo: str, revision: str, file: str, token: Optional[str] = None) -> dict:
    """The shape of ``file`` in ``repo`` at ``revision``, reading only its header."""
    url = f"{endpoint.rstrip('/')}/{repo}/resolve/{quote(revision, safe='')}/{quote(file)}"
    f = RangeFile(url, {"Authorization": f"Bearer {token}"} if token else {})
    try:
        shape = shape_of(f, f"{repo}@{revision}/{file}", 0)
    except GgufError as e:
        raise ModelSourceError(f"{repo}@{revision}/{file}: {e}") from None
    shape.update(size=f.size or 0, header_requests=f.requests)
    return shape


def local_gguf_shape(path: str) -> dict:
    try:
        return read_shape(path)
    except (GgufError, OSError) as e:
        raise ModelSourceError(f"{path}: {e}") from None
