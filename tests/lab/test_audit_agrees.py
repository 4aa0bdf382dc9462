"""The audit says what a deploy would do: on each drifted state, the items the audit calls
drift are exactly the deploy steps that then change something, the deploy puts the host's
real state back, and after that deploy the audit is clean.

Each case drifts one converged host one way, checks the host's own state (a shell test
that passes on the converged host) now fails, audits it, deploys it, compares the audit's
drifted items with the groups of pyinfra's results table whose operations changed, and
checks that the host's own state passes again. Every item with a deploy counterpart has a
case but ``residency``: the lab serves CPU builds, which have no cards to be resident on
(its verdicts are tested with real nvidia-smi output in tests/unit/test_gpu_verdicts.py).
``gpu_processes`` has no deploy counterpart (the deploy never stops another process on a
card): docs/audit.md says so. The rules' agreement (the audit names the rule the deploy
refuses with, in the same words) is in test_preflight_driver.py.
"""

import json
import re
import shlex
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
    "process": "llama-server | llama-server at",
    "residency": "llama-server | llama-server at",
    "bench": "llama-server | llama-bench",
}

SEALED = f"{OPT}/builds/current"
# The current build's files are the ones its manifest sealed (size and mtime).
BUILD_AS_SEALED = (f"python3 -c \"import json, os; m = json.load(open('{SEALED}/manifest.json')); "
                   f"print(all(os.lstat('{SEALED}/' + e['path']).st_mtime_ns == e['mtime_ns'] "
                   "for e in m['files'] if 'mtime_ns' in e))\" | grep -qx True")  # fmt: skip


# The process runs another model than its unit file names (a copy of it, so it serves): put
# in by a drop-in, restarted, then the drop-in removed with a daemon-reload and no restart,
# as a deploy that switched the unit's files without restarting it leaves a host.
STALE = "/opt/stale-model.gguf"
UP = ("timeout 120 sh -c 'until python3 -c \"import urllib.request as u; u.urlopen(\\\"http://127.0.0.1:8080/health\\\")\" "
      ">/dev/null 2>&1; do sleep 1; done'")  # fmt: skip
STALE_PROCESS = (f"stale={shlex.quote(STALE)} unit={shlex.quote(UNIT)} "
                 f"model={shlex.quote(OPT + '/models/current/model.gguf')}; "
                 'cp "$model" "$stale" && chmod 644 "$stale" && mkdir -p "$unit.d" && '
                 "printf '[Service]\\nExecStart=\\nExecStart=%s\\n' \"$(sed -n 's/^ExecStart=//p' \"$unit\" | "
                 'sed "s|--model [^ ]*|--model $stale|")" > "$unit.d/stale.conf" && systemctl daemon-reload && '
                 f'systemctl restart llamarack-server.service && {UP} && rm -r "$unit.d" "$stale" && '
                 "systemctl daemon-reload")  # fmt: skip
SERVES_ITS_UNIT = (f"{UP} && python3 -c \"import json, urllib.request as u; "
                   "said = json.load(u.urlopen('http://127.0.0.1:8080/props'))['model_path']; "
                   f"words = next(x for x in open({UNIT!r}) if x.startswith('ExecStart=')).split(); "
                   "assert said == words[words.index('--model') + 1], said\"")  # fmt: skip


def yes(test: str) -> str:
    return f"if {{ {test}; }} >/dev/null 2>&1; then echo yes; else echo no; fi"


