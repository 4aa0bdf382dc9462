#!/usr/bin/env python3
"""What upgrading llamarack itself costs a converged rack: a new proof script, no new build.

    python3 bench/tool_upgrade_bench.py [--from REV]     (as root, the 4-host lab rack up and converged)

The next llamarack is this tree copied with a comment added to its smoke script
(``roles/llamacpp/files/llamacpp_proof.py``): the proof's id changes, what goes
into a build does not. Records, for the rack:

- plan_upgrade: what ``llamarack plan-upgrade`` of the copy says each host gets;
- upgrade_deploy: wall time and changed operations of the copy's deploy (each
  build re-proved in place), and per host whether a build directory was added
  and whether the server restarted (MainPID, NRestarts);
- second_deploy: the same for the copy's next deploy (nothing to change);
- back_deploy: this tree's deploy afterwards (its own proof re-proves again);
- cross_version (``--from REV``): the rack put on an older llamarack, the tree of commit
  REV (``git archive``), and deployed with it until it converges; then what this tree's
  ``plan-upgrade`` says, this tree's deploy and the one after it. A deploy that fails is
  recorded (``error``), and this tree's deploy puts the rack back.

Wall times are figures, not bounds: the lab's hosts share this machine's 2 cores.
Writes bench/results/tool-upgrade.json, stamped by ``bench/provenance.py``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (this folder's)
from llamarack_lab import rack as rackmod  # noqa: E402
from llamarack_lab.pytest_plugin import parse_pyinfra_totals, pyinfra_command  # noqa: E402

from converged_bench import _cpu, _pyinfra_version  # noqa: E402

PROOF = "roles/llamacpp/files/llamacpp_proof.py"
HOST_STATE = "systemctl show -p MainPID -p NRestarts llamarack-server.service | tr '\\n' ' '; ls /opt/llamarack/builds"


def copy_with_new_comment(where: Path) -> Path:
    tree = where / "llamarack"
    shutil.copytree(ROOT, tree, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".carry", ".whl", ".pytest_cache", "__pycache__", "*.egg-info", "bench"))
    proof = tree / PROOF
    proof.write_text("# A newer llamarack's comment.\n" + proof.read_text())
    return tree


def run(tree: Path, *argv: str, timeout: float = 3600) -> tuple[float, subprocess.CompletedProcess]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    r = subprocess.run(list(argv), cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    return time.monotonic() - started, r


def host_states(rack) -> dict:
    return {h.name: subprocess.run(rack.ssh_command(h.name, HOST_STATE), capture_output=True, text=True,
                                   timeout=60).stdout.strip() for h in rack.hosts}  # fmt: skip


def changed_in_rows(output: str, name: str) -> int:
    """The hosts that changed in pyinfra's results-table rows of the operations named ``name``."""
    rows = re.findall(rf"^\s*.*{re.escape(name)}.*?\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", output, re.M)
    return sum(0 if success == "-" else int(success) for _, success, _, _ in rows)


def deploy(rack, tree: Path) -> dict:
    before = host_states(rack)
    seconds, r = run(tree, *pyinfra_command(), "-y", "inventory/lab.py", "deploy.py")
    if r.returncode != 0:
        raise SystemExit(f"deploy failed (rc {r.returncode}):\n{r.stdout[-4000:]}")
    after = host_states(rack)
    return {"seconds": round(seconds, 2), "changed_operations": parse_pyinfra_totals(r.stdout)["success"],
            "reproved_builds": changed_in_rows(r.stdout, "Prove llama.cpp build"),
            "hosts_with_a_new_build_or_restart": sorted(h for h in before if before[h] != after[h])}


def older_tree(where: Path, rev: str) -> Path:
    """The tree of commit ``rev``, as ``git archive`` gives it, under ``where``."""
    tree = where / "older"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def plan_upgrade(tree: Path) -> list:
    return run(tree, sys.executable, "-m", "llamarack", "plan-upgrade", "inventory/lab.py")[1].stdout.strip().splitlines()


def cross_version(rack, rev: str) -> dict:
    """The rack moved from commit ``rev``'s llamarack to this one: put on the older one and
    converged there, then this tree's plan-upgrade, deploy and next deploy."""
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", rev], capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    out: dict = {"from": commit}
    steps = (("onto_older", "older"), ("older_converged", "older"), ("plan_upgrade", None),
             ("upgrade_deploy", "this"), ("next_deploy", "this"))  # fmt: skip
    with tempfile.TemporaryDirectory() as where:
        trees = {"older": older_tree(Path(where), commit), "this": ROOT}
        for name, tree in steps:
            try:
                out[name] = plan_upgrade(ROOT) if tree is None else deploy(rack, trees[tree])
            except SystemExit as e:
                out["error"] = {"step": name, "said": str(e)[-3000:]}
                out["put_back"] = deploy(rack, ROOT)
                break
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="older", metavar="REV", help="also move the rack from commit REV's llamarack to this one")
    args = ap.parse_args(argv)
    rack = rackmod.load()
    if rack is None or not rackmod.healthy(rack):
        raise SystemExit("no healthy lab rack is up: llamarack lab up, then deploy it until it converges")
    with tempfile.TemporaryDirectory() as where:
        tree = copy_with_new_comment(Path(where))
        planned = plan_upgrade(tree)
        result = {
            "benchmark": "tool-upgrade",
            "provenance": None,
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "pyinfra": _pyinfra_version(),
                        "hosts": len(rack.hosts)},
            "change": "a comment added to the smoke script (the proof's id changes; the build inputs do not)",
            "plan_upgrade": planned,
            "upgrade_deploy": deploy(rack, tree),
            "second_deploy": deploy(rack, tree),
        }
    result["back_deploy"] = deploy(rack, ROOT)
    if args.older:
        result["cross_version"] = cross_version(rack, args.older)
    result["provenance"] = provenance.stamp(__file__)
    out = ROOT / "bench/results/tool-upgrade.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
