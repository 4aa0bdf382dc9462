"""``llamarack rollout`` across the lab rack, behind its gateway (lab-gw:8000), under a
steady bounded load (``bench/loadgen.py``): a llama.cpp bump rolled canary first drops
no request, a converged rollout restarts nothing, and a driver upgrade within the branch
(``roles.driver.upgrade.driver_upgrade``, shipped with llamarack: unhold, apt upgrade from the lab's driver
repository, reboot) rolls host by host and drops no request either. The rack is put back
on the base commit and the default driver afterwards. The full measurement is
``bench/rollout_bench.py``."""

import importlib.util
import json
import re
import shlex
import subprocess
import sys

import pytest

from llamarack_lab import mirror, services
from llamarack_lab.fake_nvidia import deb
from tests.lab import deploying

pytestmark = pytest.mark.lab

GATEWAY = "lab-gw"
INVENTORY = deploying.ROOT / "inventory/lab.py"
JOURNAL = deploying.ROOT / ".llamarack/rollout-lab.json"
CURRENT = "readlink /opt/llamarack/builds/current"
DRIVER_UPGRADE = "roles.driver.upgrade.driver_upgrade"
# /run is a tmpfs each boot makes anew: the mark is gone after a reboot, and only then.
MARK, MARKED = "touch /run/lab-rollout-mark", "test -e /run/lab-rollout-mark && echo yes || echo no"
DRIVER = "nvidia-smi --query-gpu=driver_version --format=csv,noheader | sort -u; apt-mark showhold"
SERVER = "systemctl show -p MainPID -p NRestarts llamarack-server.service; " \
         "sha256sum /etc/systemd/system/llamarack-server.service"

