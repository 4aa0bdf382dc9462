"""roles/rollout.py: the order, the batches, each host's states, the stop at a failure
and --resume. The inventory is loaded by pyinfra as the command loads it; only the
pyinfra boundary (a command on a host, the deploy of one host) is a fake, which answers
each host script (recognised by its source) from a small model of the rack."""

import json
import os
import shlex
import stat

import pytest

from llamarack import hosts, remote
from roles import rollout
from llamarack.audit import HostAudit, Item
from roles.server.plan import HEALTH_MARK, RESIDENCY_MARK

SOURCES = {remote.source(n): n for n in remote.names()}
DATA = '{"python_env_backend": "venv", "llamacpp_backend": "cpu"}'
INVENTORY = f"""
gateways = [("lab-gw", {DATA}), ("lab-gw2", {DATA})]
lab = [("lab-a", {DATA}), ("lab-b", {DATA}), ("lab-c", {DATA}), ("lab-d", {DATA}), ("lab-e", {DATA})]
"""
ONE_UNIT = [{"index": 0, "unit": "llamarack-server.service", "port": 8080, "url": "http://127.0.0.1:8080"}]
RECORD = {"key": {"build": "b1", "model": "m1"}, "pp512": {"tokens_per_second": 100.0},
          "tg128": {"tokens_per_second": 20.0}}


class FakeRack:
    """The pyinfra boundary: ``run(host, command, timeout)`` and ``deploy(name)``."""

    def __init__(self, names=("lab-a", "lab-b", "lab-c", "lab-d", "lab-e")):
        self.events = []  # (where, what), in the order they came
        self.fail = {}  # host -> the script (or "deploy") that fails there
        self.units = {n: ONE_UNIT for n in names}
        self.servers = {gw: {f"{n}_0": "ready" for n in names} for gw in ("lab-gw", "lab-gw2")}
        self.bench = {n: dict(RECORD) for n in names}
        self.new_bench = {}  # host -> the record its deploy measures
        self.records = {}  # host -> its state/rollout.json
        self.unreachable = set()
        self.broken = set()  # hosts whose connector raises
        self.cpu = set()  # hosts of a CPU build: their units name no cards
        self.served = {}  # host -> the model its processes' /props name (by default their units')

    def run(self, host, command, timeout):
        name, words = host.name, shlex.split(command)
        if name in self.broken:
            raise RuntimeError("the connector broke")
        if name in self.unreachable:
            return hosts.Reply(name, error="Could not connect")
        if words[:2] == ["sh", "-c"]:
            self.records[name] = json.loads(words[5])
            return hosts.Reply(name, True)
        if words[0] == "cat":
            return self.cat(name, words[1])
        if words[:2] == ["cd", "/etc/systemd/system"]:  # ServedUnits, with health
            return hosts.Reply(name, True, self.served_units(name))
        script, args = SOURCES[words[2]], words[3:]
        if script == "haproxy_runtime":
            return self.gateway(name, args)
        self.events.append((name, script if script != "server_idle" else f"server_idle {args[0]}"))
        if self.fail.get(name) == script:
            return hosts.Reply(name, False, [], [f"{script} failed here"])
        if script == "server_idle" and args[0] == "units":
            return hosts.Reply(name, True, [json.dumps({"units": self.units[name]})])
        return hosts.Reply(name, True)

    def cat(self, name, path):
        if path.endswith("/bench.json"):
            return hosts.Reply(name, True, json.dumps(self.bench[name]).splitlines())
        if path.startswith("/etc/systemd/system/"):
            cards = [] if name in self.cpu else [f"{RESIDENCY_MARK}GPU-1 900"]
            return hosts.Reply(name, True, [f"{HEALTH_MARK}http://127.0.0.1:8080/health", *cards, "[Unit]"])
        return hosts.Reply(name, False)

    def served_units(self, name) -> list:
        """``ServedUnits``' output: each unit with its model, its build's commit and its /props."""
        said = {"build_info": "b1-dccad28c6", "model_path": self.served.get(name, "/opt/llamarack/models/m1/model.gguf")}
        lines = []
        for unit in self.units[name]:
            lines += [f"unit {unit['unit']} 0123", "state ActiveState=active",
                      "line ExecStart=/opt/llamarack/builds/b1/bin/llama-server --model /opt/llamarack/models/m1/model.gguf",
                      "built version: 0.5.0-dev (build 1, commit dccad28c6)", f"health 200 awake {json.dumps(said)}"]
        return lines

    def gateway(self, gw, args):
        what = f"{args[0]} {args[1]}" if args[0] == "set" else args[0]
        names = args[2:] if args[0] == "set" else args[2:]
        self.events += [(gw, f"{what} {n}") for n in names]
        unknown = [n for n in names if n not in self.servers[gw]]
        if unknown:
            return hosts.Reply(gw, False, [], [f"not set {args[1]}: llamarack/{unknown[0]}: No such server."])
        if args[0] == "set":
            self.servers[gw].update({n: args[1] for n in names})
        return hosts.Reply(gw, True)

    def deploy(self, name, deploy_file=None):
        if deploy_file is not None:  # the stage: it makes, it switches nothing
            self.events.append((name, "stage"))
            return (1, ["    [x]  Error: the build failed"]) if self.fail.get(name) == "stage" else (0, [])
        self.events.append((name, "deploy"))
        if self.fail.get(name) == "deploy":
            return 1, ["--> pyinfra error: something"]
        if name in self.new_bench:
            self.bench[name] = self.new_bench[name]
        return 0, ["Grand total  1  0  -  12"]

    def touched(self) -> list:
        """The serving hosts anything was done to (their own commands, or their servers on a
        gateway), in order."""
        return list(dict.fromkeys(e[0] if not e[0].startswith("lab-gw") else e[1].rsplit(" ", 1)[1].rsplit("_", 1)[0]
                                  for e in self.events))

    def timeline(self, host) -> list:
        """``host``'s steps, the gateways' for its servers among them."""
        return [what if where == host else f"{where} {what.rsplit(' ', 1)[0]}" for where, what in self.events
                if where == host or (where.startswith("lab-gw") and what.endswith(f" {host}_0"))]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inventory.py").write_text(INVENTORY)
    return tmp_path


