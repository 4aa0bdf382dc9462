"""Shipping a model artifact (llamarack/ship/files/artifact_ship.py --kind model) on real files,
run as the hosts run it (``python3 -c SOURCE``): what is packed, and what a receiver refuses."""

import hashlib
import io
import json
import os
import tarfile

import pytest

from tests.support.host_module import host_run
from roles.model import ship  # noqa: F401  (the roles' host modules: model_fetch)

STAMP = "ab" * 32


@pytest.fixture
def artifact(tmp_path):
    """A sealed artifact as the model step leaves it, with what it may keep beside it."""
    d = tmp_path / "models" / STAMP[:16]
    (d / "hf").mkdir(parents=True)  # a kept intermediate: not shipped
    (d / "hf/model.safetensors").write_bytes(b"checkpoint")
    (d / "model.gguf").write_bytes(b"GGUF" + os.urandom(100_000))
    (d / "model.gguf.tmp.4242").write_bytes(b"a cut step's")
    (d / "convert.log").write_text("converted\n")
    (d / "shape-0123.json").write_text("{}")
    (d / "stamp.plan.json").write_text(json.dumps({"stamp": STAMP, "quant": "Q4_K_M"}))
    host_run("model_fetch", "seal", "--stamp", str(d / "stamp.plan.json"), "--gguf", str(d / "model.gguf"),
             "--out", str(d / "stamp.json"))  # fmt: skip
    (d / "stamp.plan.json").unlink()
    return d


def pack(src, tar, ok=True):
    r = host_run("artifact_ship", "pack", "--kind", "model", str(src), str(tar), ok=ok)
    return json.loads(r.stdout) if ok else r


def receive(tar, sha, dest, ok=True):
    return host_run("artifact_ship", "receive", "--kind", "model", str(tar), sha, str(dest), ok=ok)


def test_a_model_is_packed_with_its_gguf_seal_logs_and_shape_only(artifact, tmp_path):
    told = pack(artifact, tmp_path / "m.tar")
    with tarfile.open(tmp_path / "m.tar") as tar:
        names = sorted(tar.getnames())
        manifest = json.load(tar.extractfile("ship-manifest.json"))
    assert names == ["convert.log", "model.gguf", "shape-0123.json", "ship-manifest.json", "stamp.json"]
    gguf = hashlib.sha256((artifact / "model.gguf").read_bytes()).hexdigest()
    assert manifest["files"][0] == {"path": "model.gguf", "sha256": gguf}  # as sealed
    assert told["sha256"] == hashlib.sha256((tmp_path / "m.tar").read_bytes()).hexdigest() and told["files"] == 4


def test_a_received_model_is_its_files_and_its_own_seal(artifact, tmp_path):
    told = pack(artifact, tmp_path / "m.tar")
    dest = tmp_path / "host2/models/.staging/incoming-x"
    receive(tmp_path / "m.tar", told["sha256"], dest)
    assert sorted(os.listdir(dest)) == ["convert.log", "model.gguf", "shape-0123.json", "stamp.json"]
    for name in os.listdir(dest):
        assert (dest / name).read_bytes() == (artifact / name).read_bytes()
    assert json.loads((dest / "stamp.json").read_text())["stamp"] == STAMP


def test_a_gguf_changed_after_its_seal_is_not_packed(artifact, tmp_path):
    with open(artifact / "model.gguf", "r+b") as f:
        f.seek(5000)
        f.write(b"\xff")
    assert "model.gguf: sha256 differs from the seal" in pack(artifact, tmp_path / "m.tar", ok=False).stderr
    (artifact / "stamp.json").unlink()
    assert "no readable seal" in pack(artifact, tmp_path / "m.tar", ok=False).stderr


def test_a_flipped_byte_in_transit_or_a_gguf_its_seal_does_not_name_is_refused(artifact, tmp_path):
    told = pack(artifact, tmp_path / "m.tar")
    data = bytearray((tmp_path / "m.tar").read_bytes())
    data[len(data) // 2] ^= 0x01
    (tmp_path / "bad.tar").write_bytes(bytes(data))
    dest = tmp_path / "incoming"
    r = receive(tmp_path / "bad.tar", told["sha256"], dest, ok=False)
    assert "model refused: the tar arrived with sha256" in r.stderr and not dest.exists()
    # a tar whose manifest agrees with another GGUF (made by a source that lied): its seal does not
    other = b"GGUF" + os.urandom(100_000)
    files = [{"path": "model.gguf", "sha256": hashlib.sha256(other).hexdigest()},
             {"path": "stamp.json", "sha256": hashlib.sha256((artifact / "stamp.json").read_bytes()).hexdigest()}]
    with tarfile.open(tmp_path / "lie.tar", "w") as tar:
        for name, body in (("ship-manifest.json", json.dumps({"files": files}).encode()), ("model.gguf", other),
                           ("stamp.json", (artifact / "stamp.json").read_bytes())):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    sha = hashlib.sha256((tmp_path / "lie.tar").read_bytes()).hexdigest()
    r = receive(tmp_path / "lie.tar", sha, dest, ok=False)
    assert "model.gguf: not the GGUF its seal (stamp.json) records" in r.stderr and not dest.exists()
