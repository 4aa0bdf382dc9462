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

from roles.model.hub import repo_files
from tests.support.hub_server import HubServer

FETCHER = Path(__file__).resolve().parents[2] / "roles" / "model" / "files" / "model_fetch.py"
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


@pytest.mark.parametrize("mode, rc", [(0o600, 0), (0o640, 4)])
def test_token_on_standard_input_is_read_from_the_file_the_caller_opened(private_hub, repo_dir, tmp_path, mode, rc):
    """``--token-file -``: the sandboxed fetch reads the file root's shell opened for it (it
    may not open root's file itself); the same mode check, nothing of it on a command line."""
    manifest = manifest_for(private_hub, tmp_path, token=TOKEN)
    path = token_file(tmp_path, mode)
    argv = [PYTHON, str(FETCHER), "fetch", "--manifest", str(manifest), "--dest", str(tmp_path / "dest"),
            "--retry-wait", "0", "--reserve-bytes", "0", "--token-file", "-"]  # fmt: skip
    with open(path) as stdin:
        r = subprocess.run(argv, stdin=stdin, capture_output=True, text=True, timeout=60)
    assert r.returncode == rc, r.stdout + r.stderr
    assert TOKEN not in r.stdout + r.stderr and path.exists()  # the caller's file: the caller removes it
    if rc == 0:
        assert {q.auth for q in private_hub.requests if "/resolve/" in q.path} == {"ok"}
        same_files(repo_dir, tmp_path / "dest", ["model.safetensors"])
    else:
        assert "must be 600" in r.stdout + r.stderr


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


# --- the blob cache (--cache): verified files by content hash, hardlinked into later fetches ---

BLOB_MTIME_NS = 1_000_000_000 * 1_000_000_000  # model_fetch.BLOB_MTIME_NS


def blob_of(cache: Path, repo_dir: Path, name: str) -> Path:
    """Where the cache keeps ``name`` of the repo: by sha256 (LFS files) or git blob id (small files)."""
    data = (repo_dir / name).read_bytes()
    if name == "config.json":
        return cache / "git-sha1" / hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    return cache / "sha256" / hashlib.sha256(data).hexdigest()


def resolves(hub, since: int = 0) -> list:
    return [r.path for r in hub.requests[since:] if "/resolve/" in r.path]


NAMES = ["model.safetensors", "config.json", "tokenizer.model"]


def test_verified_files_go_into_the_cache_and_a_later_fetch_downloads_nothing(hub, repo_dir, tmp_path):
    cache, manifest = tmp_path / "cache/blobs", manifest_for(hub, tmp_path)
    rc, out = fetch(manifest, tmp_path / "a", "--cache", str(cache))
    assert rc == 0, out
    assert len(resolves(hub)) == 3
    for name in NAMES:
        blob = blob_of(cache, repo_dir, name)
        st = blob.stat()
        # The same inode as the fetched file: the cache costs no second copy on disk.
        assert st.st_ino == (tmp_path / "a" / name).stat().st_ino and st.st_nlink == 2
        assert (st.st_mode & 0o777, st.st_mtime_ns) == (0o444, BLOB_MTIME_NS)
        assert f"{name}: cached as {blob}" in out
    assert (cache.stat().st_mode & 0o777, (cache / "sha256").stat().st_mode & 0o777) == (0o700, 0o700)

    # Another artifact's fetch (a new llama.cpp commit converts again): nothing is asked of the hub.
    before = len(hub.requests)
    rc, out = fetch(manifest, tmp_path / "b", "--cache", str(cache))
    assert rc == 0, out
    assert hub.requests[before:] == []
    same_files(repo_dir, tmp_path / "b", NAMES)
    assert out.count("from the cache, not downloaded") == 3
    assert (tmp_path / "b/model.safetensors").stat().st_ino == blob_of(cache, repo_dir, "model.safetensors").stat().st_ino