def roll(fake, printed=None, inventory="inventory.py", deploy="deploy.py", **kwargs):
    request = rollout.Request(inventory, deploy, options=rollout.Options(**kwargs.pop("options", {})),
                              **kwargs)  # fmt: skip
    return rollout.main(request, echo=(printed if printed is not None else []).append, boundary=fake)


def states(printed, host):
    return [line.split(f" {host}: ", 1)[1].split(" ")[0] for line in printed if f" {host}: " in line]


def journal():
    return json.loads(open(".llamarack/rollout-inventory.json").read())


def test_batches_put_the_canary_first_then_the_rest_in_order():
    names = ["a", "b", "c", "d", "e"]
    assert rollout.batches(names, None, 1) == [["a"], ["b"], ["c"], ["d"], ["e"]]
    assert rollout.batches(names, "c", 2) == [["c"], ["a", "b"], ["d", "e"]]
    assert rollout.batches(names, "e", 10) == [["e"], ["a", "b", "c", "d"]]
    with pytest.raises(ValueError, match="no serving host"):
        rollout.batches(names, "gw", 1)


def test_server_names_are_the_gateways():
    assert rollout.server_name("lab-v100-a", 0) == "lab-v100-a_0"
    assert rollout.server_name("gpu 7/rack:b", 2) == "gpu_7_rack_b_2"


