"""Shipping a build (llamarack/ship/files/artifact_ship.py --kind build) on real files, run as the hosts run
it (``python3 -c SOURCE``): what is packed, and what a receiving host refuses."""

import hashlib
import io
import json
import os
import shutil
import tarfile

import pytest

from tests.support.host_module import host_run
from roles.llamacpp.ship import build_key


@pytest.fixture
def sealed(tmp_path):
    """A sealed build as the build step leaves it: binaries, a library link, object files and a log."""
    d = tmp_path / "builds/3f1c0a9e52d7b6e4"
    (d / "build/bin").mkdir(parents=True)
    shutil.copy("/bin/cat", d / "build/bin/llama-server")
    (d / "build/bin/libggml-base.so.0").write_bytes(b"\x7fELF" + bytes(4000))
    os.symlink("libggml-base.so.0", d / "build/bin/libggml-base.so")
    (d / "build/obj.o").write_bytes(b"intermediate, not sealed")
    (d / "build.log").write_text("[100%] Built target llama-server\n")
    os.symlink("build/bin", d / "bin")
    for record in ("version.txt", "server-help.txt", "build-info.json"):
        (d / record).write_text(record)
    host_run("build_seal", "seal", str(d))
    return d


def pack(build, tar) -> dict:
    return json.loads(host_run("artifact_ship", "pack", "--kind", "build", str(build), str(tar)).stdout)


def test_a_build_is_packed_with_its_seal_and_sealed_files_only(sealed, tmp_path):
    told = pack(sealed, tmp_path / "b.tar")
    with tarfile.open(tmp_path / "b.tar") as tar:
        names = sorted(tar.getnames())
    assert names == ["build-info.json", "build/bin/libggml-base.so", "build/bin/libggml-base.so.0",
                     "build/bin/llama-server", "manifest.json", "server-help.txt", "version.txt"]  # fmt: skip
    assert told == {"bytes": os.path.getsize(tmp_path / "b.tar"), "files": 6,
                    "sha256": hashlib.sha256((tmp_path / "b.tar").read_bytes()).hexdigest()}  # fmt: skip


def test_a_received_build_has_every_file_as_sealed(sealed, tmp_path):
    told = pack(sealed, tmp_path / "b.tar")
    dest = tmp_path / "host2/.incoming-x"
    host_run("artifact_ship", "receive", "--kind", "build", str(tmp_path / "b.tar"), told["sha256"], str(dest))
    assert (dest / "build/bin/llama-server").read_bytes() == (sealed / "build/bin/llama-server").read_bytes()
    assert os.access(dest / "build/bin/llama-server", os.X_OK)
    assert os.readlink(dest / "build/bin/libggml-base.so") == "libggml-base.so.0"
    assert not (dest / "build/obj.o").exists() and not (dest / "build.log").exists()


def test_a_tar_damaged_in_transit_is_refused_and_nothing_is_left(sealed, tmp_path):
    told = pack(sealed, tmp_path / "b.tar")
    data = bytearray((tmp_path / "b.tar").read_bytes())
    data[data.find(b"\x7fELF") + 100] ^= 0xFF  # one byte of the first binary (the library)
    (tmp_path / "b.tar").write_bytes(data)
    dest = tmp_path / "host2/.incoming-x"
    r = host_run("artifact_ship", "receive", "--kind", "build", str(tmp_path / "b.tar"), told["sha256"], str(dest), ok=False)
    assert "damaged in transit" in r.stderr and not dest.exists()
    # the same byte flipped with the sha256 sent along (a bad source): the seal refuses it
    r = host_run("artifact_ship", "receive", "--kind", "build", str(tmp_path / "b.tar"), hashlib.sha256(data).hexdigest(), str(dest), ok=False)
    assert "libggml-base.so.0: sha256 differs from the seal" in r.stderr and not dest.exists()


