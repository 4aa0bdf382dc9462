"""The model operation's real commands, run on this machine in a temp root: no lab, no mocks.

tiny real checkpoint -> local hub (127.0.0.1, private, token) -> fetcher ->
convert_hf_to_gguf.py (pinned llama.cpp tree from the llama-cpp-python sdist,
converter venv from its requirements file), the F16 route: converted straight
to the artifact, no llama-quantize (this machine has no llama.cpp build; the
quantize step runs on every lab host's own build in tests/lab/test_stack_and_model.py,
which reads the Q4_K_M artifact's tensor types back) -> seal ->
atomic move -> ``models/current``. Then the same operation again, with the
facts read from the real files: no command at all. Then a llama.cpp bump's
artifact, planned from the served artifact's record (a full-sha revision: the hub is
not asked at all) and converted again from the host's blob cache, nothing downloaded.

Slow inputs are cached by their inputs (tests/support/cache.py): the first
run here builds venvs (about 2 min); later runs take seconds.
"""

import json
import os
import subprocess
import time
from io import StringIO
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, StringCommand
from pyinfra.context import ctx_host


from roles.model.hub import repo_files
from roles.model.operations import TOKEN_DIR, artifact
from roles.model.reads import CachedBlobs, ModelArtifact, shape_record_name
from roles.model.files.gguf_header import read_shape
from roles.model.plan import plan_from_pinned_record, plan_model
from roles.settings import load_settings
from tests.support import fake_systemd_run
from tests.support.cache import CACHE, converter_python, llama_cpp_source
from tests.support.hub_server import HubServer
from tests.support.tiny_model import tiny_model
from tests.support import ophost

TOKEN = "hf_chain_test_token_SECRET"


def sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=600)


class LocalHost:
    """pyinfra's host, for an operation run here: facts run their real commands with bash."""

    name = "@local"
    op_hash_order: list = []  # no operation has run: llamarack.facts.read keeps what it read

    def __init__(self):
        self.noops = []
        self.state = ophost.FakeState()

    def get_fact(self, fact, **kwargs):
        f = fact()
        command = f.command(**kwargs)
        result = sh(command.get_raw_value() if isinstance(command, StringCommand) else command)
        lines = result.stdout.splitlines()
        # as pyinfra does: a fact that prints nothing is its default (a missing path)
        return f.process(lines) if lines else f.default()

    def noop(self, message):
        self.noops.append(message)


def run_operation(plan, **kwargs):
    """Plan the operation against this machine, then run its commands in order; time each.
    The pipeline's steps run as root here (``fake_systemd_run``: no systemd); their user is
    ``nobody``, which the commands that own directories for it need to exist."""
    host = LocalHost()
    with ctx_host.use(host):
        cmds = list(artifact._inner(plan=plan, user="nobody", **kwargs))
    timings = []
    for c in cmds:
        if isinstance(c, FileUploadCommand):
            data = c.src.getvalue() if isinstance(c.src, StringIO) else Path(c.src).read_text()
            Path(c.dest).write_text(data)
            continue
        text = c.get_raw_value() if isinstance(c, StringCommand) else c
        started = time.monotonic()
        result = sh(text)
        timings.append((text, time.monotonic() - started, result.stdout + result.stderr))
        assert result.returncode == 0, f"{text}\n{result.stdout}\n{result.stderr}"
    return cmds, host.noops, timings


@pytest.fixture(autouse=True)
def systemd_run(tmp_path, monkeypatch):
    """``systemd-run`` as the steps call it, on this machine without a running systemd; the
    hub token's directory (``/run/llamarack``) goes again if the run made it."""
    monkeypatch.setenv("PATH", fake_systemd_run.path_with(fake_systemd_run.install(tmp_path / "bin")))
    made = not os.path.exists(TOKEN_DIR)
    yield
    if made and os.path.isdir(TOKEN_DIR) and not os.listdir(TOKEN_DIR):
        os.rmdir(TOKEN_DIR)


@pytest.fixture(scope="module")
def tools():
    tree = llama_cpp_source()
    return {
        "python": "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3",
        "convert_python": str(converter_python(tree)),
        "convert_script": str(tree / "convert_hf_to_gguf.py"),
        "gguf_py": str(tree / "gguf-py"),
    }


def settings_data(root, hub, sha, token_file, quant) -> dict:
    return {
        "python_env_backend": "venv", "llamacpp_backend": "cpu", "llamarack_root": str(root),
        "llamarack_allow_shared_dirs": True,  # the root is under pytest's /tmp
        "model_repo": "tiny/llama", "model_revision": sha, "model_hf_endpoint": hub.url,
        "model_hf_token_file": str(token_file), "model_quant": quant,
        "model_quality": False,  # no llama-perplexity among the local tools
    }  # fmt: skip