LIFE = ["server_idle units", "lab-gw set drain", "lab-gw2 set drain", "lab-gw wait-empty", "lab-gw2 wait-empty",
        "server_idle idle", "deploy", "server_idle units", "wait_healthy", "completion_probe", "wait_healthy",
        "lab-gw set ready", "lab-gw2 set ready", "lab-gw wait-up", "lab-gw2 wait-up"]


def test_a_rollout_moves_every_host_once_canary_first(here):
    fake, printed = FakeRack(), []
    assert roll(fake, printed, options={"canary": "lab-c", "batch": 2}) == 0
    deploys = [e[0] for e in fake.events if e[1] == "deploy"]
    assert deploys[0] == "lab-c" and sorted(deploys[1:3]) == ["lab-a", "lab-b"] and sorted(deploys[3:]) == ["lab-d", "lab-e"]
    for host in ("lab-a", "lab-b", "lab-c", "lab-d", "lab-e"):
        # drained and idle before its deploy, gated before it is undrained, each step once
        assert fake.timeline(host) == LIFE
        assert states(printed, host) == ["draining", "deploying", "gated", "done"]
        assert fake.records[host]["state"] == "done"
    assert all(state == "ready" for gw in fake.servers.values() for state in gw.values())
    assert {h["state"] for h in journal()["hosts"].values()} == {"done"}
    assert journal()["order"] == [["lab-c"], ["lab-a", "lab-b"], ["lab-d", "lab-e"]]
    assert "order: lab-c | lab-a, lab-b | lab-d, lab-e" in printed


def test_a_batch_waits_for_the_one_before(here):
    fake = FakeRack()
    assert roll(fake, options={"batch": 2}) == 0
    ev = fake.events
    last = {h: max(i for i, e in enumerate(ev) if e[0] == h or e[1].endswith(f" {h}_0")) for h in fake.units}
    first = {h: min(i for i, e in enumerate(ev) if e[0] == h or e[1].endswith(f" {h}_0")) for h in fake.units}
    assert last["lab-a"] < first["lab-b"] and max(last["lab-b"], last["lab-c"]) < first["lab-d"]


def test_a_canary_failing_its_gate_stops_the_rollout_drained(here):
    fake, printed = FakeRack(), []
    fake.fail["lab-a"] = "completion_probe"
    assert roll(fake, printed) == 1
    assert fake.touched() == ["lab-a"]  # the rest untouched
    assert fake.timeline("lab-a") == LIFE[:LIFE.index("completion_probe") + 1]
    assert fake.servers["lab-gw"]["lab-a_0"] == fake.servers["lab-gw2"]["lab-a_0"] == "drain"
    assert states(printed, "lab-a") == ["draining", "deploying", "failed"]
    assert "completion_probe failed here" in fake.records["lab-a"]["why"] and fake.records["lab-a"]["state"] == "failed"
    assert {n: h["state"] for n, h in journal()["hosts"].items()} == {
        "lab-a": "failed", "lab-b": "pending", "lab-c": "pending", "lab-d": "pending", "lab-e": "pending"}
    assert any(line.startswith("rollout stopped: lab-a failed") for line in printed)


def test_resume_goes_on_from_the_failed_host_and_a_new_rollout_is_refused_meanwhile(here):
    fake = FakeRack()
    fake.fail["lab-b"] = "deploy"
    assert roll(fake) == 1
    assert fake.touched() == ["lab-a", "lab-b"]
    printed = []
    assert roll(fake, printed) == 2 and "an unfinished rollout is on file" in printed[0]
    del fake.fail["lab-b"]
    fake.events.clear()
    assert roll(fake, resume=True, options={"canary": "lab-e"}) == 0  # the file's order, not the new canary
    assert fake.touched() == ["lab-b", "lab-c", "lab-d", "lab-e"]
    assert all(fake.timeline(h) == LIFE for h in ("lab-b", "lab-c", "lab-d", "lab-e"))
    assert {h["state"] for h in journal()["hosts"].values()} == {"done"}
    assert roll(fake, resume=True) == 0 and roll(FakeRack()) == 0  # done: resuming does nothing, a new one starts


