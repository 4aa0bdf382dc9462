"""A tiny real Hugging Face Llama checkpoint, made here and cached by its inputs.

    from llamarack_lab.tiny_model import tiny_model
    path = tiny_model(Path("/var/cache/llamarack"))   # config.json, model.safetensors, tokenizer.model, ...

Random weights (seeded), a SentencePiece tokenizer of 1000 pieces, hidden
256 / FFN 512 / 2 layers / 4 heads / 2 KV heads (head size 64; rows of 256
let Q4_K_M really use q4_K/q6_K), saved with ``save_pretrained`` as
safetensors. SentencePiece (not a self-trained BPE tokenizer.json) keeps the
converter's pre-tokenizer hash check out of the way.

Bit-for-bit the same on every machine, so the lab can pin its hub revision
(``TINY_MODEL_REVISION``, a content hash of the files): every input is
pinned: the tools (``MODEL_TOOLS``, exact versions), the parameters and
seed, and the tokenizer's training text (files of the pinned transformers
wheel, not this machine's standard library); SentencePiece trains on one
thread with relative paths (the model file records its trainer's input and
prefix); torch's CPU kernels are fixed to one code path
(``ATEN_CPU_CAPABILITY``). ``tests/unit/test_tiny_model.py`` builds it from
scratch in two cache dirs and checks both against the constant.

Built in the model-tools venv under ``<cache>/tiny-model/<hash of script,
parameters and tools>/model``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

from .cache import digest, locked, venv

# The tiny-model maker's tools, pinned exactly (the output depends on them).
# torch comes from the local CPU wheel of these machines (pip's find-links).
TORCH = "torch==2.13.0"
MODEL_TOOLS = (
    TORCH,
    "transformers==4.57.6",
    "sentencepiece==0.2.3",
    "tokenizers==0.22.2",
    "safetensors==0.8.0",
    "protobuf==4.25.9",
    "numpy==2.2.6",
)

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

# The tokenizer's training text: files of the pinned transformers wheel (the
# same bytes everywhere), prose and code.
TEXT_FILES = ("models/llama/modeling_llama.py", "models/llama/tokenization_llama.py",
              "models/llama/configuration_llama.py", "configuration_utils.py",
              "tokenization_utils_base.py", "generation/utils.py")  # fmt: skip

# torch's CPU kernels (the normal_ of the weight init among them) have one
# code path per instruction set: the default (scalar) one gives other weights
# than the AVX2 one, and calls the system's libm. AVX2 and AVX-512 give the
# same weights (Sleef, inside torch's own library): fix AVX2, which every
# x86-64 server of the last decade has; the build refuses a machine without it.
CPU_CAPABILITY = "avx2"

# The hub revision of the tiny model as `lab up` serves it (repo lab/tiny-llama):
# a content hash of its files (hub_server.Repo.scan), the same on every machine.
TINY_MODEL_REVISION = "024052eec5467f84406c4ab1607cdf939e5bb195"

# Runs inside the model-tools venv, in the work dir (argv[1]) holding params.json.
BUILD = r'''
import json, os, sys
from pathlib import Path
os.chdir(sys.argv[1])
import sentencepiece as spm
import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, LlamaTokenizer

p = json.loads(Path("params.json").read_text())
base = Path(transformers.__file__).parent
Path("text.txt").write_text("\n".join((base / f).read_text(encoding="utf-8") for f in p["text_files"]))
out = Path("model")
out.mkdir()
# Relative paths: the .model file records its trainer's input and prefix.
spm.SentencePieceTrainer.train(
    input="text.txt", model_prefix="sp", vocab_size=p["vocab_size"],
    model_type="bpe", byte_fallback=True, character_coverage=1.0, num_threads=1,
    unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
)
# legacy=True: the non-legacy path needs sentencepiece_model_pb2, which this
# sentencepiece only ships for protobuf 5 (the converter pins protobuf<5).
tok = LlamaTokenizer(vocab_file="sp.model", legacy=True)
tok.save_pretrained(str(out))
if torch.backends.cpu.get_cpu_capability() != p["cpu_capability"].upper():
    sys.exit(f"torch uses CPU capability {torch.backends.cpu.get_cpu_capability()}, not "
             f"{p['cpu_capability']}: the weights would differ from every other machine's")
torch.manual_seed(p["seed"])
config = LlamaConfig(
    vocab_size=p["vocab_size"], hidden_size=p["hidden_size"],
    intermediate_size=p["intermediate_size"], num_hidden_layers=p["num_hidden_layers"],
    num_attention_heads=p["num_attention_heads"], num_key_value_heads=p["num_key_value_heads"],
    max_position_embeddings=p["max_position_embeddings"], bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False, torch_dtype="float16",
)
model = LlamaForCausalLM(config).to(torch.float16)
model.save_pretrained(str(out), safe_serialization=True)
print(json.dumps(sorted(x.name for x in out.iterdir())))
'''


def model_tools_python(cache: Path, log: Optional[Callable[[str], None]] = None) -> Path:
    """Python of the tiny-model maker's venv (torch, transformers, sentencepiece...)."""
    return venv(cache, "model-tools", MODEL_TOOLS, **({"log": log} if log else {}))


def entry_key(**overrides) -> str:
    params = {**PARAMS, **overrides, "text_files": list(TEXT_FILES)}
    return digest(BUILD, params, MODEL_TOOLS, CPU_CAPABILITY)


def is_built(cache: Path, **overrides) -> bool:
    return (Path(cache) / "tiny-model" / entry_key(**overrides) / ".done").exists()


def tiny_model(cache: Path, log: Optional[Callable[[str], None]] = None, **overrides) -> Path:
    """The checkpoint directory (built on first use, then reused)."""
    params = {**PARAMS, **overrides, "text_files": list(TEXT_FILES)}
    key = entry_key(**overrides)
    entry = Path(cache) / "tiny-model" / key
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
        (work / "params.json").write_text(json.dumps({**params, "cpu_capability": CPU_CAPABILITY}))
        python = model_tools_python(cache, log)
        started = time.monotonic()
        env = {**os.environ, "ATEN_CPU_CAPABILITY": CPU_CAPABILITY, "PYTHONHASHSEED": "0"}
        proc = subprocess.run([str(python), "-c", BUILD, str(work)], capture_output=True, text=True,
                              timeout=600, env=env)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"tiny model build failed:\n{proc.stdout}{proc.stderr}")
        for scratch in ("text.txt", "sp.model", "sp.vocab"):
            (work / scratch).unlink(missing_ok=True)
        work.rename(entry)
        (entry / ".done").write_text(f"{time.monotonic() - started:.1f} s\n")
    return model