_spec = importlib.util.spec_from_file_location("loadgen", deploying.ROOT / "bench/loadgen.py")
loadgen = sys.modules.setdefault("loadgen", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(loadgen)


@pytest.fixture(scope="module")
def bump():
    """A later llama.cpp of its own (the upgrade and day-2 tests bump to another one): the
    artifacts this rollout makes on every host are not the ones those tests expect to make."""
    return mirror.add_named_commit(services.prepare(), "lab-rollout-bump", "lab test: a later llama.cpp, rolled",
                                   mirror.GOOD_BUMP)  # fmt: skip


@pytest.fixture(scope="module")
def serving(lab_rack):
    names = [h.name for h in lab_rack.hosts if h.name != GATEWAY]
    # The module's own start, whatever ran before it: the whole rack deployed, the gateway too.
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", inventory=INVENTORY, timeout=3600)
    assert rc == 0, out[-4000:]
    yield names
    JOURNAL.unlink(missing_ok=True)
    for h in names:  # the default driver, loaded (the driver upgrade below leaves a later one)
        lab_rack.driver(h, version=deb.DEFAULT_VERSION, state="ok")
    rc, out = lab_rack.run_pyinfra(deploying.ROOT / "deploy.py", inventory=INVENTORY, timeout=3600)  # the base commit
    assert rc == 0, out[-4000:]


# The lab's hosts share this machine's two cores with each other and with the load: a
# llama-bench run of the tiny model during a rollout measures that contention, not the
# build (the bump's tg128 fell to 5% of the record before in a run here; the bump changes
# only a README), so the rollout of a new build takes no bench figure (--bench-fraction 1:
# docs/rollout.md says why), nor does the one back to the base commit. The others run with
# the default gate: with no new build there is no figure to compare. The gate's arithmetic is tested in tests/unit/test_rollout.py.
LAB_GATE = ("--bench-fraction", "1")


def rollout(*args: str, gate: tuple = ()) -> tuple[int, str, dict]:
    if "--resume" not in args:  # a new rollout; --resume goes on from the one on file
        JOURNAL.unlink(missing_ok=True)
    r = subprocess.run([sys.executable, "-m", "llamarack", "rollout", str(INVENTORY), *gate, *args],
                       cwd=deploying.ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)  # fmt: skip
    return r.returncode, r.stdout, json.loads(JOURNAL.read_text())["hosts"]


def under_load(lab_rack, action):
    url = f"http://{lab_rack.rack.host(GATEWAY)['ip']}:8000"
    # paced (each client at most 20 requests a second): a switch's window still meets dozens of
    # requests, and the builds and conversions the rollout runs keep the lab's two cores
    load = loadgen.Load(url, requests=100_000, concurrency=2, time_limit=3600, n_predict=4, pace=0.05).start()
    try:
        outcome = action()
    finally:
        load.stop.set()
    return outcome, load.wait()


# A row of pyinfra's closing table: the operation, then its hosts, success, error, no change.
ROW = r"^\s*{}.*?\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s*$"
# A drained window's seconds are a figure, not a bound: 8 s for each host in one run here, and
# 8 to 152 s in a full CI run on the same kind of machine, with nothing built or converted in
# any window (the closing tables say so, and that is what is asserted). The bench records them.


def window_rows(out: str, operation: str) -> list:
    """The closing-table rows of the operations ``operation`` (a pattern) names in the deploys
    of the drained windows (the stage's lines are marked ``HOST (stage) | ``)."""
    window = "\n".join(line for line in out.splitlines() if "(stage) | " not in line)
    return re.findall(ROW.format(operation), window, re.M)


def test_a_bump_rolls_canary_first_and_drops_no_request(lab_rack, serving, bump):
    builds = {h: deploying.sh(lab_rack, h, CURRENT) for h in serving}
    (rc, out, hosts), load = under_load(lab_rack, lambda: rollout("--data", f"llamacpp_commit={bump}", gate=LAB_GATE))
    assert rc == 0, out[-6000:]
    assert {h: v["state"] for h, v in hosts.items()} == {h: "done" for h in serving}
    moved = re.findall(r"^\S+ (\S+): deploying$", out, re.M)
    assert moved == serving  # canary (the first) first, each once, in inventory order
    assert load["failed"] == 0 and load["ok"] > 0, load
    assert all(deploying.sh(lab_rack, h, CURRENT) != builds[h] for h in serving)  # a new build serves
    # Staged first, every host while it served: no host drained before the last was staged,
    # and no deploy inside a drained window built llama.cpp or made the model.
    staged = [out.index(f" {h}: staged\n") for h in serving]
    assert max(staged) < out.index(": draining\n"), out[-6000:]
    stage = [line for line in out.splitlines() if "(stage) | " in line]
    assert any("llama.cpp build | Build llama.cpp " in line for line in stage), out[-6000:]
    # One compile in all: the stage's runs (one per host) compiled the bump on one host, the
    # others received it, and every host serves the same binaries.
    assert sum("not compiling it" in line for line in stage) == len(serving) - 1, out[-6000:]
    binaries = "cd /opt/llamarack/builds/current/build/bin && sha256sum *"
    assert len({deploying.sh(lab_rack, h, binaries) for h in serving}) == 1
    # One model artifact in all (the bump converts again): one stage run made it, on a host
    # whose blob cache holds the checkpoint where one does; the others received it.
    assert sum("not making it" in line for line in stage) == len(serving) - 1, out[-6000:]
    fetched = [line for line in stage if "in the host's blob cache" in line]  # the maker's fetch line
    counts = re.search(r"(\d+) file\(s\), [^,]*, (\d+) of them in the host's blob cache", fetched[0]) if fetched else None
    assert len(fetched) == 1 and counts and counts[1] == counts[2], fetched  # every file from its cache
    made = "cd /opt/llamarack/models/current && sha256sum quantize.log model.gguf"
    assert len({deploying.sh(lab_rack, h, made) for h in serving}) == 1
    assert not any(re.search(r"(llama-server|llamarack driver|llamarack gateway) \| ", line) for line in stage)
    for operation in (r"llama\.cpp build \| Build llama\.cpp ", r"llamarack model \| Model [0-9a-f]{16} "):
        rows = window_rows(out, operation)
        assert len(rows) == len(serving) and {r[1] for r in rows} == {"-"}, (operation, rows)
    assert all(isinstance(v["drained_s"], int) and v["drained_s"] >= 0 for v in hosts.values()), hosts
    # the build that served before stays, the rollback's target, though the stage made another current
    kept = "cd /opt/llamarack/builds && test -d {} && echo kept"
    assert all(deploying.sh(lab_rack, h, kept.format(shlex.quote(builds[h].strip()))).strip() == "kept"
               for h in serving)  # fmt: skip


def test_a_converged_rollout_restarts_nothing(lab_rack, serving, bump):
    # Its own start, whatever ran before: every serving host on the bump already.
    rc, out = deploying.deploy(lab_rack, ",".join(serving), f"llamacpp_commit={bump}")
    assert rc == 0, out[-6000:]
    before = {h: deploying.sh(lab_rack, h, SERVER) for h in serving}
    (rc, out, hosts), load = under_load(lab_rack, lambda: rollout("--data", f"llamacpp_commit={bump}"))
    assert rc == 0 and set(v["state"] for v in hosts.values()) == {"done"}, out[-6000:]
    totals = re.findall(r"^\s*Grand total\s+\S+\s+(\S+)", out, re.M)
    assert len(totals) == len(serving) and set(totals) <= {"-", "0"}, totals  # each deploy changed nothing
    assert {h: deploying.sh(lab_rack, h, SERVER) for h in serving} == before
    assert load["failed"] == 0, load


def test_a_driver_upgrade_rolls_with_reboots_and_drops_no_request(lab_rack, serving):
    for h in serving:
        deploying.sh(lab_rack, h, MARK)
    version = f"nvidia_driver_version={deb.UPGRADE_VERSION}-1"
    (rc, out, hosts), load = under_load(lab_rack, lambda: rollout(str(DRIVER_UPGRADE), "--data", version))
    assert rc == 0, out[-6000:]
    assert {h: v["state"] for h, v in hosts.items()} == {h: "done" for h in serving}
    assert re.findall(r"^\S+ (\S+): deploying$", out, re.M) == serving  # each once, in order
    assert load["failed"] == 0 and load["ok"] > 0, load
    for h in serving:  # rebooted onto the new driver, unheld until the project's deploy
        assert deploying.sh(lab_rack, h, MARKED) == "no", h
        assert deploying.sh(lab_rack, h, DRIVER).strip() == deb.UPGRADE_VERSION, h

    # The project's deploy, rolled: the driver held again; a second driver rollout reboots nothing.
    # It also takes every host from the bump back to the base commit: a new build, so LAB_GATE.
    rc, out, hosts = rollout(gate=LAB_GATE)
    assert rc == 0 and set(v["state"] for v in hosts.values()) == {"done"}, out[-6000:]
    held = sorted(name.removesuffix(":amd64") for name in deb.package_names())  # every package of the driver
    assert all(sorted(deploying.sh(lab_rack, h, DRIVER).split()) == sorted([deb.UPGRADE_VERSION, *held])
               for h in serving)  # fmt: skip
    for h in serving:
        deploying.sh(lab_rack, h, MARK)
    rc, out, hosts = rollout(str(DRIVER_UPGRADE), "--data", version)
    assert rc == 0 and "Reboot onto the new driver" not in out, out[-6000:]
    assert all(deploying.sh(lab_rack, h, MARKED) == "yes" for h in serving)