def test_max_fail_goes_on_past_a_failed_host_until_k(here):
    fake = FakeRack()
    fake.fail.update({"lab-b": "wait_healthy", "lab-d": "server_idle"})  # a gate, and a host that never goes idle
    assert roll(fake, options={"max_fail": 2}) == 1
    assert fake.touched() == ["lab-a", "lab-b", "lab-c", "lab-d"]
    assert "deploy" not in fake.timeline("lab-d")
    assert [journal()["hosts"][h]["state"] for h in fake.units] == ["done", "failed", "done", "failed", "pending"]
    fake = FakeRack()
    fake.fail["lab-a"] = "deploy"
    os.remove(".llamarack/rollout-inventory.json")
    assert roll(fake, options={"max_fail": 3}) == 1 and fake.touched() == ["lab-a"]  # a failed canary stops it


def test_a_slower_new_build_fails_its_gate(here):
    fake, printed = FakeRack(), []
    fake.new_bench["lab-a"] = {"key": {"build": "b2", "model": "m1"}, "pp512": {"tokens_per_second": 99.0},
                               "tg128": {"tokens_per_second": 10.0}}
    assert roll(fake, printed, options={"bench_fraction": 0.2}) == 1
    assert "llama-bench tg128 10.0 t/s is below 0.80 of the record's 20.0 t/s" in journal()["hosts"]["lab-a"]["why"]
    assert fake.servers["lab-gw"]["lab-a_0"] == "drain"


def test_bench_verdicts():
    new = {"key": {"build": "b2", "model": "m1"}, "pp512": {"tokens_per_second": 90.0},
           "tg128": {"tokens_per_second": 19.0}}
    assert rollout.bench_verdict(RECORD, RECORD, 0.1)[0] is None  # no new record: nothing compared
    assert rollout.bench_verdict(None, new, 0.1) == (None, "llama-bench measured {'build': 'b2', 'model': 'm1'}: "
                                                           "no record before it to compare with")
    assert rollout.bench_verdict(RECORD, new, 0.1) == (None, "pp512 90.0 t/s (was 100.0), tg128 19.0 t/s (was 20.0)")
    why, _ = rollout.bench_verdict(RECORD, new, 0.05)
    assert why == "llama-bench pp512 90.0 t/s is below 0.95 of the record's 100.0 t/s"
    why, _ = rollout.bench_verdict(RECORD, {"key": {"build": "b3"}}, 0.5)  # a record without figures
    assert "pp512 None t/s" in why and "tg128 None t/s" in why


def test_every_unit_of_a_multi_unit_host_is_drained_and_gated(here):
    fake = FakeRack()
    two = [{"index": i, "unit": f"llamarack-server@{i}.service", "port": 8080 + i, "url": f"http://127.0.0.1:{8080 + i}"}
           for i in range(2)]  # fmt: skip
    fake.units["lab-a"] = two
    for gw in fake.servers.values():
        gw.update({"lab-a_0": "ready", "lab-a_1": "ready"})
    assert roll(fake, options={"max_fail": 1}) == 0
    gateway = [what for where, what in fake.events if where == "lab-gw" and "lab-a_" in what]
    assert gateway == ["set drain lab-a_0", "set drain lab-a_1", "wait-empty lab-a_0", "wait-empty lab-a_1",
                       "set ready lab-a_0", "set ready lab-a_1", "wait-up lab-a_0", "wait-up lab-a_1"]
    assert [e[1] for e in fake.events if e[0] == "lab-a"].count("wait_healthy") == 4  # /health, then residency


