"""The fault bench's evidence and verdicts (bench/reliability_report.py, bench/reliability.py),
without the lab: the parsers on real output, the classification fired / survived / not fired,
each fault's evidence on what a run that hit and one that missed would leave, and the command
line recorded.

The deploy lines below are lines of a lab run's output (bench/reliability.py on the lab rack,
the failed runs' logs); the iptables listing is what iptables 1.8.9 (nf_tables) printed for
the lab's refusing rule after it turned away three connections.
"""

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llamarack_lab import faults

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # reliability.py imports it by this name; its dataclasses need it
    spec.loader.exec_module(module)
    return module


report = _load("reliability_report")
bench = _load("reliability")

# Lines of the lab's deploy output.
FETCHER_REFUSED_EARLY = ("[lab-v100-a] model_fetch: error: not enough disk under /opt/llamarack/models/.staging/"
                         "e28933c0ba4866f5/hf: 3644442 bytes to fetch plus 1073741824 kept free, 5234688 free")
HUB_CUT = ("[lab-v100-a] model_fetch: error: model.safetensors: download failed after 2 attempt(s): connection "
           "closed after 0 of 2388072 bytes; 1000000 bytes kept in /opt/llamarack/models/.staging/"
           "e28933c0ba4866f5/hf/model.safetensors.partial for the next run")
WRONG_SHA = ("[lab-v100-a] model_fetch: error: model.safetensors: sha256 mismatch: expected 960de0cbff99b8e97017e1c8"
             "0cdbcf5ae0f138c07c34b56f55fd7f35948b37c7, got 407fb015142834ee8a8f8bed8fcaf5ec0e3af160f6d05d599747590e"
             "d1497c06 (3388072 bytes, expected 3388072); the download was deleted and nothing was moved into place.")
QUANTIZE_KILLED = ("[lab-v100-a] [ 3/ 21] token_embd.weight - [ 256, 1000, 1, 1], type = f32, "
                   "converting to q4_K .. Killed")
ROLLED_BACK = "[lab-v100-a] rolled back: the previous unit is serving again"
DRIVER_REFUSED = ("[lab-v100-a] lab-v100-a: driver-reboot-needed: found NVML library 550.144 but loaded kernel "
                  "module 550.127.05 (Driver/library version mismatch)")
BROKEN_BUILD = "[lab-v100-a] 559 | #error broken on purpose by the lab tests"
STARTED_MODEL = ("[lab-v100-a] model e28933c0ba4866f5: fetch, convert, quantize: 6 file(s), 0.00 GB; follow each "
                 "step with: tail -f /opt/llamarack/models/.staging/e28933c0ba4866f5/fetch.log")
TOTAL = "    Grand total      17      2      -     15"
IPTABLES = """Chain INPUT (policy ACCEPT 0 packets, 0 bytes)
    pkts      bytes target     prot opt in     out     source               destination         
       3      180 REJECT     6    --  *      *       0.0.0.0/0            0.0.0.0/0            tcp dpt:22 reject-with tcp-reset
"""  # noqa: W291 (iptables pads its header)
HUB_SIZE = 3388072


def ctx(**seen):
    return bench.Ctx(rack=None, seen=seen)


def held(proofs) -> list:
    return [p["held"] for p in proofs]


def fault(name):
    return next(f for f in bench.FAULTS if f.name == name)


# --- parsers ------------------------------------------------------------------------


def test_key_values_reads_what_the_host_side_commands_print():
    text = "converting=2\nkilled=1\nfree_bytes= 65536\nboot=0f1e-4412\nnot a pair\nSome=thing\n"
    assert report.key_values(text) == {"converting": 2, "killed": 1, "free_bytes": 65536, "boot": "0f1e-4412"}


def test_rejected_packets_counts_the_refusing_rule():
    assert report.rejected_packets(IPTABLES) == 3
    assert report.rejected_packets(IPTABLES.replace("       3      180 REJECT", "       0        0 REJECT")) == 0
    assert report.rejected_packets(IPTABLES.replace("dpt:22", "dpt:8080")) is None  # no rule for SSH
    assert report.rejected_packets("") is None


def test_driver_versions_from_the_labs_words():
    assert report.driver_versions("lab-v100-a: package 550.144.03, loaded module 550.127.05") == ("550.144.03",
                                                                                                  "550.127.05")
    assert report.driver_versions("lab-v100-a: package not installed, loaded module none") == (None, None)
    assert report.driver_versions(None) == (None, None)


