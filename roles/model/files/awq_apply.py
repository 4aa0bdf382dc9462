# Runs on the host (standard library only at import, imports nothing from llamarack; run by llamarack.remote.command with the AWQ env's python, which imports torch, transformers and AutoAWQ inside main).
"""Apply AutoAWQ's activation-aware scales into a checkpoint's fp16 weights (route awq).

    python awq_apply.py --model HF_DIR --out OUT_DIR --calibration TEXT_FILE
        [--zero-point true|false] [--q-group-size 128] [--w-bit 4] [--version GEMM]

AutoAWQ (``AutoAWQForCausalLM``) loads the checkpoint on the CPU and
calibrates it one decoder layer at a time on the best device it finds (the
host's first GPU when torch sees one, else the CPU), on the paragraphs of the
calibration text (split at blank lines; nothing is fetched from a hub). With
``export_compatible=True`` the searched scales (and clipping) are applied into
the fp16 weights and nothing is packed, so ``convert_hf_to_gguf.py`` reads the
result as a plain checkpoint and ``llama-quantize`` quantizes weights whose
salient channels were scaled up. ``OUT_DIR`` then holds the scaled weights,
the checkpoint's config without AutoAWQ's ``quantization_config`` (the
weights are not packed; the converter refuses a quant method it does not
know), and every other file of the checkpoint (tokenizer) as it was.

Before the model is loaded, the card must hold what calibration puts on it at
once (``calibration_bytes``): refused (exit 3) with the figures otherwise.
Preflight runs the same arithmetic before anything is fetched (its
``awq-card-memory`` rule, ``roles/model/calibration.py``), on a bound of the
tokens (``tokens_at_most``); this check is the backstop, on the tokenizer's count.
The last line printed is a JSON report: device, seconds, peak GPU bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

# AutoAWQ's own defaults, the most it calibrates on.
MAX_SAMPLES = 128
MAX_SEQ_LEN = 512
# Blocks the calibration text is cut into at the least (shorter blocks for a short text).
MIN_BLOCKS = 8
MIN_SEQ_LEN = 32
# AutoAWQ's max_chunk_memory: what its loss computation may take at once.
CHUNK_BYTES = 1 << 30
# Activation copies alive at once while a layer's scales are searched (its input cache,
# its output, one module's input and the candidate's output).
ACTIVATION_COPIES = 4
# The layer being calibrated counts this many times: itself and the scale search's copies of
# its weights (each candidate scale pseudo-quantizes a group of projections). With 6, the
# estimate for llama3-8b's shape on 1746 tokens is 4.94 GB against 4.61 GB measured at the
# peak on an H200 (bench/results/gpu-awq.json; with 1, it was 2.76 GB: under the peak).
LAYER_COPIES = 6
REFUSED = 3


def _dims(config: dict) -> dict:
    c = config.get("text_config") or config
    n_embd, n_head = int(c["hidden_size"]), int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or n_embd // n_head)
    return {"n_embd": n_embd, "n_ff": int(c["intermediate_size"]), "n_head": n_head, "head_dim": head_dim,
            "n_kv": int(c.get("num_key_value_heads") or n_head), "n_vocab": int(c.get("vocab_size") or 0)}


def layer_bytes(config: dict) -> int:
    """One decoder layer's fp16 bytes (attention and gated MLP projections) from ``config.json``."""
    d = _dims(config)
    attention = d["n_embd"] * d["head_dim"] * (2 * d["n_head"] + 2 * d["n_kv"])
    return 2 * (attention + 3 * d["n_embd"] * d["n_ff"])


def calibration_bytes(config: dict, tokens: int) -> int:
    """What the card holds at once while one layer is calibrated on ``tokens`` tokens: the
    layer and the scale search's copies of it (``LAYER_COPIES``), the token embedding
    (AutoAWQ keeps it on the device), the activations (``ACTIVATION_COPIES`` of tokens x the
    wider of hidden and MLP width, fp16), and AutoAWQ's loss chunk."""
    d = _dims(config)
    activations = ACTIVATION_COPIES * tokens * max(d["n_embd"], d["n_ff"]) * 2
    return LAYER_COPIES * layer_bytes(config) + 2 * d["n_vocab"] * d["n_embd"] + activations + CHUNK_BYTES


def memory_shortfall(config: dict, tokens: int, card_bytes: int, card: str = "a card",
                     bound: bool = False) -> tuple | None:
    """(found, needed, fix) when ``card`` of ``card_bytes`` cannot calibrate this model on
    ``tokens`` calibration tokens (``calibration_bytes``), else None. ``bound``: ``tokens``
    is an upper bound (``tokens_at_most``), not the tokenizer's count."""
    need = calibration_bytes(config, tokens)
    if need <= card_bytes:
        return None
    return (f"{card} of {card_bytes / 2**30:.2f} GiB",
            f"{need / 2**30:.2f} GiB to calibrate one decoder layer ({layer_bytes(config) / 2**30:.2f} GiB of fp16 "
            f"weights, activations of {'at most ' if bound else ''}{tokens} calibration tokens, the scale search's "
            "copies of the layer, embedding, 1 GiB loss chunk)",
            "a bigger card, a shorter model_awq_calibration_file, or model_route='gguf'")


