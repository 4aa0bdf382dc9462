"""bench/tool_upgrade_bench.py apart from the lab: the move from an older commit's llamarack
to this one, each step in order, and a failed step recorded with the rack put back."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("tool_upgrade_bench", ROOT / "bench/tool_upgrade_bench.py")
bench = sys.modules.setdefault("tool_upgrade_bench", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bench)


def test_the_older_tree_is_the_commits_own(tmp_path):
    tree = bench.older_tree(tmp_path, "HEAD~1")
    assert (tree / "deploy.py").is_file() and not (tree / ".git").exists()


def fake_deploys(monkeypatch, fail_at: int = -1) -> list:
    calls = []

    def deploy(rack, tree):
        calls.append("this" if tree == bench.ROOT else "older")
        if len(calls) - 1 == fail_at:
            raise SystemExit("deploy failed (rc 1): no such operation")
        return {"seconds": 1.0, "changed_operations": len(calls)}

    monkeypatch.setattr(bench, "deploy", deploy)
    monkeypatch.setattr(bench, "plan_upgrade", lambda tree: ["lab-v100-a: 1 change(s)"])
    return calls


def test_the_rack_moves_from_the_older_llamarack_to_this_one(monkeypatch):
    calls = fake_deploys(monkeypatch)
    out = bench.cross_version(None, "HEAD~1")
    assert calls == ["older", "older", "this", "this"]
    assert list(out) == ["from", "onto_older", "older_converged", "plan_upgrade", "upgrade_deploy", "next_deploy"]
    assert len(out["from"]) == 40 and out["plan_upgrade"] == ["lab-v100-a: 1 change(s)"]


def test_a_failed_step_is_recorded_and_this_tree_puts_the_rack_back(monkeypatch):
    calls = fake_deploys(monkeypatch, fail_at=1)
    out = bench.cross_version(None, "HEAD~1")
    assert calls == ["older", "older", "this"]
    assert out["error"] == {"step": "older_converged", "said": "deploy failed (rc 1): no such operation"}
    assert out["put_back"]["changed_operations"] == 3 and "upgrade_deploy" not in out