def test_the_gate_checks_residency_after_the_completion_that_wakes_a_sleeping_unit(here):
    fake, gate = FakeRack(), []
    plain = fake.run

    def run(host, command, timeout):
        words = shlex.split(command)
        if host.name == "lab-a" and len(words) > 2 and SOURCES.get(words[2]) in ("wait_healthy", "completion_probe"):
            gate.append((SOURCES[words[2]], words[3:][-1] if SOURCES[words[2]] == "wait_healthy" else "-"))
        return plain(host, command, timeout)

    fake.run = run
    assert roll(fake) == 0
    # /health first (no residency), then the completion, then the cards: a unit asleep has woken
    assert gate == [("wait_healthy", ""), ("completion_probe", "-"), ("wait_healthy", "GPU-1 900")]


def test_the_gate_says_residency_was_checked_only_where_it_was(here):
    fake, printed = FakeRack(), []
    fake.cpu.add("lab-b")
    assert roll(fake, printed) == 0
    gated = {h: next(ln for ln in printed if f" {h}: gated" in ln) for h in ("lab-a", "lab-b")}
    assert "1 unit(s) healthy, on their cards, completing;" in gated["lab-a"], gated
    assert "1 unit(s) healthy, no residency to check (a CPU build), completing;" in gated["lab-b"], gated


def test_a_unit_the_gateway_does_not_know_fails_before_the_deploy(here):
    fake = FakeRack()
    del fake.servers["lab-gw2"]["lab-a_0"]
    assert roll(fake) == 1
    assert "deploy" not in fake.timeline("lab-a")
    assert "drain on the gateway: lab-gw2:" in journal()["hosts"]["lab-a"]["why"]
    assert "No such server" in journal()["hosts"]["lab-a"]["why"]


def test_an_unreachable_host_fails_untouched(here):
    fake = FakeRack()
    fake.unreachable.add("lab-a")
    assert roll(fake) == 1
    assert fake.events == [] and journal()["hosts"]["lab-a"]["why"] == "list its units: Could not connect"


def test_a_gateway_that_cannot_be_reached_fails_the_host_before_its_deploy(here):
    fake = FakeRack()
    fake.unreachable.add("lab-gw2")
    assert roll(fake) == 1
    assert journal()["hosts"]["lab-a"]["why"] == "drain on the gateway: lab-gw2: Could not connect"
    fake = FakeRack()
    fake.broken.add("lab-gw")
    os.remove(".llamarack/rollout-inventory.json")
    assert roll(fake) == 1 and "deploy" not in fake.timeline("lab-a")
    assert "lab-gw: RuntimeError('the connector broke')" in journal()["hosts"]["lab-a"]["why"]


def test_no_gateway_still_waits_idle_and_gates(here):
    # Another file: pyinfra keeps the code of an inventory file it has read, by its path.
    (here / "two.py").write_text(f'lab = [("lab-a", {DATA}), ("lab-b", {DATA})]\n')
    fake, printed = FakeRack(names=("lab-a", "lab-b")), []
    assert roll(fake, printed, inventory="two.py") == 0
    assert "no host in group gateways: nothing to drain" in printed[0]
    assert fake.timeline("lab-a") == [s for s in LIFE if not s.startswith("lab-gw")]


def test_refusals_touch_nothing(here):
    printed = []
    assert roll(FakeRack(), printed, options={"canary": "lab-gw"}) == 2
    assert "lab-gw is no serving host" in printed[0]
    assert roll(FakeRack(), printed, resume=True) == 2 and "no rollout on file" in printed[-1]
    assert roll(FakeRack(), printed, data=("nokey",)) == 2 and "not KEY=VALUE" in printed[-1]
    assert not (here / ".llamarack").exists()