def test_line_proof_shows_the_matching_line_or_says_none_matched():
    out = "\n".join([STARTED_MODEL, HUB_CUT, TOTAL])
    got = report.line_proof("the fetcher saw the cut", out, r"download failed after \d+ attempt")
    assert got["held"] is True and got["seen"].startswith("[lab-v100-a] model_fetch: error: model.safetensors: download")
    missed = report.line_proof("the convert step hit ENOSPC", out, r"No space left on device")
    assert missed == {"check": "the convert step hit ENOSPC", "held": False,
                      "seen": "no line matches 'No space left on device'"}


def test_count_proof_needs_a_measured_count():
    assert report.count_proof("x", 2)["held"] is True
    assert report.count_proof("x", 0)["held"] is False
    assert report.count_proof("x", None) == {"check": "x", "held": False, "seen": None}


# --- verdicts -----------------------------------------------------------------------


def result(evidence, nothing_lost=True, served=True, **more):
    return {"fault": "f", "evidence": evidence, "nothing_lost": nothing_lost, "served_throughout": served, **more}


YES, NO = {"check": "a", "held": True, "seen": 1}, {"check": "b", "held": False, "seen": None}


@pytest.mark.parametrize("res, outcome", [
    (result([YES, YES]), "survived"),
    (result([YES], served=False), "not survived"),
    (result([YES], nothing_lost=False), "not survived"),
    (result([]), "not fired"),  # nothing lost and served throughout: still not survived
    (result([YES, NO]), "not fired"),
    (result(None), "not fired"),
    ({"fault": "f", "error": "RuntimeError: cannot mount"}, "not fired"),
])  # fmt: skip
def test_a_fault_survives_only_when_it_fired(res, outcome):
    judged = report.judge(res)
    assert judged["outcome"] == outcome
    assert judged["survived"] is (outcome == "survived")
    assert judged["fired"] is (outcome != "not fired")


def test_summary_counts_a_fault_that_did_not_fire_as_not_survived_and_not_kept():
    results = [report.judge(dict(result([YES]), fault="a")), report.judge(dict(result([]), fault="b")),
               report.judge(dict(result([YES], served=False), fault="c"))]  # fmt: skip
    assert report.summary(results, ["a", "b", "c", "d"]) == {
        "fired": "2 of 3", "survived": "1 of 3", "nothing_lost": "2 of 3", "served_throughout": "1 of 3",
        "host_served_throughout": "0 of 3", "not_fired": ["b"], "not_survived": ["c"], "lost_something": [],
        "not_run": ["d"],
    }  # fmt: skip


def test_the_rack_can_serve_throughout_where_the_host_itself_did_not():
    # A unit switch on the host: its own /health failed 12 times over 3 s, the gateway's never.
    gap = {"requests": 90, "failures": 12, "longest_outage_s": 3.0}
    res = report.judge(result([YES], fault="health-fails", what="w", failed_run={"rc": 1, "seconds": 2.0},
                              during={"requests": 90, "failures": 0, "longest_outage_s": 0.0}, during_host=gap,
                              gateway={"sent": 50, "retried": 3, "redispatched": 3, "taken_down": 1},
                              host_served_throughout=False, serving_after=True, rerun={"rc": 0, "seconds": 2.0},
                              changed_outside_staging=[], changed_by_the_faults_own_step=[],
                              converged={"rc": 0, "changes": 0, "state_unchanged": True}))  # fmt: skip
    assert res["outcome"] == "survived"
    doc = {"faults": [res], "machine": {"cpu": "c", "cores": 2, "date": "2026-01-01"}, "total_s": 1.0,
           "command": "python3 bench/reliability.py", "provenance": {"commit": "0123456789abcdef", "tree": "clean"}}
    text = report.table(doc)
    assert ("| throughout (the host itself: 12 of 90 /health failed (3.0 s); the gateway sent it 50, moved 3 to "
            "another host, took it out of service 1 time(s)); after: yes |") in text
    assert "served throughout 1 of 1 (the host itself 0 of 1)" in text


def test_the_table_judges_a_results_file_without_evidence_as_not_fired():
    old = json.loads((ROOT / "bench/results/reliability.json").read_text())
    for r in old["faults"]:
        r.pop("evidence", None)
    text = report.table(old)
    assert text.count("| **not fired** |") == len(old["faults"])
    assert f"\n0 of {len(old['faults'])} fired; 0 of {len(old['faults'])} survived" in text


