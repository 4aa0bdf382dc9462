"""bench/provenance.py: the stamp a benchmark puts in its result: the commit and the state
of the tree (by git, or by the record carried to a copy without git), the scripts' sha256,
the command, the machine; several commands' stamps joined; a result checked against git."""

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("provenance", ROOT / "bench/provenance.py")
provenance = sys.modules.setdefault("provenance", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(provenance)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A checkout with a bench script, a module it imports, a product file and a result."""
    root = tmp_path / "repo"
    for name, text in {"bench/run_me.py": "print('bench')\n", "bench/helper_mod.py": "X = 1\n",
                       "roles/thing.py": "Y = 2\n", "bench/results/r.json": "{}\n"}.items():  # fmt: skip
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root.parent, "init", "-q", str(root))
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return root


def test_a_stamp_names_the_commit_the_scripts_and_the_command(repo, monkeypatch):
    monkeypatch.delenv("BENCH_COMMAND", raising=False)
    s = provenance.stamp(repo / "bench/run_me.py", argv=["--reps", "3"], root=repo)
    assert s["schema"] == provenance.SCHEMA and s["commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert (s["tree"], s["changed"], s["commit_from"]) == ("clean", [], "git")
    sha = hashlib.sha256(b"print('bench')\n").hexdigest()
    assert s["scripts"] == {"bench/run_me.py": sha}
    assert s["command"] == "python3 bench/run_me.py --reps 3"
    assert s["started"] <= s["written"] and s["machine"]["cores"] >= 1
    assert set(s["machine"]) == {"cpu", "cores", "memory_gib", "kernel", "os", "python", "gpus"}


def test_the_files_a_bench_imports_from_bench_are_hashed_and_a_driver_names_itself(repo, monkeypatch):
    spec = importlib.util.spec_from_file_location("helper_mod", repo / "bench/helper_mod.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "helper_mod", module)
    monkeypatch.setenv("BENCH_COMMAND", "bash bench/gpu/thing.sh check")
    s = provenance.stamp(repo / "bench/run_me.py", extra=["roles/thing.py"], root=repo)
    assert set(s["scripts"]) == {"bench/run_me.py", "bench/helper_mod.py", "roles/thing.py"}
    assert s["command"] == "bash bench/gpu/thing.sh check"


def test_a_changed_tracked_file_makes_the_tree_dirty_but_a_result_does_not(repo):
    (repo / "bench/results/r.json").write_text('{"a": 1}\n')
    assert provenance.source(repo)["tree"] == "clean"
    (repo / "roles/thing.py").write_text("Y = 3\n")
    assert provenance.source(repo) | {"commit": None} == {"commit": None, "commit_from": "git", "tree": "dirty",
                                                           "changed": ["roles/thing.py"]}  # fmt: skip


def test_a_copy_without_git_reads_the_carried_record(repo, tmp_path):
    carried = provenance.carried_source(repo)
    assert set(carried["files"]) == {"bench/run_me.py", "bench/helper_mod.py", "roles/thing.py"}
    assert carried["files"]["roles/thing.py"] == git(repo, "rev-parse", "HEAD:roles/thing.py").strip()
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns(".git"))
    (copy / ".carry").mkdir()
    (copy / ".carry/source.json").write_text(json.dumps(carried))
    seen = provenance.source(copy)
    assert (seen["commit"], seen["tree"], seen["changed"]) == (carried["commit"], "clean", [])
    assert seen["commit_from"].startswith(".carry/source.json (written ")
    (copy / "roles/thing.py").write_text("Y = 4\n")
    (copy / "bench/helper_mod.py").unlink()
    assert provenance.source(copy)["changed"] == ["bench/helper_mod.py", "roles/thing.py"]
    (copy / ".carry/source.json").unlink()
    assert provenance.source(copy)["tree"] == "unknown"


def test_the_machine_names_each_gpu_nvidia_smi_lists(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA H100 80GB HBM3, 580.95.05, 81559 MiB, 9.0'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    assert provenance.machine()["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "driver": "580.95.05",
                                             "memory": "81559 MiB", "compute_cap": "9.0"}]  # fmt: skip


def test_commands_of_one_result_are_joined_and_a_mixed_one_is_said(repo):
    first = provenance.stamp(repo / "bench/run_me.py", argv=["--phases", "a"], root=repo)
    second = provenance.stamp(repo / "bench/run_me.py", argv=["--phases", "b"], root=repo)
    both = provenance.joined(provenance.joined(None, first), second)
    assert [r["command"] for r in both["runs"]] == ["python3 bench/run_me.py --phases a",
                                                    "python3 bench/run_me.py --phases b"]  # fmt: skip
    assert both["mixed"] is False and both["command"] == second["command"]
    other = {**second, "scripts": {"bench/run_me.py": "0" * 64}}
    assert provenance.joined(both, other)["mixed"] is True
    assert len(provenance.joined(first, second)["runs"]) == 2  # a stamp without runs counts as one


def test_a_result_is_checked_against_its_commit(repo, capsys):
    result = {"provenance": provenance.stamp(repo / "bench/run_me.py", root=repo)}
    assert provenance.check(result, repo) == []
    result["provenance"]["scripts"]["bench/run_me.py"] = "0" * 64
    result["provenance"]["scripts"]["bench/gone.py"] = "1" * 64
    assert provenance.check(result, repo) == ["bench/run_me.py: differs from the file at "
                                              f"{result['provenance']['commit'][:10]}",
                                              f"bench/gone.py: not at {result['provenance']['commit'][:10]}"]
    assert provenance.check({}, repo) == ["no provenance"]
    path = repo / "bench/results/r.json"
    path.write_text(json.dumps({}))
    assert provenance.main(["check", str(path)]) == 1 and capsys.readouterr().out.endswith("no provenance\n")


def test_stamps_of_several_results_merge_with_each_run_and_its_machine(repo):
    one = provenance.stamp(repo / "bench/run_me.py", argv=["a"], root=repo)
    two = provenance.joined(one, provenance.stamp(repo / "bench/run_me.py", argv=["b"], root=repo))
    three = provenance.stamp(repo / "bench/run_me.py", argv=["c"], root=repo)
    both = provenance.merged([two, three])
    assert [r["command"].split()[-1] for r in both["runs"]] == ["a", "b", "c"]
    assert all(r["machine"]["cores"] >= 1 for r in both["runs"]) and both["mixed"] is False
    assert provenance.runs_of(None) == [] and len(provenance.runs_of(three)) == 1