# case: (the drift, the items the audit must call drift, the host's own test of the state
# the deploy restores, the steps that follow from the repair: a rebuilt build moves the unit)
DRIFTS = {
    "unit edited": (f"echo '# edited by hand' >> {UNIT} && systemctl daemon-reload", {"unit"},
                    f"! grep -q 'edited by hand' {UNIT}", set()),
    "process not restarted": (STALE_PROCESS, {"process"}, SERVES_ITS_UNIT, set()),
    "service stopped": ("systemctl stop llamarack-server.service", {"service", "health"},
                        "systemctl is-active -q llamarack-server.service", set()),
    "driver hold lost": ("apt-mark unhold $(apt-mark showhold)", {"driver"}, "apt-mark showhold | grep -q .", set()),
    "env package removed": (f"{OPT}/envs/awq/bin/python -m pip uninstall -y -q accelerate", {"awq_env"},
                            f"{OPT}/envs/awq/bin/python -c 'import accelerate'", set()),
    "converter package removed": (f"{OPT}/envs/convert/bin/python -m pip uninstall -y -q sentencepiece",
                                  {"converter_env"}, f"{OPT}/envs/convert/bin/python -c 'import sentencepiece'",
                                  set()),  # fmt: skip
    "version record removed": (f"rm {OPT}/state/deployed-by.json", {"llamarack"},
                               f"test -s {OPT}/state/deployed-by.json", set()),
    "shape record removed": (f"rm {OPT}/models/current/shape-*.json", {"model"},
                             f"ls {OPT}/models/current/shape-*.json", set()),
    "bench record removed": (f"rm {OPT}/state/bench.json", {"bench"}, f"test -s {OPT}/state/bench.json", set()),
    "pipeline user unmarked": ("usermod --comment '' llamarack-model", {"pipeline_user"},
                               "getent passwd llamarack-model | cut -d: -f5 | grep -q .", set()),
    "service user unmarked": ("usermod --comment '' llamarack", {"service_user"},
                              "getent passwd llamarack | cut -d: -f5 | grep -q .", set()),
    "build package removed": ("apt-get remove -y -qq ccache", {"toolchain"},
                              "dpkg-query -W -f='${Status}' ccache | grep -q 'ok installed'", set()),
    # the build made again beside it: the unit moves to it, the bench measures it, the old one goes
    "build file changed after its seal": (f"touch {SEALED}/build/bin/llama-cli", {"build"}, BUILD_AS_SEALED,
                                          {"llama-server | llama-server at", "llama-server | llama-bench",
                                           "llama-server | Prune old llama.cpp builds"}),
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


def repaired(items: set, steps: set, follows: set = frozenset()) -> bool:
    """Every step that changed is one a drifted item names (or one that follows from its
    repair), and every drifted item's step changed."""
    wanted = {REPAIRED_BY[i] for i in items}
    return all(any(s.startswith(w) for w in wanted | follows) for s in steps) and \
        all(any(s.startswith(w) for s in steps) for w in wanted)  # fmt: skip


def test_the_host_is_converged(lab_rack):
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-3000:]
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0 and parse_pyinfra_totals(out)["success"] == 0, out[-3000:]
    assert audit()["drift"] == []


@pytest.mark.parametrize("case", list(DRIFTS))
def test_what_the_audit_calls_drift_is_what_the_deploy_changes(lab_rack, case):
    command, expected, holds, follows = DRIFTS[case]
    assert deploying.sh(lab_rack, HOST, yes(holds)) == "yes", f"{case}: the converged host fails its own test"
    deploying.sh(lab_rack, HOST, command)
    assert deploying.sh(lab_rack, HOST, yes(holds)) == "no", f"{case}: the drift did not change the host"
    drifted = set(audit()["drift"])
    assert drifted == expected, drifted
    rc, out = deploying.deploy(lab_rack, HOST)
    assert rc == 0, out[-3000:]
    steps = changed_steps(out)
    assert repaired(drifted, steps, follows), (drifted, steps)
    assert deploying.sh(lab_rack, HOST, yes(holds)) == "yes", f"{case}: the deploy did not restore the host"
    assert audit()["drift"] == [], "the deploy repaired what the audit named"


def test_every_item_a_deploy_repairs_has_a_case_but_residency():
    cased = set().union(*(items for _, items, _, _ in DRIFTS.values()))
    assert set(REPAIRED_BY) - cased == {"residency"}
