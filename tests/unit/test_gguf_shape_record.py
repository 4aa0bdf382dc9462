"""The GGUF shape recorded at seal time (``gguf_header.py --record``) and read back by
``GgufShape``: the same answer as the header's, and only for the file it was made from."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llamarack import remote
from roles.model.reads import GgufShape, shape_record_name
from roles.model.files.gguf_header import SHAPE_KEYS, read_shape

TINY = Path(__file__).resolve().parents[1] / "fixtures/gguf/tiny-llama-Q4_K_M.head.gguf"


def run(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)


def shape(gguf: Path, recorded: bool = True) -> str:
    """What the host prints for the fact's command (this interpreter standing in for python3)."""
    r = run(remote.command(*GgufShape().host_run(str(gguf), recorded), python=sys.executable))
    assert r.returncode == 0, r.stderr
    return r.stdout


def record(gguf: Path, name: str = None) -> subprocess.CompletedProcess:
    return run(remote.command("gguf_header", "--record", name or shape_record_name(), str(gguf),
                              python=sys.executable))  # fmt: skip


@pytest.fixture
def gguf(tmp_path) -> Path:
    folder = tmp_path / "models" / "0123456789abcdef"
    folder.mkdir(parents=True)
    shutil.copy(TINY, folder / "model.gguf")
    return folder / "model.gguf"


def test_the_shape_keys_are_every_key_of_a_shape_but_its_path():
    assert sorted(SHAPE_KEYS) == sorted(k for k in read_shape(str(TINY)) if k != "path")


def test_a_recorded_shape_is_the_header_answer_to_the_byte(gguf):
    from_header = shape(gguf, recorded=False)
    r = record(gguf)
    assert r.returncode == 0, r.stderr
    assert r.stdout == from_header  # --record prints what it recorded
    written = gguf.parent / shape_record_name()
    assert oct(written.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in gguf.parent.iterdir() if p.name != "model.gguf"] == [written.name]  # no temporary left
    st = gguf.stat()
    assert json.loads(written.read_text())["signature"] == {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                                            "inode": st.st_ino}  # fmt: skip
    assert shape(gguf) == from_header
    # through a link, as models/current/model.gguf is read: the record beside the link's target
    link = gguf.parent.parent / "current"
    link.symlink_to(gguf.parent.name)
    assert json.loads(shape(link / "model.gguf")) == dict(json.loads(from_header), path=str(link / "model.gguf"))
    assert GgufShape().process(shape(link / "model.gguf").splitlines())["n_layer"] == 2


def _forge(gguf: Path, **changes) -> None:
    """Change the recorded shape, keeping its signature: what the record says is what answers."""
    written = gguf.parent / shape_record_name()
    data = json.loads(written.read_text())
    data["shape"].update(changes)
    written.write_text(json.dumps(data))


def test_the_record_answers_only_for_the_file_it_was_made_from(gguf):
    assert record(gguf).returncode == 0
    _forge(gguf, n_ctx_train=99)
    assert json.loads(shape(gguf))["n_ctx_train"] == 99  # the record answered, not the header
    assert json.loads(shape(gguf, recorded=False))["n_ctx_train"] == 2048

    # written in place, same size: its mtime moved
    st = gguf.stat()
    with open(gguf, "r+b") as f:
        f.seek(st.st_size - 1)
        f.write(b"\0")
    assert json.loads(shape(gguf))["n_ctx_train"] == 2048
    # the mtime put back: the record answers again (only --verify's sha256 sees such an edit)
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert json.loads(shape(gguf))["n_ctx_train"] == 99
    # replaced by a copy with the same size and mtime: another inode
    copy = gguf.with_name("copy")
    shutil.copy2(gguf, copy)
    os.replace(copy, gguf)
    assert gguf.stat().st_mtime_ns == st.st_mtime_ns
    assert json.loads(shape(gguf))["n_ctx_train"] == 2048


@pytest.mark.parametrize("damage", ["not json", "[]", '{"shape": {}}', "missing key", "extra key", "size",
                                    "layers", "string"])
def test_a_damaged_record_is_passed_over_for_the_header(gguf, damage):
    assert record(gguf).returncode == 0
    written = gguf.parent / shape_record_name()
    data = json.loads(written.read_text())
    if damage == "missing key":
        del data["shape"]["n_head_kv"]
    elif damage == "extra key":
        data["shape"]["n_head_kv2"] = 1
    elif damage == "size":
        data["shape"]["size"] += 1
    elif damage == "layers":  # more layers than sizes per layer
        data["shape"]["n_layer"] = 99
    elif damage == "string":
        data["shape"]["n_head_kv"] = "2"
    text = damage if damage in ("not json", "[]", '{"shape": {}}') else json.dumps(data)
    written.write_text(text)
    assert shape(gguf) == shape(gguf, recorded=False)


def test_a_record_of_another_reader_does_not_answer_and_a_new_record_removes_it(gguf):
    other = "shape-0000000000000000.json"
    assert record(gguf, other).returncode == 0
    data = json.loads((gguf.parent / other).read_text())
    data["shape"]["n_layer"] = 99
    (gguf.parent / other).write_text(json.dumps(data))
    assert json.loads(shape(gguf))["n_layer"] == 2  # this reader asks for its own record only
    assert record(gguf).returncode == 0
    assert sorted(p.name for p in gguf.parent.iterdir()) == sorted(["model.gguf", shape_record_name()])


@pytest.mark.parametrize("name", ["../shape-0123456789abcdef.json", "stamp.json", "shape-0123456789abcdef.json/x"])
def test_only_a_record_name_is_written_or_read(gguf, name):
    r = record(gguf, name)
    assert r.returncode != 0 and "not a shape record's name" in r.stderr
    assert sorted(p.name for p in gguf.parent.iterdir()) == ["model.gguf"]
    r = run(remote.command("gguf_header", str(gguf), "--recorded", name, python=sys.executable))
    assert r.stdout == shape(gguf, recorded=False)


def test_what_is_not_a_gguf_is_not_recorded(gguf):
    gguf.write_bytes(b"GGML" + bytes(40))
    r = record(gguf)
    assert r.returncode != 0
    assert sorted(p.name for p in gguf.parent.iterdir()) == ["model.gguf"]
