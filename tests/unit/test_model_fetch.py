"""The host-side fetcher against the local hub server on 127.0.0.1.

The fetcher runs as the host runs it: a child process of the system python3
(standard library only), reading a manifest and a token file.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llamarack.roles.model.hub import repo_files
from tests.support.hub_server import HubServer

FETCHER = Path(__file__).resolve().parents[2] / "llamarack" / "remote" / "model_fetch.py"
# Debian's python3 where there is one: it is what the hosts run.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
TOKEN = "hf_test_0123456789abcdefSECRET"
BIG = 3 * 1024 * 1024 + 17


@pytest.fixture()
def repo_dir(tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(BIG))
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (d / "tokenizer.model").write_bytes(os.urandom(5000))
    return d


@pytest.fixture()
def hub(repo_dir):
    with HubServer({"org/tiny": repo_dir}) as server:
        yield server


def manifest_for(hub, tmp_path, token=None, **extra):
    listing = repo_files(hub.url, "org/tiny", hub.repo("org/tiny").sha, token)
    files = []
    for f in listing.files:
        entry = {"path": f.path, "size": f.size}
        entry.update({"sha256": f.sha256} if f.sha256 else {"git_sha1": f.git_sha1})
        files.append(entry)
    manifest = {"endpoint": hub.url, "repo": "org/tiny", "revision": listing.sha, "files": files, **extra}
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps(manifest))
    return path


def fetch(manifest, dest, *args, token_file=None, wait=True):
    argv = [PYTHON, str(FETCHER), "fetch", "--manifest", str(manifest), "--dest", str(dest),
            "--retry-wait", "0", "--progress-interval", "0", "--reserve-bytes", "0", *args]
    if token_file:
        argv += ["--token-file", str(token_file)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return proc
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out + err


def same_files(a: Path, b: Path, names):
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_full_download(hub, repo_dir, tmp_path):
    dest = tmp_path / "dest"
    rc, out = fetch(manifest_for(hub, tmp_path), dest)
    assert rc == 0, out
    same_files(repo_dir, dest, ["model.safetensors", "config.json", "tokenizer.model"])
    assert not list(dest.glob("*.partial"))
    assert f"model.safetensors: {BIG}/{BIG} bytes (100.0%)" in out
    assert "config.json: ok (git_sha1 " in out and "model.safetensors: ok (sha256 " in out
    # A second run finds every file in place and downloads nothing.
    before = len(hub.requests)
    rc, out = fetch(manifest_for(hub, tmp_path), dest)
    assert rc == 0 and out.count("already in place") == 3
    assert [r for r in hub.requests[before:] if "/resolve/" in r.path] == []


def test_dropped_connection_resumes_with_range_in_the_same_run(hub, repo_dir, tmp_path):
    hub.drop_after("model.safetensors", 1_000_000)
    dest = tmp_path / "dest"
    rc, out = fetch(manifest_for(hub, tmp_path), dest, "--retries", "2")
    assert rc == 0, out
    same_files(repo_dir, dest, ["model.safetensors"])
    first, second = hub.downloads("model.safetensors")
    assert (first.range, first.sent) == (None, 1_000_000)
    assert (second.range, second.status, second.sent) == ("bytes=1000000-", 206, BIG - 1_000_000)
    assert "retrying from byte 1000000" in out


def test_interrupted_run_leaves_a_partial_that_the_next_run_resumes(hub, repo_dir, tmp_path):
    hub.drop_after("model.safetensors", 2_000_000)
    dest = tmp_path / "dest"
    manifest = manifest_for(hub, tmp_path)
    rc, out = fetch(manifest, dest, "--retries", "0")
    assert rc == 1 and "2000000 bytes kept in" in out
    assert (dest / "model.safetensors.partial").stat().st_size == 2_000_000
    assert not (dest / "model.safetensors").exists()
    rc, out = fetch(manifest, dest, "--retries", "0")
    assert rc == 0, out
    same_files(repo_dir, dest, ["model.safetensors"])
    sent = [(r.range, r.sent) for r in hub.downloads("model.safetensors")]
    assert sent == [(None, 2_000_000), ("bytes=2000000-", BIG - 2_000_000)]  # no byte sent twice


def test_a_hub_that_cuts_every_try_fails_the_run_and_the_next_run_resumes(hub, repo_dir, tmp_path):
    hub.drop_after("model.safetensors", 1_000_000, times=2)  # the first try and its one retry
    dest = tmp_path / "dest"
    manifest = manifest_for(hub, tmp_path)
    rc, out = fetch(manifest, dest, "--retries", "1")
    assert rc == 1 and "1000000 bytes kept in" in out
    sent = [(r.range, r.sent) for r in hub.downloads("model.safetensors")]
    assert sent == [(None, 1_000_000), ("bytes=1000000-", 0)]  # the retry is cut at once
    rc, out = fetch(manifest, dest, "--retries", "1")
    assert rc == 0, out
    same_files(repo_dir, dest, ["model.safetensors"])
    assert hub.downloads("model.safetensors")[-1].range == "bytes=1000000-"


def test_wrong_bytes_are_refused_and_nothing_moves_into_place(hub, tmp_path):
    hub.corrupt("model.safetensors")
    dest = tmp_path / "dest"
    rc, out = fetch(manifest_for(hub, tmp_path), dest)
    assert rc == 2, out
    assert "model.safetensors: sha256 mismatch: expected" in out
    assert "nothing was moved into place" in out
    assert not (dest / "model.safetensors").exists()
    assert not (dest / "model.safetensors.partial").exists()


def test_small_files_are_checked_by_git_blob_id(hub, repo_dir, tmp_path):
    hub.corrupt("config.json")
    rc, out = fetch(manifest_for(hub, tmp_path), tmp_path / "dest")
    assert rc == 2 and "config.json: git_sha1 mismatch" in out


def test_url_source_with_sha256_and_no_size(hub, repo_dir, tmp_path):
    sha = hashlib.sha256((repo_dir / "tokenizer.model").read_bytes()).hexdigest()
    url = f"{hub.url}/org/tiny/resolve/main/tokenizer.model"
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"files": [{"path": "model.gguf", "url": url, "sha256": sha}]}))
    rc, out = fetch(manifest, tmp_path / "dest")
    assert rc == 0, out
    assert (tmp_path / "dest/model.gguf").read_bytes() == (repo_dir / "tokenizer.model").read_bytes()


def test_not_enough_disk_stops_before_the_first_byte(hub, tmp_path):
    manifest = manifest_for(hub, tmp_path)
    before = len(hub.requests)
    rc, out = fetch(manifest, tmp_path / "dest", "--reserve-bytes", str(1 << 62))
    assert rc == 3 and "not enough disk" in out
    assert hub.requests[before:] == []


@pytest.fixture()
def private_hub(repo_dir):
    with HubServer({"org/tiny": repo_dir}, token=TOKEN) as server:
        yield server


def token_file(tmp_path, mode=0o600):
    path = tmp_path / "hub-token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def test_private_repo_without_token_is_401(private_hub, tmp_path):
    manifest = manifest_for(private_hub, tmp_path, token=TOKEN)
    rc, out = fetch(manifest, tmp_path / "dest")
    assert rc == 4, out
    assert "HTTP 401" in out and "model_hf_token_file" in out
    assert {r.auth for r in private_hub.requests if "/resolve/" in r.path} == {"none"}


def test_token_file_readable_by_others_is_refused(private_hub, tmp_path):
    manifest = manifest_for(private_hub, tmp_path, token=TOKEN)
    rc, out = fetch(manifest, tmp_path / "dest", token_file=token_file(tmp_path, 0o644))
    assert rc == 4 and "must be 600" in out


def test_token_is_sent_but_never_in_argv_environment_or_output(private_hub, repo_dir, tmp_path):
    manifest = manifest_for(private_hub, tmp_path, token=TOKEN)
    gate = threading.Event()
    original = private_hub._take_drop

    def hold_first_download(path):
        gate.wait(10)  # the download waits while the test looks at the running fetcher
        return original(path)

    private_hub._take_drop = hold_first_download
    proc = fetch(manifest, tmp_path / "dest", token_file=token_file(tmp_path), wait=False)
    try:
        deadline = time.monotonic() + 10
        while not any("/resolve/" in r.path for r in private_hub.requests):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.02)
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
        # Mid-download the token is in memory only: killed now, it would leave no file.
        assert not (tmp_path / "hub-token").exists()
    finally:
        gate.set()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert b"hub-token" in cmdline and TOKEN.encode() not in cmdline
    assert TOKEN.encode() not in environ
    assert TOKEN not in out + err
    assert {r.auth for r in private_hub.requests if "/resolve/" in r.path} == {"ok"}
    same_files(repo_dir, tmp_path / "dest", ["model.safetensors"])


def test_a_redirect_to_another_host_does_not_carry_the_token(repo_dir, tmp_path):
    """Like huggingface.co sending LFS files to a CDN with signed URLs."""
    with HubServer({"org/tiny": repo_dir}) as cdn, HubServer({"org/tiny": repo_dir}, token=TOKEN) as hub:
        sha = hashlib.sha256((repo_dir / "tokenizer.model").read_bytes()).hexdigest()
        # 127.0.0.1 and localhost are different origins to the fetcher.
        target = cdn.url.replace("127.0.0.1", "localhost") + "/org/tiny/resolve/main/tokenizer.model"
        hub.redirects = {"tokenizer.model": target}
        manifest = tmp_path / "m.json"
        url = f"{hub.url}/org/tiny/resolve/main/tokenizer.model"
        manifest.write_text(json.dumps({"files": [{"path": "t.model", "url": url, "sha256": sha}]}))
        rc, out = fetch(manifest, tmp_path / "dest", token_file=token_file(tmp_path))
        assert rc == 0, out
        assert [r.auth for r in hub.requests] == ["ok"]
        assert [r.auth for r in cdn.requests] == ["none"]


def test_seal_records_size_sha256_and_the_signature_later_runs_compare(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(1000))
    (tmp_path / "plan.json").write_text(json.dumps({"stamp": "ab" * 32}))
    out = tmp_path / "stamp.json"
    subprocess.run([PYTHON, str(FETCHER), "seal", "--stamp", str(tmp_path / "plan.json"),
                    "--gguf", str(gguf), "--out", str(out)], check=True, capture_output=True)
    stamp = json.loads(out.read_text())
    st = gguf.stat()
    assert stamp["stamp"] == "ab" * 32 and time.time() - 60 < stamp["sealed_at"] <= time.time()
    assert stamp["gguf"] == {"size": 1004, "sha256": hashlib.sha256(gguf.read_bytes()).hexdigest(),
                             "signature": {"size": 1004, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}}
