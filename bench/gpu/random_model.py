"""Random-weight checkpoints of real architectures' shapes, for the GPU proof.

Random weights decode at the speed trained ones do: every weight is read once
per token whatever its value. Two outputs:

    python3 bench/gpu/random_model.py checkpoint SHAPE DIR --tokenizer TOKDIR
        a Hugging Face Llama checkpoint (config.json, safetensors shards and
        their index, the SentencePiece tokenizer of TOKDIR), the input of the
        model role's convert + quantize

    python3 bench/gpu/random_model.py gguf SHAPE FILE --gguf-py DIR
        an f16 GGUF written directly with gguf-py (the pinned llama.cpp's
        own), tensor by tensor, for a checkpoint too big to write twice
        (a 24B at f16 is 47 GB: the model role would hold the safetensors and
        the f16 GGUF at once); llama-quantize makes the Q4_K_M of it

Weights are N(0, 0.02) in float16 (norms 1.0), drawn on the GPU when there
is one (torch), a tensor at a time. ``--scale-down N`` divides every width
and the layer count by N (at least 1, head size kept): the same code on a
CPU with a tiny shape.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

# Published shapes (the models' own config.json files).
SHAPES = {
    # Meta-Llama-3-8B
    "llama3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                      vocab_size=128256, rope_theta=500000.0, max_position_embeddings=8192,
                      rms_norm_eps=1e-5),
    # Mistral-Small-3.1-24B (text part): GQA 32/8, the largest published class whose
    # Q4_K_M (about 14.3 GB) leaves a V100 16 GB any context after the reserve
    "mistral-small-24b": dict(hidden_size=5120, intermediate_size=32768, num_hidden_layers=40,
                              num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                              vocab_size=131072, rope_theta=1000000000.0,
                              max_position_embeddings=131072, rms_norm_eps=1e-5),
    # Gemma-3-27B (text part), the write-up's model: GQA 32/16, tied embeddings, five
    # sliding-window layers (1024 tokens) to every dense one; Q4_K_M about 16.5 GB
    "gemma3-27b": dict(arch="gemma3", hidden_size=5376, intermediate_size=21504, num_hidden_layers=62,
                       num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                       vocab_size=262208, rope_theta=1000000.0, max_position_embeddings=131072,
                       rms_norm_eps=1e-6, sliding_window=1024, rope_scaling_linear=8.0),
}  # fmt: skip

STD = 0.02


def scaled(shape: dict, down: int) -> dict:
    if down <= 1:
        return dict(shape)
    s = dict(shape)
    for k in ("intermediate_size", "vocab_size"):
        s[k] = max(256, shape[k] // down)
    # a sliding-window shape keeps one dense layer in every six
    s["num_hidden_layers"] = max(7 if "sliding_window" in shape else 2, shape["num_hidden_layers"] // down)
    s["num_attention_heads"] = max(4, shape["num_attention_heads"] // down)
    s["num_key_value_heads"] = max(2, shape["num_key_value_heads"] // down)
    s["head_dim"] = min(shape["head_dim"], 64)
    s["hidden_size"] = s["num_attention_heads"] * s["head_dim"]
    s["max_position_embeddings"] = min(shape["max_position_embeddings"], 4096)
    return s


def tensors(shape: dict):
    """(HF name, GGUF name, dims in row-major (rows, cols) order, is_norm) of a Llama, or
    of a Gemma 3 (llama.cpp's src/models/gemma3.cpp: q/k norms, post-attention and
    post-FFN norms, no output.weight: the token embedding is the output layer too)."""
    h, f, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    d = shape["head_dim"]
    q = shape["num_attention_heads"] * d
    kv = shape["num_key_value_heads"] * d
    gemma = shape.get("arch") == "gemma3"
    yield "model.embed_tokens.weight", "token_embd.weight", (v, h), False
    for i in range(shape["num_hidden_layers"]):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        yield p + "input_layernorm.weight", g + "attn_norm.weight", (h,), True
        yield p + "self_attn.q_proj.weight", g + "attn_q.weight", (q, h), False
        yield p + "self_attn.k_proj.weight", g + "attn_k.weight", (kv, h), False
        yield p + "self_attn.v_proj.weight", g + "attn_v.weight", (kv, h), False
        if gemma:
            yield p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", (d,), True
            yield p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", (d,), True
        yield p + "self_attn.o_proj.weight", g + "attn_output.weight", (h, q), False
        if gemma:
            yield p + "post_attention_layernorm.weight", g + "post_attention_norm.weight", (h,), True
            yield p + "pre_feedforward_layernorm.weight", g + "ffn_norm.weight", (h,), True
        else:
            yield p + "post_attention_layernorm.weight", g + "ffn_norm.weight", (h,), True
        yield p + "mlp.gate_proj.weight", g + "ffn_gate.weight", (f, h), False
        yield p + "mlp.up_proj.weight", g + "ffn_up.weight", (f, h), False
        yield p + "mlp.down_proj.weight", g + "ffn_down.weight", (h, f), False
        if gemma:
            yield p + "post_feedforward_layernorm.weight", g + "post_ffw_norm.weight", (h,), True
    yield "model.norm.weight", "output_norm.weight", (h,), True
    if not gemma:
        yield "lm_head.weight", "output.weight", (v, h), False


class Draw:
    """float16 tensors, on the GPU when there is one (one generator, seeded); numpy arrays
    where torch is not installed (``numpy=True``: the GGUF alone needs no torch)."""

    def __init__(self, seed: int = 0, numpy: bool = False):
        try:
            import torch
        except ImportError:
            if not numpy:
                raise
            import numpy as np

            self.torch, self.device, self.gen = None, "cpu (numpy)", np.random.default_rng(seed)
            return
        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.gen = torch.Generator(device=self.device).manual_seed(seed)

    def __call__(self, dims, norm: bool):
        t = self.torch
        if t is None:
            import numpy as np

            return np.ones(dims, dtype=np.float32) if norm else \
                self.gen.normal(0.0, STD, size=dims).astype(np.float16)  # fmt: skip
        if norm:
            return t.ones(dims, dtype=t.float16)
        x = t.empty(dims, dtype=t.float16, device=self.device)
        x.normal_(0.0, STD, generator=self.gen)
        return x.cpu()


def hf_config(shape: dict) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
        "torch_dtype": "float16", "initializer_range": STD, "pretraining_tp": 1,
        "rope_scaling": None, "use_cache": True, **shape,
    }  # fmt: skip


def write_checkpoint(shape: dict, out: Path, tokenizer: Path, shard_bytes: int = 2 << 30) -> dict:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    draw = Draw()
    weight_map, shard, size, total, n = {}, {}, 0, 0, 0
    names = []

    def flush():
        nonlocal shard, size, n
        if shard:
            n += 1
            name = f"model-{n:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            names.append((name, list(shard)))
            shard, size = {}, 0

    for hf_name, _, dims, norm in tensors(shape):
        t = draw(dims, norm)
        shard[hf_name] = t
        size += t.numel() * 2
        total += t.numel() * 2
        if size >= shard_bytes:
            flush()
    flush()
    # The hub's file names say how many shards there are (model-00001-of-00004...).
    for i, (name, keys) in enumerate(names, 1):
        final = f"model-{i:05d}-of-{len(names):05d}.safetensors"
        (out / name).rename(out / final)
        weight_map.update({k: final for k in keys})
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))  # fmt: skip
    (out / "config.json").write_text(json.dumps(hf_config(shape), indent=1))
    for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer / f, out / f)
    return {"bytes": total, "shards": len(names), "device": draw.device}


def write_gguf(shape: dict, out: Path, gguf_py: Path, name: str) -> dict:
    """An f16 GGUF of a Llama (or a Gemma 3) with a byte-level vocabulary padded to the
    shape's vocab_size."""
    sys.path.insert(0, str(gguf_py))
    import gguf
    import numpy as np

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from roles.llamacpp.files.llamacpp_proof import smoke_vocab

    tokens, scores, types = smoke_vocab()
    pad = shape["vocab_size"] - len(tokens)
    tokens += [f"[PAD{i}]" for i in range(pad)]
    scores += [-10000.0] * pad
    types += [5] * pad  # unused

    arch = shape.get("arch", "llama")
    w = gguf.GGUFWriter(str(out), arch)
    w.add_name(name)
    w.add_context_length(shape["max_position_embeddings"])
    w.add_embedding_length(shape["hidden_size"])
    w.add_block_count(shape["num_hidden_layers"])
    w.add_feed_forward_length(shape["intermediate_size"])
    w.add_head_count(shape["num_attention_heads"])
    w.add_head_count_kv(shape["num_key_value_heads"])
    w.add_key_length(shape["head_dim"])
    w.add_value_length(shape["head_dim"])
    w.add_rope_dimension_count(shape["head_dim"])
    w.add_rope_freq_base(shape["rope_theta"])
    w.add_layer_norm_rms_eps(shape["rms_norm_eps"])
    if arch == "llama":
        w.add_vocab_size(shape["vocab_size"])
    if "sliding_window" in shape:
        w.add_sliding_window(shape["sliding_window"])
    if "rope_scaling_linear" in shape:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(shape["rope_scaling_linear"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    specs = list(tensors(shape))
    for _, gname, dims, norm in specs:
        dtype = np.float32 if norm else np.float16
        nbytes = int(np.prod(dims)) * np.dtype(dtype).itemsize
        w.add_tensor_info(gname, dims, np.dtype(dtype), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    draw = Draw(numpy=True)
    total = 0
    for _, gname, dims, norm in specs:
        t = draw(dims, norm)
        a = t if draw.torch is None else t.float().numpy() if norm else t.numpy()
        w.write_tensor_data(a)
        total += a.nbytes
    w.close()
    return {"bytes": total, "file_bytes": out.stat().st_size, "device": draw.device}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("checkpoint", "gguf", "shape"))
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path, nargs="?")
    ap.add_argument("--tokenizer", type=Path, help="folder with tokenizer.model (checkpoint)")
    ap.add_argument("--gguf-py", type=Path, help="llama.cpp's gguf-py folder (gguf)")
    ap.add_argument("--scale-down", type=int, default=1)
    a = ap.parse_args(argv)
    shape = scaled(SHAPES[a.shape], a.scale_down)
    start = time.time()
    if a.what == "shape":
        info = {}
    elif a.what == "checkpoint":
        info = write_checkpoint(shape, a.out, a.tokenizer)
    else:
        info = write_gguf(shape, a.out, a.gguf_py, a.shape)
    params = sum(int(__import__("math").prod(d)) for _, _, d, _ in tensors(shape))
    print(json.dumps({"shape_name": a.shape, "scale_down": a.scale_down, "shape": shape,
                      "parameters": params, "seconds": round(time.time() - start, 1), **info}))  # fmt: skip


if __name__ == "__main__":
    main()