def test_dry_prints_the_order_and_each_hosts_plan(here, monkeypatch):
    from roles import audit

    def audits(chosen, templates=(), verify=False):
        out = []
        for h in chosen:
            a = HostAudit(h.name, items={"build": Item({"stamp": "b1"}, {"stamp": "b2", "inputs_changed": ["commit"]},
                                                       drift=h.name == "lab-b")})  # fmt: skip
            out.append(a)
        return out

    monkeypatch.setattr(audit, "run", audits)
    fake, printed = FakeRack(), []
    assert roll(fake, printed, dry=True, options={"canary": "lab-b", "batch": 3}) == 0
    text = "\n".join(printed)
    assert "gateways: lab-gw, lab-gw2" in text
    assert "canary:\n  lab-b: 2 change(s)\n    rebuild   llama.cpp b2: commit changed" in text
    assert "    restart   llama-server: its unit names the new build or model\nbatch 1:" in text
    assert "batch 1:\n  lab-a: nothing changes" in text and "batch 2:\n  lab-e: nothing changes" in text
    assert fake.events == [] and not (here / ".llamarack").exists()
    assert "no stage (deploy.py is not llamarack's deploy (roles.deploy.main))" in text  # a deploy file of its own
    printed.clear()
    assert roll(fake, printed, dry=True, deploy=None) == 0
    assert printed[1] == ("stage: every host not done yet, all at once, none drained (roles.deploy.stage), then the "
                          "order below")  # fmt: skip
    assert fake.events == [] and not (here / ".llamarack").exists()


def test_the_deploy_is_pyinfra_limited_to_the_host(here, monkeypatch):
    bin_dir = here / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "pyinfra"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "arg: $a"; done\nexit 3\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    printed = []
    status, tail = rollout.Pyinfra("inventory.py", "deploy.py", ("llamacpp_commit=abc",), printed.append).deploy("lab-a")
    assert status == 3
    assert printed == tail == ["arg: -y", "arg: inventory.py", "arg: deploy.py", "arg: --limit", "arg: lab-a",
                               "arg: --data", "arg: llamacpp_commit=abc"]
    # the stage: its own deploy, with the same data; its lines marked with the host (all run at once)
    printed.clear()
    status, tail = rollout.Pyinfra("inventory.py", "deploy.py", ("llamacpp_commit=abc",), printed.append).deploy(
        "lab-a", rollout.STAGE)
    assert tail[2] == "arg: roles.deploy.stage" and tail[-1] == "arg: llamacpp_commit=abc"
    assert printed == [f"lab-a (stage) | {line}" for line in tail]


def test_the_audit_item_says_where_the_rollout_left_the_host():
    from types import SimpleNamespace

    from pyinfra.facts.files import FileContents

    from roles import rollout_audit
    from llamarack.facts import FactRead
    from roles.settings import load_settings

    settings = load_settings("lab-a", json.loads(DATA))
    path = "/opt/llamarack/state/rollout.json"
    assert rollout_audit.reads(settings) == (FactRead.of(FileContents, path=path),)

    def seen(lines):
        return SimpleNamespace(settings=settings, fact=lambda fact, path: lines)

    assert rollout_audit.items(seen(None))["rollout"].found is None
    assert not rollout_audit.items(seen(None))["rollout"].drift
    done = rollout_audit.items(seen(['{"state": "done", "why": null, "at": "t", "started": "s"}']))["rollout"]
    assert done.found == {"state": "done", "why": None, "at": "t", "started": "s"} and not done.drift
    failed = rollout_audit.items(seen(['{"state": "failed", "why": "a completion: 500"}']))["rollout"]
    assert failed.drift and failed.found["why"] == "a completion: 500"
    assert rollout_audit.items(seen(["{"]))["rollout"].found["state"] == "unreadable"


