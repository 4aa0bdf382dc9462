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


def test_each_tool_spells_the_proven_switches_its_own_way():
    assert proof.runtime_args("llama-server", ("--no-repack",)) == ["--no-repack"]
    assert proof.runtime_args("llama-perplexity", ("--no-repack",)) == ["--no-repack"]
    assert proof.runtime_args("llama-bench", ("--no-repack",)) == ["--repack", "0"]
    assert proof.runtime_args("llama-quantize", ("--no-repack",)) == []
    assert proof.runtime_args("llama-bench", ()) == []


def test_the_proof_computes_a_batch_as_large_as_every_later_tools():
    from roles.model.files.model_quality import KV_TYPES
    from roles.model.operations import QUALITY_CTX
    from roles.server.plan import BENCH_PROMPT

    assert proof.PROOF_BATCH >= max(QUALITY_CTX, BENCH_PROMPT)
    assert proof.QUALITY_KV_TYPES == KV_TYPES
    prompt = proof.smoke_prompt()
    assert len(prompt) == proof.PROOF_BATCH and prompt == proof.smoke_prompt()
    assert proof.PROOF_BATCH + proof.SMOKE_TOKENS < proof.SMOKE_CTX <= proof.SMOKE_SHAPE["n_ctx_train"]
    tokens = proof.smoke_vocab()[0]
    assert all(tokens[t].startswith("\u2581") for t in prompt)


def fake_tools(tmp_path, dies: str = "") -> Path:
    """A build directory whose llama-perplexity and llama-bench log their argv; ``dies``: the
    one that then dies with SIGILL, as a kernel the CPU faults on does."""
    b = tmp_path / "build" / "bin"
    b.mkdir(parents=True)
    for tool in ("llama-perplexity", "llama-bench"):
        end = "kill -ILL $$" if tool == dies else "exit 0"
        (b / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/argv\n{end}\n')
        (b / tool).chmod(0o755)
    return tmp_path / "build"


def test_the_other_tools_run_as_the_deploy_runs_them_with_the_rungs_switches(tmp_path):
    d = fake_tools(tmp_path)
    model = {"path": "q.gguf", "f16": "f.gguf"}
    serving = {**SERVING, "repack": False}
    ran = proof.tool_runs(str(d), model, FLAGS, serving, ["--no-repack"], str(tmp_path), 30)
    assert ran == ["llama-perplexity", "llama-bench"]
    lines = (tmp_path / "argv").read_text().splitlines()
    assert len(lines) == 1 + len(proof.QUALITY_KV_TYPES) + 1
    assert all(ln.split().count("--no-repack") == 1 for ln in lines[:-1]), lines
    assert "-b 512" in lines[0] and "-m f.gguf" in lines[0] and "--kl-divergence " not in lines[0]
    assert "--kl-divergence -ctk q8_0 -ctv q8_0 --flash-attn on" in lines[2]
    assert lines[-1].startswith("llama-bench -m q.gguf -p 512 ") and lines[-1].endswith(" -lm none --repack 0")


def test_a_tool_that_dies_fails_the_rung(tmp_path):
    d = fake_tools(tmp_path, dies="llama-bench")
    try:
        proof.tool_runs(str(d), {"path": "q.gguf", "f16": "f.gguf"}, FLAGS, SERVING, [], str(tmp_path), 30)
    except proof.SmokeFailure as e:
        assert e.why == "llama-bench (pp512) died with SIGILL", e.why
    else:
        raise AssertionError("a tool that died passed")
