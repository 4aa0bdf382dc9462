"""The host-side proof script's pure parts: the smoke GGUF and the flags it serves with.

The smoke runs themselves (llama-quantize, llama-server, the ladder) run on
lab hosts with real builds: tests/lab/test_llamacpp_build.py.
"""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from roles.llamacpp.files import llamacpp_proof as proof
from llamarack import remote

GGUF_HEADER = remote.path("gguf_header")


def test_smoke_gguf_is_the_same_bytes_every_time():
    data = proof.smoke_gguf_bytes()
    assert data == proof.smoke_gguf_bytes()
    # Pinned: a change to the smoke model is a change to the build recipe (new stamps).
    assert hashlib.sha256(data).hexdigest() == "b86439abf0b9b7de122576dda5f0fd8d343cc8a9b241d9166ac42b629472c3b2"
    assert len(data) < 2_000_000


def test_smoke_gguf_header_reads_back_as_a_llama(tmp_path):
    path = tmp_path / "smoke.gguf"
    proof.write_smoke_gguf(str(path))
    shape = json.loads(subprocess.run([sys.executable, str(GGUF_HEADER), str(path)],
                                      capture_output=True, text=True, check=True).stdout)  # fmt: skip
    s = proof.SMOKE_SHAPE
    assert shape["architecture"] == "llama"
    assert (shape["n_layer"], shape["n_head"], shape["n_head_kv"], shape["n_ctx_train"]) == (
        s["n_layer"], s["n_head"], s["n_head_kv"], s["n_ctx_train"])
    assert shape["head_dim_k"] == s["n_embd"] // s["n_head"]
    assert not list(tmp_path.glob("*.tmp"))


def test_vocab_has_every_byte_so_any_prompt_tokenizes():
    tokens, scores, types = proof.smoke_vocab()
    assert len(tokens) == len(scores) == len(types)
    assert all(f"<0x{b:02X}>" in tokens for b in range(256))
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and types[:3] == [2, 3, 3]


FLAGS = proof.ServerFlags(("--load-mode", "none"), True, True, True, ("--no-repack",))
SERVING = {"cache_type_k": "q4_0", "cache_type_v": "q4_0", "flash_attn": True, "mmap": False,
           "repack": True, "gpu_layers": None}


def test_serving_args_as_the_unit_and_the_smoke_run_use_them():
    assert proof.serving_args(FLAGS, SERVING) == [
        "--cache-type-k", "q4_0", "--cache-type-v", "q4_0", "--flash-attn", "on", "--load-mode", "none"]
    on_gpu = proof.serving_args(FLAGS, {**SERVING, "gpu_layers": 999, "repack": False})
    assert on_gpu[4:6] == ["--n-gpu-layers", "999"] and on_gpu[-1] == "--no-repack"


def test_args_the_proof_needed_are_added_once():
    proven = proof.ServerFlags(("--no-mmap",), False, False, False, ("--no-repack",), ("--no-repack",))
    args = proof.serving_args(proven, SERVING)
    assert args.count("--no-repack") == 1 and "--no-mmap" in args
    assert proof.serving_args(proven, {**SERVING, "repack": False}).count("--no-repack") == 1


def test_help_without_a_repack_switch_offers_none():
    flags = proof.parse_server_help("--no-mmap\n-fa, --flash-attn  enable")
    assert flags.repack_off == () and flags.proven_args == ()


def test_exit_reasons_name_the_signal():
    assert proof._exit_reason(-11) == "died with SIGSEGV"
    assert proof._exit_reason(-4) == "died with SIGILL"
    assert proof._exit_reason(1) == "exited with status 1"


def test_every_host_module_says_so_imports_no_llamarack_and_fits_one_command():
    import ast

    names = remote.names()
    assert len(names) == len(set(names))  # remote.path finds each by its name alone
    assert {"llamacpp_proof", "model_fetch", "pyenv_check", "gguf_header", "wait_healthy"} <= set(names)
    for name in names:
        text = remote.source(name)
        assert text.startswith("# Runs on the host (standard library only"), name
        imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(text))
                     if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
        assert not imported & {"llamarack", "pyinfra", "requests", "jinja2", "click"}, (name, imported)
        assert len(remote.command(name, "x").encode()) < 128 * 1024  # one argv string under sudo sh -c


def test_command_runs_a_host_module_from_its_source(tmp_path):
    import subprocess

    out = subprocess.run(remote.command("gguf_header", "/nonexistent.gguf", python=sys.executable), shell=True,
                         capture_output=True, text=True, cwd=tmp_path).stdout
    assert "/nonexistent.gguf" in out
    try:
        remote.path("nope")
    except FileNotFoundError as e:
        assert "nope" in str(e)
    else:
        raise AssertionError("remote.path() found a module that does not exist")


def test_flags_fact_carries_the_args_the_proof_needed():
    from roles.llamacpp.reads import LlamaServerFlags

    fixture = json.loads((Path(__file__).parents[1] / "facts/LlamaServerFlags/pinned_0c1e57098.json").read_text())
    record = {"stamp": "x", "proof": {"variant": "native, no repack", "runtime_args": ["--no-repack"]}}
    fact = LlamaServerFlags()
    flags = fact.process(fixture["output"] + [fact._SPLIT, *json.dumps(record, indent=1).splitlines()])
    assert flags.proven_args == ("--no-repack",)
    assert proof.serving_args(flags, SERVING)[-1] == "--no-repack"


def test_flags_fact_refuses_a_record_whose_args_are_not_strings():
    import pytest
    from pyinfra.api.exceptions import FactProcessError

    from roles.llamacpp.reads import LlamaServerFlags

    fact = LlamaServerFlags()
    with pytest.raises(FactProcessError):
        fact.process(["--load-mode", "--flash-attn [on|off|auto]", fact._SPLIT, '{"proof": {"runtime_args": [1]}}'])


def test_secret_digest_on_the_host_is_the_control_machine_s(tmp_path):
    from roles.server.files.secret_digest import digest

    secret = tmp_path / "key"
    secret.write_bytes(b"sk-test-123\n")
    run = lambda *a: subprocess.run(["sh", "-c", remote.command("secret_digest", *a)],  # noqa: E731
                                    capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert run(str(secret), "salt1") == digest(b"sk-test-123\n", "salt1") != digest(b"sk-test-123\n", "salt2")
    assert run(str(tmp_path / "absent"), "salt1") == "missing"