def test_bench_verdicts_unit_by_unit():
    def unit(name, tg, **more):
        return {"name": name, "pp512": {"tokens_per_second": 100.0}, "tg128": {"tokens_per_second": tg}, **more}

    before = {**RECORD, "units": [unit("u@0", 20.0), unit("u@1", 20.0, **{"as": "u@0"}), unit("u@2", 30.0)]}
    after = {"key": {"build": "b2", "model": "m1"}, "pp512": {"tokens_per_second": 100.0},
             "tg128": {"tokens_per_second": 20.0},
             "units": [unit("u@0", 20.0), unit("u@1", 20.0, **{"as": "u@0"}), unit("u@2", 12.0)]}  # fmt: skip
    why, compared = rollout.bench_verdict(before, after, 0.25)
    # unit 2 (a card of its own kind) got slower; the top level (unit 0's) would not have shown it
    assert why == "u@2: llama-bench tg128 12.0 t/s is below 0.75 of the record's 30.0 t/s"
    assert compared == ("u@0: pp512 100.0 t/s (was 100.0), u@0: tg128 20.0 t/s (was 20.0), "
                        "u@2: pp512 100.0 t/s (was 100.0), u@2: tg128 12.0 t/s (was 30.0)")  # fmt: skip
    # a record before units were listed: its one figure stands for every unit
    why, compared = rollout.bench_verdict(RECORD, after, 0.25)
    assert why == "u@2: llama-bench tg128 12.0 t/s is below 0.75 of the record's 20.0 t/s"
    assert compared.count("tg128") == 2 and compared.count("(was 20.0)") == 2
    # a unit the record before did not have: nothing to compare it with
    new_unit = {**after, "units": [unit("u@5", 1.0)]}
    assert rollout.bench_verdict(before, new_unit, 0.25) == (None, "the record before has no figures")


def test_a_failed_deploy_is_named_by_its_commands_errors_not_pyinfras_last_lines():
    tail = ["[gpu02] Setting up nvidia-kernel-dkms (550.144.03-1) ...",
            "[gpu02] Error! Bad return status for module build on kernel: 6.1.0-28-amd64 (x86_64)",
            "[gpu02] Consult /var/lib/dkms/nvidia-current/550.144.03/build/make.log for more information.",
            "[gpu02] dpkg: error processing package nvidia-kernel-dkms (--configure):",
            "[gpu02] E: Sub-process /usr/bin/dpkg returned an error code (1)",
            "[gpu02] Error: executed 0 commands", "", "--> Disconnecting from hosts...",
            "--> pyinfra error: No hosts remaining!"]  # fmt: skip
    why = rollout.deploy_errors(tail)
    assert why[0].endswith("Error! Bad return status for module build on kernel: 6.1.0-28-amd64 (x86_64)"), why
    assert why[-1].endswith("E: Sub-process /usr/bin/dpkg returned an error code (1)") and len(why) == 2
    # no error line: the output's last lines, as before
    assert rollout.deploy_errors(["a", "b", "c", "d"]) == ["b", "c", "d"]


def test_the_gate_fails_a_unit_whose_process_serves_another_model_than_its_file(here):
    """A deploy that switched the unit's files without restarting it: /health and a completion
    still pass, the process's /props does not, and the host stays drained."""
    fake = FakeRack()
    fake.served["lab-a"] = "/opt/llamarack/models/m0/model.gguf"
    assert roll(fake) == 1
    why = journal()["hosts"]["lab-a"]["why"]
    assert why == ("llamarack-server.service: the process serves /opt/llamarack/models/m0/model.gguf, not the unit's "
                   "/opt/llamarack/models/m1/model.gguf: it was not restarted since its unit changed"), why
    assert fake.servers["lab-gw"]["lab-a_0"] == "drain" and fake.touched() == ["lab-a"]


STAGED = ["staging", "staged", "draining", "deploying", "gated", "done"]


def test_llamaracks_deploy_stages_every_host_before_any_is_drained(here):
    fake, printed = FakeRack(), []
    assert roll(fake, printed, deploy=None) == 0
    stages = [i for i, e in enumerate(fake.events) if e[1] == "stage"]
    drains = [i for i, e in enumerate(fake.events) if e[1].startswith("set drain")]
    assert sorted(fake.events[i][0] for i in stages) == sorted(fake.units)  # each host staged once
    assert max(stages) < min(drains)  # all of them before the first drain
    assert [e[0] for e in fake.events if e[1] == "deploy"] == list(fake.units)  # then rolled as before
    for host in fake.units:
        assert states(printed, host) == STAGED and fake.timeline(host) == ["stage", *LIFE]
    hosts_ = journal()["hosts"]
    assert all(h["staged"] and isinstance(h["drained_s"], int) and h["drained_s"] >= 0 for h in hosts_.values())
    assert printed[-1].startswith("rollout done (drained: lab-a ")


