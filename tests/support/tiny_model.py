"""A tiny real Hugging Face Llama checkpoint, made here and cached by its inputs.

    from tests.support.tiny_model import tiny_model
    path = tiny_model()     # a directory: config.json, model.safetensors, tokenizer.model, ...

Random weights (seeded), a SentencePiece tokenizer of 1000 pieces trained on
local text, hidden 256 / FFN 512 / 2 layers / 4 heads / 2 KV heads (head
size 64; rows of 256 let Q4_K_M really use q4_K/q6_K), saved with
``save_pretrained`` as safetensors. SentencePiece (not a self-trained BPE
tokenizer.json) keeps the converter's pre-tokenizer hash check out of the way.

Built in the model-tools venv (tests/support/cache.py) under
``<cache>/tiny-model/<hash of script, parameters, text and tools>/``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import time
from pathlib import Path

from .cache import CACHE, MODEL_TOOLS, digest, locked, model_tools_python

PARAMS = {
    "vocab_size": 1000,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "seed": 0,
}

# Local text to train the tokenizer on: the standard library's own prose and code.
TEXT_MODULES = ("argparse", "email.message", "http.server", "json.decoder", "textwrap", "difflib",
                "unittest.case", "logging.handlers", "tarfile", "zipfile", "calendar", "pydoc")  # fmt: skip

# Runs inside the model-tools venv: argv[1] = work dir with text.txt and params.json.
BUILD = r'''
import json, sys
from pathlib import Path
import sentencepiece as spm
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizer

work = Path(sys.argv[1])
p = json.loads((work / "params.json").read_text())
out = work / "model"
out.mkdir()
spm.SentencePieceTrainer.train(
    input=str(work / "text.txt"), model_prefix=str(work / "sp"), vocab_size=p["vocab_size"],
    model_type="bpe", byte_fallback=True, character_coverage=1.0, num_threads=1,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
)
# legacy=True: the non-legacy path needs sentencepiece_model_pb2, which this
# sentencepiece only ships for protobuf 5 (the converter pins protobuf<5).
tok = LlamaTokenizer(vocab_file=str(work / "sp.model"), legacy=True)
tok.save_pretrained(out)
torch.manual_seed(p["seed"])
config = LlamaConfig(
    vocab_size=p["vocab_size"], hidden_size=p["hidden_size"],
    intermediate_size=p["intermediate_size"], num_hidden_layers=p["num_hidden_layers"],
    num_attention_heads=p["num_attention_heads"], num_key_value_heads=p["num_key_value_heads"],
    max_position_embeddings=p["max_position_embeddings"], bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False, torch_dtype="float16",
)
model = LlamaForCausalLM(config).to(torch.float16)
model.save_pretrained(out, safe_serialization=True)
print(json.dumps(sorted(x.name for x in out.iterdir())))
'''


def training_text() -> str:
    parts = []
    for name in TEXT_MODULES:
        origin = importlib.util.find_spec(name).origin
        parts.append(Path(origin).read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def tiny_model(**overrides) -> Path:
    """The checkpoint directory (built on first use, then reused)."""
    params = {**PARAMS, **overrides}
    text = training_text()
    key = digest(BUILD, params, MODEL_TOOLS, digest(text))
    entry = CACHE / "tiny-model" / key
    model = entry / "model"
    if (entry / ".done").exists():
        return model
    with locked(entry):
        if (entry / ".done").exists():
            return model
        shutil.rmtree(entry, ignore_errors=True)
        work = entry.parent / f".{key}.tmp"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        (work / "params.json").write_text(json.dumps(params))
        (work / "text.txt").write_text(text)
        started = time.monotonic()
        python = model_tools_python()
        subprocess.run([str(python), "-c", BUILD, str(work)], check=True,
                       capture_output=True, text=True, timeout=600)  # fmt: skip
        for scratch in ("text.txt", "sp.model", "sp.vocab"):
            (work / scratch).unlink(missing_ok=True)
        work.rename(entry)
        (entry / ".done").write_text(f"{time.monotonic() - started:.1f} s\n")
    return model