def memory_problem(config: dict, tokens: int, card_bytes: int) -> str | None:
    """Why a card of ``card_bytes`` cannot calibrate this model, or None."""
    short = memory_shortfall(config, tokens, card_bytes)
    return None if short is None else "awq: found {}; needed {}. Fix: {}".format(*short)


def paragraphs(text: str) -> list:
    """The calibration texts: the file's paragraphs (blank-line separated), each on one line."""
    return [" ".join(p.split()) for p in text.split("\n\n") if p.strip()]


def blocks(counts: list) -> tuple:
    """(samples, seq_len, tokens) for AutoAWQ, from each paragraph's token count: how many
    paragraphs it takes (in order, skipping any longer than seq_len tokens, as AutoAWQ
    does), the block length it cuts their concatenation into (at least ``MIN_BLOCKS``
    blocks where the text allows it), and the tokens they hold."""
    seq_len = max(MIN_SEQ_LEN, min(MAX_SEQ_LEN, sum(counts) // MIN_BLOCKS))
    kept = [n for n in counts if n <= seq_len]
    taken = kept[:MAX_SAMPLES * MAX_SEQ_LEN // seq_len]
    return len(taken), seq_len, sum(taken)


# Tokens a tokenizer may add to a paragraph that stand for none of its bytes: BOS, EOS and
# SentencePiece's leading-space mark. Every other token stands for one byte of it at least
# (a byte-level BPE piece, or a SentencePiece piece of one character or more).
ADDED_TOKENS = 3


def tokens_at_most(text: str) -> int:
    """An upper bound of the tokens ``blocks`` takes from ``text``, without a tokenizer:
    each paragraph's UTF-8 bytes plus ``ADDED_TOKENS``, summed, and never more than AutoAWQ
    calibrates on (``MAX_SAMPLES`` x ``MAX_SEQ_LEN``, which ``blocks`` keeps to)."""
    counted = sum(len(p.encode()) + ADDED_TOKENS for p in paragraphs(text))
    return min(counted, MAX_SAMPLES * MAX_SEQ_LEN)


def _finish(src: str, out: str) -> None:
    """The converter's view of ``out``: no quantization_config, and the checkpoint's other files."""
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    config.pop("quantization_config", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
    for name in sorted(os.listdir(src)):
        weights = name.endswith((".safetensors", ".bin", ".safetensors.index.json", ".bin.index.json"))
        if not weights and not os.path.exists(os.path.join(out, name)) and os.path.isfile(os.path.join(src, name)):
            shutil.copyfile(os.path.join(src, name), os.path.join(out, name))


def apply(args) -> dict:
    import torch
    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    with open(args.calibration) as f:
        texts = paragraphs(f.read())
    tokenizer = AutoTokenizer.from_pretrained(args.model, trust_remote_code=False)
    samples, seq_len, tokens = blocks([len(tokenizer.encode(t)) for t in texts])
    if tokens < seq_len:
        raise SystemExit(f"awq: {args.calibration}: {tokens} tokens in paragraphs of at most {seq_len} "
                         "tokens; AutoAWQ needs one block of that length at least")
    cuda = torch.cuda.is_available()
    if cuda:
        card = torch.cuda.get_device_properties(0).total_memory
        problem = memory_problem(config, tokens, card)
        if problem:
            print(problem, file=sys.stderr)
            sys.exit(REFUSED)
        torch.cuda.reset_peak_memory_stats()
    quant_config = {"zero_point": args.zero_point == "true", "q_group_size": args.q_group_size,
                    "w_bit": args.w_bit, "version": args.version}
    start = time.monotonic()
    model = AutoAWQForCausalLM.from_pretrained(args.model, safetensors=True, trust_remote_code=False,
                                               device_map=None, low_cpu_mem_usage=True, use_cache=False)
    model.quantize(tokenizer, quant_config=quant_config, calib_data=texts, export_compatible=True,
                   max_calib_samples=samples, max_calib_seq_len=seq_len)
    seconds = time.monotonic() - start
    model.save_quantized(args.out, safetensors=True)
    _finish(args.model, args.out)
    return {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "calibration_seconds": round(seconds, 1),
            "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else 0, "samples": samples,
            "seq_len": seq_len, "tokens": tokens, "quant_config": quant_config}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Apply AutoAWQ's scales into a checkpoint (llamarack).")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calibration", required=True)
    parser.add_argument("--zero-point", choices=("true", "false"), default="true")
    parser.add_argument("--q-group-size", type=int, default=128)
    parser.add_argument("--w-bit", type=int, default=4)
    parser.add_argument("--version", choices=("GEMM", "GEMV"), default="GEMM")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    print("awq-report " + json.dumps(apply(args), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
