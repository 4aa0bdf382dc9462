"""The build seal (roles/llamacpp/files/build_seal.py) on real files, run as the hosts run it
(``python3 -c SOURCE``), and the build directory the deploy picks from it."""

import json
import os
import shutil
import subprocess

import pytest

from llamarack import remote
from roles.llamacpp.reads import Builds, BuildSeals
from roles.llamacpp.plan import build_dir_for, same_build


def host_run(*args: str) -> str:
    r = subprocess.run(["sh", "-c", remote.command("build_seal", *args)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def make_build(builds, name: str) -> str:
    d = builds / name
    (d / "build/bin").mkdir(parents=True)
    shutil.copy("/bin/ls", d / "build/bin/llama-quantize")
    shutil.copy("/bin/cat", d / "build/bin/llama-server")
    (d / "build/bin/libggml-base.so.0").write_bytes(b"\x7fELF" + bytes(4000))
    os.symlink("libggml-base.so.0", d / "build/bin/libggml-base.so")
    (d / "build/obj.o").write_bytes(b"intermediate, not sealed")
    os.symlink("build/bin", d / "bin")
    for record in ("version.txt", "server-help.txt", "build-info.json"):
        (d / record).write_text(record)
    return str(d)


def check(builds, *args) -> BuildSeals:
    return BuildSeals().process(host_run("check", str(builds), *args).splitlines())


@pytest.fixture
def builds(tmp_path):
    b = tmp_path / "builds"
    d = make_build(b, "3f1c0a9e52d7b6e4")
    os.symlink("3f1c0a9e52d7b6e4", b / "current")
    host_run("seal", d)
    return b


def test_the_seal_records_every_served_file_with_its_signature_and_sha256(builds):
    manifest = json.loads((builds / "3f1c0a9e52d7b6e4/manifest.json").read_text())
    by_path = {e["path"]: e for e in manifest["files"]}
    assert set(by_path) == {"build/bin/llama-quantize", "build/bin/llama-server", "build/bin/libggml-base.so.0",
                            "build/bin/libggml-base.so", "version.txt", "server-help.txt", "build-info.json"}
    quantize = by_path["build/bin/llama-quantize"]
    st = os.stat(builds / "3f1c0a9e52d7b6e4/build/bin/llama-quantize")
    assert (quantize["size"], quantize["mtime_ns"], quantize["inode"]) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert quantize["sha256"] == subprocess.run(["sha256sum", "/bin/ls"], capture_output=True, text=True).stdout.split()[0]
    assert by_path["build/bin/libggml-base.so"] == {"path": "build/bin/libggml-base.so", "link": "libggml-base.so.0"}


def test_an_untouched_build_is_intact_and_an_unsealed_one_is_named(builds):
    make_build(builds, "9d0e4b1c2a3f5e6d")  # proven before builds were sealed
    (builds / "0000000000000000").mkdir()  # a failed build: no build-info.json, not reported
    seals = check(builds)
    assert seals.changed == {"3f1c0a9e52d7b6e4": []} and seals.unsealed == ("9d0e4b1c2a3f5e6d",)
    assert not seals.tampered("3f1c0a9e52d7b6e4") and not seals.tampered("9d0e4b1c2a3f5e6d")


def test_a_binary_replaced_by_another_program_is_caught_by_the_cheap_signature(builds):
    shutil.copy("/bin/true", builds / "current/bin/llama-quantize")  # cp onto it: same inode, new size
    seals = check(builds)
    assert seals.tampered("3f1c0a9e52d7b6e4")
    assert seals.changed["3f1c0a9e52d7b6e4"][0].startswith("build/bin/llama-quantize: size ")


def test_a_file_replaced_by_rename_added_or_removed_or_relinked_is_caught(builds):
    b = builds / "3f1c0a9e52d7b6e4/build/bin"
    shutil.copy(b / "llama-server", b / "llama-server.new")
    os.replace(b / "llama-server.new", b / "llama-server")  # same bytes, size; another inode
    (b / "llama-extra").write_text("#!/bin/sh\n")
    os.unlink(b / "libggml-base.so")
    os.symlink("/tmp/elsewhere.so", b / "libggml-base.so")
    os.unlink(builds / "3f1c0a9e52d7b6e4/version.txt")
    changed = check(builds).changed["3f1c0a9e52d7b6e4"]
    assert any(c.startswith("build/bin/llama-server: ") and ("inode" in c or "mtime_ns" in c) for c in changed), changed
    assert "build/bin/llama-extra: not in the seal" in changed
    assert "build/bin/libggml-base.so: links to /tmp/elsewhere.so (sealed: libggml-base.so.0)" in changed
    assert "version.txt: gone" in changed


def test_an_edit_in_place_that_keeps_size_and_mtime_shows_only_in_the_sha256(builds):
    path = builds / "3f1c0a9e52d7b6e4/build/bin/llama-quantize"
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(st.st_size - 16)
        f.write(b"TAMPERED")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # touch -d back
    cheap = check(builds)
    assert cheap.changed == {"3f1c0a9e52d7b6e4": []} and cheap.sha256 is None
    deep = check(builds, "--sha256", "current")
    assert deep.changed == {"3f1c0a9e52d7b6e4": []}
    assert deep.sha256 == {"name": "3f1c0a9e52d7b6e4",
                           "changed": ["build/bin/llama-quantize: sha256 differs from its seal (size and mtime kept)"]}
    untouched = check(builds, "--sha256", "3f1c0a9e52d7b6e4")
    assert untouched.sha256["name"] == "3f1c0a9e52d7b6e4" and untouched.sha256["changed"]


def test_only_a_proven_build_is_sealed(tmp_path):
    (tmp_path / "b").mkdir()
    r = subprocess.run(["sh", "-c", remote.command("build_seal", "seal", str(tmp_path / "b"))],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode != 0 and "only a proven build is sealed" in r.stderr
    assert not (tmp_path / "b/manifest.json").exists()


def test_no_builds_directory_reads_as_no_builds(tmp_path):
    assert check(tmp_path / "absent").changed == {}


def test_the_deploy_keeps_an_intact_build_and_builds_a_tampered_one_again_beside_it():
    stamp = "3f1c0a9e52d7b6e4"
    builds = Builds(stamp, {stamp: 100})
    intact, tampered = BuildSeals().default(), type(BuildSeals().default())({stamp: ["build/bin/x: size 1 (sealed: 2)"]})
    assert build_dir_for(stamp, builds, intact) == stamp
    assert build_dir_for(stamp, builds, tampered, now=1764441900) == f"{stamp}-r1764441900"
    # the rebuild beside it then serves the same inputs: the next run keeps it
    rebuilt = Builds(f"{stamp}-r1764441900", {stamp: 100, f"{stamp}-r1764441900": 200})
    assert build_dir_for(stamp, rebuilt, tampered) == f"{stamp}-r1764441900"
    assert build_dir_for(stamp, Builds(None, {}), intact) == stamp
    # the current build wins over a newer one of the same inputs; another stamp is not the same build
    both = Builds(stamp, {stamp: 100, f"{stamp}-r1764441900": 200})
    assert build_dir_for(stamp, both, intact) == stamp
    assert same_build(f"{stamp}-r1", stamp) and not same_build("3f1c0a9e52d7b6e5", stamp) and not same_build(None, stamp)


def test_the_audit_reports_the_current_build_against_its_seal():
    from roles.llamacpp.audit import build_files
    from roles.llamacpp.reads import Seals

    stamp = "3f1c0a9e52d7b6e4"
    assert build_files(Seals({stamp: []}), stamp, None) == ("as sealed", False)
    assert build_files(Seals({stamp: ["build/bin/llama-quantize: size 1 (sealed: 2)"]}), stamp, None) == \
        (["build/bin/llama-quantize: size 1 (sealed: 2)"], True)  # fmt: skip
    assert build_files(Seals({}, (stamp,)), stamp, None)[1] is True
    edited = ["build/bin/llama-bench: sha256 differs from its seal (size and mtime kept)"]
    deep = Seals({stamp: []}, (), {"name": stamp, "changed": edited})
    assert build_files(Seals({stamp: []}), stamp, deep) == (edited, True)
    assert build_files(Seals({stamp: []}), stamp, Seals({stamp: []}, (), {"name": stamp, "changed": []})) == \
        ("as sealed", False)  # fmt: skip
    assert build_files(Seals({stamp: []}), stamp, Seals({stamp: []})) == (["sha256 not read"], True)


def test_the_check_reports_what_went_into_each_build_and_the_proofs_it_passed_and_failed(tmp_path):
    from roles.llamacpp.plan import plan_build
    from roles.settings import load_settings

    plan = plan_build(load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cpu"}))
    b = tmp_path / "builds"
    d = make_build(b, "0123456789abcdef")  # named by another stamp scheme
    record = dict(json.loads(plan.record()), proof={"variant": "native"})
    (b / "0123456789abcdef/build-info.json").write_text(json.dumps(record))
    (b / "0123456789abcdef/proof-failed.json").write_text(json.dumps({"proof_id": "5" * 16, "why": "x"}))
    host_run("seal", d)
    seals = check(b)
    assert seals.stamps == {"0123456789abcdef": plan.stamp}
    assert seals.proofs == {"0123456789abcdef": plan.proof_id} and seals.failed == {"0123456789abcdef": "5" * 16}
    assert same_build("0123456789abcdef", plan.stamp, seals) and not same_build("0123456789abcdef", plan.stamp)