# --- each fault's evidence: a run that hit, and one that missed --------------------


def test_disk_full_fires_only_when_the_convert_hit_enospc_after_the_fetch():
    evidence = fault("disk-full").evidence
    # As the fault was first written: the fetcher refused before a byte; nothing was seen on the host.
    assert report.fired(evidence(ctx(), None, 1, "\n".join([STARTED_MODEL, FETCHER_REFUSED_EARLY]))) is False
    convert_failed = "[lab-v100-a] OSError: [Errno 28] No space left on device"
    hit = evidence(ctx(fetched=1, remounted=1, free_bytes=65536), None, 1, "\n".join([STARTED_MODEL, convert_failed]))
    assert held(hit) == [True, True, True]
    # the staging shrank but the fetch had not finished: not the convert's ENOSPC
    assert held(evidence(ctx(fetched=0, remounted=1, free_bytes=65536), None, 1, convert_failed)) == [False, True, True]
    assert held(evidence(ctx(fetched=1, remounted=1, free_bytes=2 << 30), None, 1, convert_failed)) == [True, False, True]
    # the converter's own words for it, from a run in the lab: gguf-py's short write
    short_write = "[lab-v100-a] OSError: 256000 requested and 9608 written"
    hit = evidence(ctx(fetched=1, remounted=1, free_bytes=65536), None, 1, "\n".join([STARTED_MODEL, short_write]))
    assert held(hit) == [True, True, True]


def test_hub_cut_fires_only_when_the_hub_cut_what_it_sent():
    evidence = fault("hub-cut").evidence
    assert held(evidence(ctx(hub_sent=[1_000_000, 0], hub_size=HUB_SIZE), None, 1, HUB_CUT)) == [True, True]
    # the blob cache held the file: the hub was never asked
    assert held(evidence(ctx(hub_sent=[], hub_size=HUB_SIZE), None, 0, TOTAL)) == [False, False]
    assert held(evidence(ctx(hub_sent=[HUB_SIZE], hub_size=HUB_SIZE), None, 1, HUB_CUT)) == [False, True]


def test_hub_wrong_sha_fires_only_when_the_wrong_bytes_went_out_whole():
    evidence = fault("hub-wrong-sha").evidence
    assert held(evidence(ctx(hub_sent=[HUB_SIZE], hub_size=HUB_SIZE), None, 1, WRONG_SHA)) == [True, True]
    assert held(evidence(ctx(hub_sent=[], hub_size=HUB_SIZE), None, 0, TOTAL)) == [False, False]


def test_ssh_cut_needs_the_converter_running_and_a_session_killed():
    evidence = fault("ssh-cut").evidence
    assert held(evidence(ctx(converting=2, killed=1), None, 1, STARTED_MODEL)) == [True, True]
    assert held(evidence(ctx(converting=0, killed=1), None, 1, STARTED_MODEL)) == [False, True]  # too late
    assert held(evidence(ctx(), None, 1, STARTED_MODEL)) == [False, False]  # never hit


def test_the_other_faults_on_a_hit_and_a_miss():
    cases = {  # fault: (seen, rc, output) that hit; (seen, rc, output) that missed
        "quantize-fails": (({"quantize_killed": 1}, 1, QUANTIZE_KILLED), ({"quantize_killed": 0}, 1, TOTAL)),
        "truncated-state": (({"size": 7}, 0, TOTAL), ({"size": 2048}, 0, TOTAL)),
        "sigkill-at-switch": (({"at_switch": 1}, -9, TOTAL), ({}, 0, TOTAL)),
        "health-fails": (({}, 1, ROLLED_BACK), ({}, 0, TOTAL)),
        "host-unreachable": (({"rejected": 3}, 1, TOTAL), ({"rejected": 0}, 1, TOTAL)),
        "driver-mismatch": (({"driver": "lab-v100-a: package 550.144.03, loaded module 550.127.05"}, 1, DRIVER_REFUSED),
                            ({"driver": "lab-v100-a: package 550.127.05, loaded module 550.127.05"}, 0, TOTAL)),
        "build-fails": (({}, 1, BROKEN_BUILD), ({}, 1, TOTAL)),
    }  # fmt: skip
    for name, ((seen, rc, out), (seen2, rc2, out2)) in cases.items():
        assert report.fired(fault(name).evidence(ctx(**seen), None, rc, out)), name
        assert not report.fired(fault(name).evidence(ctx(**seen2), None, rc2, out2)), name