def test_a_host_that_fails_its_stage_is_never_drained_and_the_others_go_on(here):
    fake, printed = FakeRack(), []
    fake.fail["lab-c"] = "stage"
    assert roll(fake, printed, deploy=None, options={"max_fail": 2}) == 1
    assert states(printed, "lab-c") == ["staging", "failed"]
    assert not any(e[1].endswith(" lab-c_0") for e in fake.events)  # never drained on a gateway
    assert "deploy" not in fake.timeline("lab-c")
    assert fake.records["lab-c"]["why"].startswith("its stage exited 1, nothing drained: [x]  Error: the build failed")
    assert all(states(printed, h) == STAGED for h in fake.units if h != "lab-c")
    assert printed[-1].startswith("rollout done: lab-c failed to stage (serving on, not drained)")


def test_a_canary_that_fails_its_stage_stops_the_rollout_with_nothing_drained(here):
    fake, printed = FakeRack(), []
    fake.fail["lab-a"] = "stage"
    assert roll(fake, printed, deploy=None) == 1
    assert [e for e in fake.events if e[1] == "deploy" or e[1].startswith("set ")] == []  # nothing drained, nothing deployed
    assert fake.servers["lab-gw"]["lab-a_0"] == "ready"
    assert printed[-1].startswith("rollout stopped: lab-a failed to stage (serving on, not drained); untouched: "
                                  "lab-b, lab-c, lab-d, lab-e")  # fmt: skip
    # --resume stages again only the host whose stage failed, then rolls every host
    fake.fail.clear()
    fake.events.clear()
    assert roll(fake, printed, deploy=None, resume=True) == 0
    assert [e[0] for e in fake.events if e[1] == "stage"] == ["lab-a"]
    assert [e[0] for e in fake.events if e[1] == "deploy"] == list(fake.units)


def test_another_deploy_is_not_staged_and_no_stage_turns_it_off(here):
    for deploy, options, why in (("deploy.py", {}, "deploy.py is not llamarack's deploy (roles.deploy.main)"),
                                 (None, {"stage": False}, "--no-stage")):
        fake, printed = FakeRack(), []
        assert roll(fake, printed, deploy=deploy, options=options) == 0
        assert not any(e[1] == "stage" for e in fake.events)
        assert f"no stage ({why}): each host makes its change inside its drained window" in printed
        os.unlink(".llamarack/rollout-inventory.json")


def test_the_stages_runs_share_one_builds_directory_and_the_switches_do_not(monkeypatch):
    """One pyinfra per host in the stage: they make each build once through a directory of
    this command's (roles/llamacpp/ship.py); a switch's run makes nothing, and gets none."""
    import roles.rollout as rollout_mod

    seen = []

    class Proc:
        stdout = iter(["ok\n"])

        def __init__(self, args, env, **kwargs):
            seen.append(env.get(rollout_mod.SHIP_DIR_ENV))

        def wait(self):
            return 0

    monkeypatch.setattr(rollout_mod.subprocess, "Popen", Proc)
    boundary = rollout_mod.Pyinfra("inventory/lab.py", "deploy.py", (), echo=lambda line: None)
    for name in ("a", "b"):
        boundary.deploy(name, rollout_mod.STAGE)
    boundary.deploy("a")
    assert seen[0] and seen[0] == seen[1] and seen[2] is None
    assert oct(os.stat(seen[0]).st_mode & 0o777) == "0o700"