def test_tiny_model_chain_and_second_run_changes_nothing(tmp_path, tools):
    quant = "F16"
    checkpoint = tiny_model()
    root = tmp_path / "lr"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)  # read_token refuses a secret others may read
    with HubServer({"tiny/llama": checkpoint}, token=TOKEN) as hub:
        sha = hub.repo("tiny/llama").sha
        settings = load_settings("@local", settings_data(root, hub, sha, token_file, quant))
        plan = plan_model(settings, repo_files(hub.url, "tiny/llama", sha, TOKEN))
        paths = {k: v for k, v in tools.items() if k != "gguf_py" and v}
        cmds, _, timings = run_operation(plan, token_file=str(token_file), tool_paths=paths)

        # Every byte came through the hub with the token; none was asked for twice.
        resolves = [r for r in hub.requests if "/resolve/" in r.path]
        assert {r.auth for r in resolves} == {"ok"}
        assert sorted(r.path.rsplit("/", 1)[1] for r in resolves) == sorted(f.path for f in plan.files)

    artifact_dir = root / "models" / plan.name
    gguf = artifact_dir / "model.gguf"
    assert gguf.read_bytes()[:4] == b"GGUF"
    stamp = json.loads((artifact_dir / "stamp.json").read_text())
    assert stamp["stamp"] == plan.stamp and stamp["gguf"]["size"] == gguf.stat().st_size
    assert stamp["revision"] == sha and stamp["quant"] == quant
    assert os.readlink(root / "models" / "current") == plan.name
    # the artifact and the logs of the steps that made it (their paths were printed)
    logs = ["convert.log", "fetch.log"] + (["quantize.log"] if plan.quantizes else [])
    record = shape_record_name()
    assert sorted(p.name for p in artifact_dir.iterdir()) == sorted(logs + ["model.gguf", "stamp.json", record])
    # the shape recorded at its seal, of this very file: what reading its header gives
    recorded = json.loads((artifact_dir / record).read_text())
    assert recorded["shape"] == {k: v for k, v in read_shape(str(gguf)).items() if k != "path"}
    assert recorded["signature"] == stamp["gguf"]["signature"]
    assert all(TOKEN not in (artifact_dir / log).read_text() for log in logs)
    assert "model_fetch:" in (artifact_dir / "fetch.log").read_text()  # the download's progress
    assert list((root / "models" / ".staging").iterdir()) == []  # token, checkpoint, f16: gone
    assert all(TOKEN not in text + out for text, _, out in timings)

    # The GGUF is a real Llama model of the right type.
    probe = (
        "import sys, json; sys.path.insert(0, sys.argv[2]); from gguf import GGUFReader\n"
        "r = GGUFReader(sys.argv[1])\n"
        "f = r.fields\n"
        "print(json.dumps({'arch': bytes(f['general.architecture'].parts[-1]).decode(),"
        " 'n_tensors': len(r.tensors), 'types': sorted({t.tensor_type.name for t in r.tensors})}))"
    )
    info = json.loads(subprocess.run([tools["convert_python"], "-c", probe, str(gguf), tools["gguf_py"]],
                                     check=True, capture_output=True, text=True).stdout)  # fmt: skip
    assert info["arch"] == "llama" and info["n_tensors"] == 21
    assert "F16" in info["types"]

    # Second run: the facts read the real files; the operation yields nothing.
    again, noops, _ = run_operation(plan, token_file=str(token_file), tool_paths=paths)
    assert again == []
    assert noops[0].startswith(f"model {plan.name} is in place")

    figures = {
        "quant": quant,
        "gguf_bytes": gguf.stat().st_size,
        "steps_s": {
            name: round(sum(t for text, t, _ in timings if key in text), 2)
            for name, key in (("fetch", " fetch "), ("convert", "convert_hf_to_gguf"),
                              ("quantize", "llama-quantize"), ("seal", " seal "))
        },
    }  # fmt: skip
    print("\nmodel chain figures:", json.dumps(figures))

    # A llama.cpp bump (another commit: another artifact, converted again) while the hub is
    # up: the revision is a full sha, so the served artifact's record plans the new one (the
    # hub is not even asked for its listing), and the checkpoint comes from the host's blob
    # cache; not one file is downloaded.
    with HubServer({"tiny/llama": checkpoint}, token=TOKEN) as hub:
        bumped = load_settings("@local", {**settings_data(root, hub, sha, token_file, quant), "llamacpp_commit": "b" * 40})
        served = LocalHost().get_fact(ModelArtifact, path=str(root / "models" / "current"))
        assert served.record["sizes"] == {f.path: f.size for f in plan.files}
        plan2 = plan_from_pinned_record(bumped, served)
        assert plan2.name != plan.name
        # The disk figure counts none of the checkpoint: every file is in the blob cache.
        cached = LocalHost().get_fact(CachedBlobs, cache=str(root / "cache" / "blobs"), ids=plan2.blob_ids)
        assert cached == {f.content_id: f.size for f in plan2.files}
        assert plan2.to_download(cached) == 0 and plan2.disk_needed(cached) == plan2.disk_needed() - plan2.source_bytes
        run_operation(plan2, token_file=str(token_file), tool_paths=paths)
        assert hub.requests == []
        # the plan the hub's listing gives is the same: same artifact, same fetch, same record
        listed = plan_model(bumped, repo_files(hub.url, "tiny/llama", sha, TOKEN))
        entries = lambda p: sorted(p.manifest()["files"], key=lambda e: e["path"])  # noqa: E731
        assert (listed.stamp, entries(listed), listed.record()) == (plan2.stamp, entries(plan2), plan2.record())
    made = root / "models" / plan2.name
    assert os.readlink(root / "models" / "current") == plan2.name and (made / "model.gguf").read_bytes()[:4] == b"GGUF"
    assert (made / "fetch.log").read_text().count("from the cache, not downloaded") == len(plan2.files)
    assert (artifact_dir / "model.gguf").exists()  # the artifact made before stays
    # Both records name the same files: the cache holds each once, and the prune kept them.
    blobs = sorted(f"{p.parent.name}:{p.name}" for p in (root / "cache" / "blobs").glob("*/*"))
    assert blobs == sorted(f.content_id for f in plan2.files)