def test_a_build_whose_files_left_their_seal_is_not_packed(sealed, tmp_path):
    (sealed / "build/bin/llama-server").write_bytes(b"#!/bin/sh\necho replaced\n")
    r = host_run("artifact_ship", "pack", "--kind", "build", str(sealed), str(tmp_path / "b.tar"), ok=False)
    assert "llama-server" in r.stderr and not (tmp_path / "b.tar").exists()
    os.remove(sealed / "manifest.json")
    assert "no readable seal" in host_run("artifact_ship", "pack", "--kind", "build", str(sealed), str(tmp_path / "b.tar"), ok=False).stderr


def hostile_tar(path, member: tarfile.TarInfo, data: bytes = b"") -> str:
    with tarfile.open(path, "w") as tar:
        manifest = json.dumps({"files": []}).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("name, kind, link, why", [
    ("../../etc/cron.d/x", tarfile.REGTYPE, "", "not a file or link inside the artifact"),
    ("/etc/passwd", tarfile.REGTYPE, "", "not a file or link inside the artifact"),
    ("build/bin/lib.so", tarfile.SYMTYPE, "/etc/shadow", "links outside the artifact"),
    ("build/bin/lib.so", tarfile.SYMTYPE, "../../../../root", "links outside the artifact"),
    ("build/bin/dev", tarfile.CHRTYPE, "", "not a file or link inside the artifact"),
    ("build/bin/extra", tarfile.REGTYPE, "", "in the tar but not in the seal"),
])  # fmt: skip
def test_a_tar_reaching_outside_the_build_or_past_its_seal_is_refused(tmp_path, name, kind, link, why):
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, link
    sha = hostile_tar(tmp_path / "h.tar", member, b"x" if kind == tarfile.REGTYPE else b"")
    dest = tmp_path / "host2/.incoming-x"
    r = host_run("artifact_ship", "receive", "--kind", "build", str(tmp_path / "h.tar"), sha, str(dest), ok=False)
    assert why in r.stderr and not dest.exists()
    assert not (tmp_path / "etc").exists()


def test_a_build_is_shared_by_its_stamp_and_for_native_code_by_the_cpu_too():
    portable = ("-DGGML_CUDA=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON")
    assert build_key("3f1c", portable, "fpu sse2") == build_key("3f1c", portable, "fpu sse2 avx512f") == "3f1c"
    native = ("-DGGML_CUDA=OFF",)
    assert build_key("3f1c", native, "fpu sse2") != build_key("3f1c", native, "fpu sse2 avx512f")
    assert build_key("3f1c", native, "fpu sse2").startswith("3f1c-")
    assert build_key("3f1c", native, None) is None  # no flags read: native code is not shipped


def test_runs_sharing_a_directory_take_turns_and_receive_what_the_first_published(tmp_path):
    """The stage's runs (one process per host) share ``LLAMARACK_SHIP_DIR``: a file lock per
    build is their turn, and the tar's note written last says where the build is."""
    import gevent

    from llamarack.ship import Shipment, Shipping

    first, second = Shipping(str(tmp_path)), Shipping(str(tmp_path))  # as two processes hold it
    made = Shipment(str(tmp_path / "k.tar"), "ab" * 32, 3, "lab-v100-b")
    order = []

    def compiles():
        with first.turn("k"):
            order.append("first compiles")
            assert second.published("k") is None
            gevent.sleep(1.5)
            (tmp_path / "k.tar").write_bytes(b"tar")
            first.publish("k", made)

    def waits():
        gevent.sleep(0.2)
        with second.turn("k"):
            order.append("second's turn")
            return second.published("k")

    runs = [gevent.spawn(compiles), gevent.spawn(waits)]
    gevent.joinall(runs, raise_error=True)
    assert order == ["first compiles", "second's turn"] and runs[1].value == made
    assert Shipping(None).published("k") is None and Shipping(str(tmp_path / "gone")).shared is None