def test_a_cached_blob_of_the_wrong_size_is_a_miss_and_is_fetched_again(hub, repo_dir, tmp_path):
    cache, manifest = tmp_path / "cache", manifest_for(hub, tmp_path)
    assert fetch(manifest, tmp_path / "a", "--cache", str(cache))[0] == 0
    blob = blob_of(cache, repo_dir, "model.safetensors")
    os.truncate(blob, 1000)  # truncation keeps the mtime here: the size alone must tell
    os.utime(blob, ns=(BLOB_MTIME_NS, BLOB_MTIME_NS))
    before = len(hub.requests)
    rc, out = fetch(manifest, tmp_path / "b", "--cache", str(cache))
    assert rc == 0, out
    assert f"the cached blob {blob} has 1000 bytes, not {BIG}: dropped from the cache" in out
    assert resolves(hub, before) == ["/org/tiny/resolve/" + hub.repo("org/tiny").sha + "/model.safetensors"]
    same_files(repo_dir, tmp_path / "b", NAMES)
    # The fresh download took its place in the cache.
    assert blob.stat().st_size == BIG and blob.stat().st_ino == (tmp_path / "b/model.safetensors").stat().st_ino


def test_a_blob_written_through_a_hardlink_is_a_miss(hub, repo_dir, tmp_path):
    """Same size, other bytes (a served model.gguf edited in place shares the blob's inode):
    the write moved the mtime, and the cache hands it out no more."""
    cache, manifest = tmp_path / "cache", manifest_for(hub, tmp_path)
    assert fetch(manifest, tmp_path / "a", "--cache", str(cache))[0] == 0
    edited = tmp_path / "a/tokenizer.model"
    with open(edited, "r+b") as f:  # root writes past the 444 mode, as an operator's tool would
        f.seek(100)
        f.write(b"TAMPERED")
    before = len(hub.requests)
    rc, out = fetch(manifest, tmp_path / "b", "--cache", str(cache))
    assert rc == 0, out
    assert "was written to after it was cached (its mtime moved): dropped from the cache" in out
    assert [p.rsplit("/", 1)[1] for p in resolves(hub, before)] == ["tokenizer.model"]
    same_files(repo_dir, tmp_path / "b", NAMES)
    # The edited file itself is left alone: only the cache's name of it went.
    assert b"TAMPERED" in edited.read_bytes()


def test_across_filesystems_the_cache_copies_and_verifies(hub, repo_dir, tmp_path):
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == tmp_path.stat().st_dev:
        pytest.skip("no second filesystem (tmpfs /dev/shm) beside the test's temporary directory")
    cache = shm / f"llamarack-test-blobs-{os.getpid()}"
    try:
        manifest = manifest_for(hub, tmp_path)
        rc, out = fetch(manifest, tmp_path / "a", "--cache", str(cache))
        assert rc == 0, out
        blob = blob_of(cache, repo_dir, "model.safetensors")
        assert blob.stat().st_ino != (tmp_path / "a/model.safetensors").stat().st_ino  # a copy
        assert blob.read_bytes() == (repo_dir / "model.safetensors").read_bytes()
        before = len(hub.requests)
        rc, out = fetch(manifest, tmp_path / "b", "--cache", str(cache))
        assert rc == 0 and hub.requests[before:] == [], out
        same_files(repo_dir, tmp_path / "b", NAMES)
        assert not list((tmp_path / "b").glob("*.tmp-*"))
    finally:
        subprocess.run(["rm", "-rf", str(cache)], check=True)


def test_a_url_file_without_a_size_is_hashed_in_full_before_it_is_taken(hub, repo_dir, tmp_path):
    sha = hashlib.sha256((repo_dir / "tokenizer.model").read_bytes()).hexdigest()
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"files": [{"path": "model.gguf", "url": f"{hub.url}/org/tiny/resolve/main/"
                                               "tokenizer.model", "sha256": sha}]}))  # fmt: skip
    cache = tmp_path / "cache"
    assert fetch(manifest, tmp_path / "a", "--cache", str(cache))[0] == 0
    blob = cache / "sha256" / sha
    data = bytearray(blob.read_bytes())
    data[7] ^= 0xFF
    blob.write_bytes(bytes(data))  # other bytes, the mtime put back: only the hash can tell
    os.utime(blob, ns=(BLOB_MTIME_NS, BLOB_MTIME_NS))
    before = len(hub.requests)
    rc, out = fetch(manifest, tmp_path / "b", "--cache", str(cache))
    assert rc == 0, out
    assert f"the cached blob {blob} has sha256 " in out and len(resolves(hub, before)) == 1
    assert (tmp_path / "b/model.gguf").read_bytes() == (repo_dir / "tokenizer.model").read_bytes()


