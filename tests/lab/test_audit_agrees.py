"""The audit says what a deploy would do: on each drifted state, the items the audit calls
drift are exactly the deploy steps that then change something, and after that deploy the
audit is clean.

Each case drifts one converged host one way, audits it, deploys it, and compares the
audit's drifted items with the groups of pyinfra's results table whose operations
changed. ``gpu_processes`` has no deploy counterpart (the deploy never stops another
process on a card): docs/audit.md says so. The rules' agreement (the audit names the
rule the deploy refuses with, in the same words) is in test_preflight_driver.py.
"""

import json
import re
import subprocess
import sys

import pytest

from llamarack_lab.pytest_plugin import parse_pyinfra_totals
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-b"
UNIT = "/etc/systemd/system/llamarack-server.service"
OPT = "/opt/llamarack"

# Each audit item, and the deploy step (group | operation name prefix of the results table) that repairs it.
REPAIRED_BY = {
    "llamarack": "llamarack deployed | Record llamarack",
    "driver": "llamarack driver | ",
    "toolchain": "llamarack toolchain | ",
    "awq_env": "llamarack python env | ",
    "converter_env": "llamarack converter env | ",
    "build": "llama.cpp build | ",
    "pipeline_user": "llamarack model | Model pipeline user",
    "model": "llamarack model | Model ",  # (a changed pipeline user's row is named by its item too)
    "service_user": "llama-server | Service user",
    "unit": "llama-server | llama-server at",
    "service": "llama-server | llama-server at",
    "health": "llama-server | llama-server at",
    "residency": "llama-server | llama-server at",
    "bench": "llama-server | llama-bench",
}

DRIFTS = {
    "unit edited": (f"echo '# edited by hand' >> {UNIT} && systemctl daemon-reload", {"unit"}),
    "service stopped": ("systemctl stop llamarack-server.service", {"service", "health"}),
    "driver hold lost": ("apt-mark unhold $(apt-mark showhold)", {"driver"}),
    "env package removed": (f"{OPT}/envs/awq/bin/python -m pip uninstall -y -q accelerate", {"awq_env"}),
    "version record removed": (f"rm {OPT}/state/deployed-by.json", {"llamarack"}),
    "shape record removed": (f"rm {OPT}/models/current/shape-*.json", {"model"}),
    "bench record removed": (f"rm {OPT}/state/bench.json", {"bench"}),
    "pipeline user unmarked": ("usermod --comment '' llamarack-model", {"pipeline_user"}),
}


def audit() -> dict:
    r = subprocess.run([sys.executable, "-m", "llamarack", "audit", "inventory/lab.py", "--limit", HOST, "--json"],
                       cwd=deploying.ROOT, capture_output=True, text=True, timeout=300)
    assert r.stdout.startswith("{"), r.stderr[-3000:]
    return json.loads(r.stdout)["hosts"][HOST]


def changed_steps(output: str) -> set:
    """The results table's rows (``group | operation``) whose operation changed the host."""
    rows = re.findall(r"^\s{4}(\S.*?\|.*?)\s{2,}(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$", output, re.M)
    return {name.strip() for name, _, success, _, _ in rows if success != "-"}


def repaired(items: set, steps: set) -> bool:
    """Every step that changed is one a drifted item names, and every drifted item's step changed."""
    wanted = {REPAIRED_BY[i] for i in items}
    return all(any(s.startswith(w) for w in wanted) for s in steps) and \
        all(any(s.startswith(w) for s in steps) for w in wanted)  # fmt: skip


def test_the_host_is_converged(lab_rack):
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-3000:]
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-3000:]
    assert audit()["drift"] == []


@pytest.mark.parametrize("case", list(DRIFTS))
def test_what_the_audit_calls_drift_is_what_the_deploy_changes(lab_rack, case):
    command, expected = DRIFTS[case]
    deploying.sh(lab_rack, HOST, command)
    drifted = set(audit()["drift"])
    assert drifted == expected, drifted
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-3000:]
    steps = changed_steps(out)
    assert repaired(drifted, steps), (drifted, steps)
    assert audit()["drift"] == [], "the deploy repaired what the audit named"