def test_every_fault_has_evidence():
    assert all(f.evidence is not None for f in bench.FAULTS)


# --- the SSH cut, as it runs on a host ----------------------------------------------


def test_the_cut_kills_every_other_session_and_spares_its_own(tmp_path):
    """``faults.CUT_SSH`` against processes named as sshd names its sessions (under another
    name, so that no real session of this machine matches): the two others die, the one whose
    shell runs the cut goes on, and it says how many it killed."""
    cut = tmp_path / "cut.sh"
    cut.write_text(faults.CUT_SSH.replace("'^sshd: ", "'^llamarack-test-sshd: "))
    name = "llamarack-test-sshd: root@notty"
    others = [subprocess.Popen(["bash", "-c", f"exec -a '{name}' sleep 60"]) for _ in range(2)]
    time.sleep(0.3)
    own = subprocess.run(["bash", "-c", f"exec -a '{name}' bash -c 'sh {cut}; echo own session goes on'"],
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert own.stdout.split("\n")[:2] == ["killed=2", "own session goes on"]
    assert [p.wait(timeout=10) for p in others] == [-9, -9]


# --- the command that ran -----------------------------------------------------------


def test_the_command_is_the_one_that_ran():
    own = ["python3", "bench/reliability.py", "--reuse", "--only", "disk-full"]
    flock = ["flock", "/tmp/llamarack-lab.lock", *own]
    assert report.command_line(own, flock) == ("flock /tmp/llamarack-lab.lock python3 bench/reliability.py "
                                               "--reuse --only disk-full")
    assert report.command_line(own, ["-bash"]) == "python3 bench/reliability.py --reuse --only disk-full"
    assert report.command_line(own, ["/usr/bin/flock", "/tmp/x.lock", "python3", "other.py"]) == (
        "python3 bench/reliability.py --reuse --only disk-full")
    assert report.command_line(["python3", "bench/reliability.py", "--out", "/tmp/a b.json"], []) == (
        "python3 bench/reliability.py --out '/tmp/a b.json'")


def test_this_process_command_line_is_read_from_proc():
    assert report.cmdline() == [w for w in Path("/proc/self/cmdline").read_bytes().decode().split("\0") if w]
    assert "pytest" in report.this_command()


def test_the_table_says_when_the_converged_run_changed_the_hosts_state():
    res = report.judge(result([YES], fault="ssh-cut", what="w", failed_run={"rc": 1, "seconds": 2.0},
                              during={"requests": 9, "failures": 0, "longest_outage_s": 0.0}, serving_after=True,
                              rerun={"rc": 0, "seconds": 2.0}, changed_outside_staging=[],
                              changed_by_the_faults_own_step=[],
                              converged={"rc": 0, "changes": 0, "state_unchanged": False}))  # fmt: skip
    doc = {"faults": [res], "machine": {"cpu": "c", "cores": 2, "date": "2026-01-01", "commit": "abc"},
           "total_s": 1.0, "command": "python3 bench/reliability.py --reuse"}  # fmt: skip
    row = report.table(doc).splitlines()[2]
    assert "rc 0 (2.0 s), then 0 changes, **the host's state changed**" in row
    assert report.table(doc).endswith("1 s in all; `python3 bench/reliability.py --reuse`")


def test_the_table_names_the_commit_of_the_results_stamp():
    res = report.judge(result([YES], fault="ssh-cut", what="w", failed_run={"rc": 1, "seconds": 2.0},
                              during={"requests": 9, "failures": 0, "longest_outage_s": 0.0}, serving_after=True,
                              rerun={"rc": 0, "seconds": 2.0}, changed_outside_staging=[],
                              changed_by_the_faults_own_step=[], converged={"rc": 0, "changes": 0}))  # fmt: skip
    doc = {"faults": [res], "machine": {"cpu": "c", "cores": 2, "date": "2026-01-01"}, "total_s": 1.0,
           "command": "python3 bench/reliability.py", "provenance": {"commit": "0123456789abcdef", "tree": "clean"}}
    assert ", commit 0123456789, 1 s in all" in report.table(doc)
    doc["provenance"]["tree"] = "dirty"
    assert ", commit 0123456789+dirty, 1 s in all" in report.table(doc)