def test_a_hash_that_is_not_hex_never_names_a_cache_path(hub, tmp_path):
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"files": [{"path": "x", "url": f"{hub.url}/x", "sha256": "../../etc/passwd"}]}))
    rc, out = fetch(manifest, tmp_path / "dest", "--cache", str(tmp_path / "cache"))
    assert rc == 1 and "is not 64 hex digits" in out
    assert not (tmp_path / "cache").exists() and hub.requests == []


def prune(cache: Path, models: Path):
    r = subprocess.run([PYTHON, str(FETCHER), "prune-cache", "--cache", str(cache), "--models", str(models)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    return r.returncode, r.stdout + r.stderr


def test_prune_keeps_the_blobs_that_artifacts_and_unfinished_fetches_name(hub, repo_dir, tmp_path):
    cache, models = tmp_path / "cache", tmp_path / "models"
    manifest = manifest_for(hub, tmp_path)
    assert fetch(manifest, tmp_path / "a", "--cache", str(cache))[0] == 0
    ids = {n: f"{blob_of(cache, repo_dir, n).parent.name}:{blob_of(cache, repo_dir, n).name}" for n in NAMES}
    # One artifact names the checkpoint but the tokenizer; an unfinished fetch names the tokenizer.
    (models / "aaaa").mkdir(parents=True)
    (models / "aaaa/stamp.json").write_text(json.dumps(
        {"files": {n: ids[n] for n in ("model.safetensors", "config.json")}}))  # fmt: skip
    (models / "current").symlink_to("aaaa")
    (models / ".staging/bbbb").mkdir(parents=True)
    (models / ".staging/bbbb/manifest.json").write_text(json.dumps(
        {"files": [e for e in json.loads(manifest.read_text())["files"] if e["path"] == "tokenizer.model"]}))
    (models / "unsealed").mkdir()  # no record: names nothing
    stray = cache / "sha256" / ("0" * 64)
    stray.write_bytes(b"an artifact that was deleted")
    rc, out = prune(cache, models)
    assert rc == 0, out
    assert not stray.exists()
    assert all(blob_of(cache, repo_dir, n).exists() for n in NAMES)
    assert "kept 3 blob(s), removed 1 that no artifact names (28 bytes freed)" in out

    # The fetch finished elsewhere: its blob goes, and the fetched file keeps its data.
    (models / ".staging/bbbb/manifest.json").unlink()
    rc, out = prune(cache, models)
    assert rc == 0 and not blob_of(cache, repo_dir, "tokenizer.model").exists(), out
    assert "removed 1 that no artifact names (0 bytes freed)" in out
    same_files(repo_dir, tmp_path / "a", NAMES)


def test_an_unreadable_record_stops_the_prune(tmp_path):
    cache, models = tmp_path / "cache", tmp_path / "models"
    (cache / "sha256").mkdir(parents=True)
    (cache / "sha256" / ("1" * 64)).write_bytes(b"x")
    (models / "aaaa").mkdir(parents=True)
    (models / "aaaa/stamp.json").write_text("{truncated")
    rc, out = prune(cache, models)
    assert rc == 0 and "cannot be read" in out and "nothing is pruned" in out
    assert (cache / "sha256" / ("1" * 64)).exists()


def test_a_cache_that_cannot_take_a_file_does_not_stop_the_fetch(hub, repo_dir, tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache's directory should be")
    rc, out = fetch(manifest_for(hub, tmp_path), tmp_path / "dest", "--cache", str(cache))
    assert rc == 0, out
    assert out.count("not cached (FileExistsError") == 3
    same_files(repo_dir, tmp_path / "dest", NAMES)


def test_an_http_error_names_the_url_without_its_credentials_or_signature():
    import urllib.error

    from roles.model.files.model_fetch import _http_error

    url = "https://user:s3cret@cdn.example.org/files/model.gguf?X-Amz-Signature=abc123&Expires=9"
    error = _http_error("model.gguf", urllib.error.HTTPError(url, 404, "Not Found", {}, None))
    assert str(error) == "model.gguf: HTTP 404 Not Found for https://cdn.example.org/files/model.gguf"
