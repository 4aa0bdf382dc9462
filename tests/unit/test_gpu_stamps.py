"""The GPU machine's scripts stamp their results (bench/provenance.py): the sandbox check
from its copy outside the checkout, the AWQ report once per command that ran, the split,
residency, layers, sleep and host-RAM checks with their shell drivers."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", ROOT / f"bench/gpu/{name}.py")
    module = sys.modules.setdefault(f"gpu_{name}", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(module)
    return module


def test_the_sandbox_result_is_stamped_by_the_checkout_it_came_from(monkeypatch):
    monkeypatch.setenv("BENCH_COMMAND", "bash bench/gpu/sandbox.sh")
    result = load("sandbox").stamped({"plain": {"ok": True}}, ROOT)
    stamp = result["provenance"]
    assert result["plain"] == {"ok": True} and stamp["command"] == "bash bench/gpu/sandbox.sh"
    assert {"bench/gpu/sandbox.py", "bench/gpu/sandbox.sh", "bench/gpu/sandbox-syscalls.json"} <= set(stamp["scripts"])


def test_each_awq_command_is_one_run_of_the_stamp(tmp_path, monkeypatch):
    report = load("awq_report")
    (tmp_path / "out").mkdir()
    monkeypatch.setenv("BENCH_COMMAND", "bash bench/gpu/awq.sh")
    report.stamp(tmp_path)
    stamp = report.stamp(tmp_path)
    assert len(stamp["runs"]) == 2 and stamp["mixed"] is False
    assert json.loads((tmp_path / "out/provenance.json").read_text()) == stamp
    assert {"bench/gpu/awq_report.py", "bench/gpu/awq.sh"} <= set(stamp["scripts"])


@pytest.mark.parametrize("script, driver", [("split.sh", "split_ledger.py"), ("residency.sh", "residency.py"),
                                            ("awq.sh", "awq_report.py"), ("sandbox.sh", "sandbox.py"),
                                            ("layers.sh", "layers.py"), ("sleep.sh", "sleep.py"),
                                            ("host_ram.sh", "host_ram.py")])
def test_each_shell_driver_names_its_command_to_the_stamp(script, driver):
    text = (ROOT / "bench/gpu" / script).read_text()
    assert 'BENCH_COMMAND="bash bench/gpu/' + script in text and driver in text
    assert f'"bench/gpu/{script}"' in (ROOT / "bench/gpu" / driver).read_text()  # hashed in its stamp


@pytest.mark.parametrize("script", ["layers.py", "sleep.py", "host_ram.py"])
def test_each_new_gpu_check_writes_its_stamp_into_its_result(script):
    text = (ROOT / "bench/gpu" / script).read_text()
    assert '["provenance"] = provenance.stamp(__file__, extra=' in text and "import provenance" in text


def test_a_copy_whose_git_is_older_than_its_carry_is_stamped_by_the_carry(monkeypatch, tmp_path):
    """The GPU machine's copy can hold a git of an older commit: its files agree with the
    carried record (every tracked file's blob id at the checkout's commit), not with that git."""
    sys.path.insert(0, str(ROOT / "bench"))
    import provenance

    stale = {"commit": "3389e28", "commit_from": "git", "tree": "dirty", "changed": ["a"] * 20, "changed_count": 75}
    carried = {"commit": "ccd67c8", "commit_from": ".carry/source.json", "tree": "clean", "changed": []}
    monkeypatch.setattr(provenance, "from_git", lambda root: stale)
    monkeypatch.setattr(provenance, "from_carry", lambda root: carried)
    assert provenance.source(tmp_path)["commit"] == "ccd67c8"
    monkeypatch.setattr(provenance, "from_carry", lambda root: None)
    assert provenance.source(tmp_path)["commit"] == "3389e28"  # git alone says
    monkeypatch.setattr(provenance, "from_git", lambda root: None)
    assert provenance.source(tmp_path)["commit"] is None
