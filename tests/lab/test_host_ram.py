"""The host's memory, on a lab host of eight cards whose memory is capped.

lab-v100-a's cards are swapped for an 8x V100 SXM2 16GB box (``lab_rack.reseat``) and its
memory capped (``lab_rack.cap_memory``: a memory cgroup whose limit the kernel's OOM killer
holds the host to, and which lxcfs shows as the host's MemTotal). The lab builds llama.cpp
for the CPU, so every unit keeps its weights, KV cache and compute buffer in host RAM (the
ledger counts them so), beside its prompt cache: 8 units of llama.cpp's default 8,192 MiB
of prompt cache each are far more than the cap.

1. Capped at ``CAP``: the units are planned with ``--cache-ram`` lowered, the deploy and the
   audit say so and show each unit's share; every unit is sent distinct prompts until its
   prompt cache is full, and each process's resident memory stays within its share.
2. Capped at ``SMALL``: the host is refused with the ledger (MemTotal, each unit's share,
   what the units may have, the fix); the units in place are not touched.
3. Shown once: the same host at ``CAP`` with the units as llamarack wrote them before it
   planned the host's memory (no ``--cache-ram``: llama.cpp's default 8,192 MiB) gets a
   server OOM-killed by the same prompts.

The tests run in order, each from the state the one before left.
"""

import json
import random
import re
import shlex
import time
import urllib.request

import pytest

from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-a"
UNITS = "/etc/systemd/system"
# The host's memory for the units: what the deploy's own commands and the guest's services take
# after the cap (the processes started before it stay charged outside it) is the reserve's.
RESERVE = "server_host_ram_reserve_mib=256"
FLOOR = "server_cache_ram_min=16"
DATA = (RESERVE, FLOOR)
CAP = 1024  # MiB: 768 for the units, 8 x 36 MiB of their own, so about 60 MiB of prompt cache each
SMALL = 600  # MiB: 344 for the units, less than 8 x 52 (their own and the 16 MiB floor)
PROMPT = 1900  # tokens: a prompt state of the tiny Llama (1 KiB per token, f16) is 1.9 MiB


def units(lab_rack) -> dict:
    """{unit name: its file} on the host."""
    names = deploying.sh(lab_rack, HOST, f"cd {UNITS} && ls llamarack-server*.service 2>/dev/null || true").split()
    return {n: deploying.sh(lab_rack, HOST, f"cat {shlex.quote(f'{UNITS}/{n}')}") for n in names}


def cache_ram(unit: str):
    """The ``--cache-ram`` of a unit's ExecStart, or None without one."""
    m = re.search(r"^ExecStart=.* --cache-ram (-?\d+) ", unit, re.M)
    return int(m.group(1)) if m else None


def processes(lab_rack) -> dict:
    """{unit: (VmRSS MiB, NRestarts)} of the host's llama-server units."""
    out = deploying.sh(lab_rack, HOST, "for u in $(cd /etc/systemd/system && ls llamarack-server@*.service); do "
                       "pid=$(systemctl show -p MainPID --value $u); "
                       "echo $u $(awk '/^VmRSS:/{print $2}' /proc/$pid/status 2>/dev/null || echo 0) "
                       "$(systemctl show -p NRestarts --value $u); done")  # fmt: skip
    return {u: (int(rss) / 1024, int(restarts)) for u, rss, restarts in (line.split() for line in out.splitlines())}


def prompt(lab_rack, port: int, seed: int) -> int:
    """One completion of ``PROMPT`` distinct tokens (the tiny Llama's 1,000); its HTTP status."""
    ip = lab_rack.rack.host(HOST)["ip"]
    rnd = random.Random(seed)
    body = {"prompt": [rnd.randrange(3, 999) for _ in range(PROMPT)], "n_predict": 1}
    request = urllib.request.Request(f"http://{ip}:{port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except OSError:  # a server killed under the prompt (test 3) answers nothing
        return 0


def flood(lab_rack, rounds: int, until=None) -> int:
    """``rounds`` distinct prompts to each of the 8 units in turn (each new prompt puts the one
    before in its prompt cache); stops early when ``until()`` holds. The rounds sent."""
    for r in range(rounds):
        for n in range(8):
            prompt(lab_rack, 8080 + n, 1000 * r + n)
        if until and until():
            return r + 1
    return rounds


def mem_total(lab_rack) -> int:
    """The host's MemTotal, MiB, as it sees it."""
    return int(deploying.sh(lab_rack, HOST, "awk '/^MemTotal:/{print $2}' /proc/meminfo")) // 1024


@pytest.fixture(scope="module", autouse=True)
def eight_cards_then_restored(lab_rack):
    profile = lab_rack.rack.host(HOST)["profile"]
    lab_rack.reseat(HOST, "v100-sxm2-16gb-x8")
    rc, out = deploying.deploy(lab_rack, HOST, *DATA)
    assert rc == 0, out[-6000:]
    yield
    lab_rack.cap_memory(HOST, None)
    lab_rack.reseat(HOST, profile)
    deploying.deploy(lab_rack, HOST)


def test_a_capped_host_gets_its_prompt_caches_lowered_and_its_servers_stay_within_their_shares(lab_rack):
    lab_rack.cap_memory(HOST, CAP)
    assert mem_total(lab_rack) == CAP, "the host does not see its cap: is lxcfs's meminfo bound (lab up again)?"
    rc, out = deploying.deploy(lab_rack, HOST, *DATA)
    assert rc == 0, out[-6000:]
    found = units(lab_rack)
    assert sorted(found) == [f"llamarack-server@{n}.service" for n in range(8)]
    lowered = {cache_ram(u) for u in found.values()}
    assert len(lowered) == 1 and 16 <= next(iter(lowered)) < 8192, lowered
    assert f"host memory: --cache-ram {next(iter(lowered))}, lowered from 8192" in out, out[-6000:]
    items = deploying.audit_json(HOST, "--data", RESERVE, "--data", FLOOR)["items"]
    host = items["units"]["wanted"]["host_ram"]
    assert host["mem_total_mib"] == CAP and host["lowered"] and host["cache_ram"] in lowered, host
    assert host["total_mib"] <= CAP - 256, host
    shares = {f"llamarack-server@{n}.service": items[f"unit@{n}"]["wanted"]["host_ram"] for n in range(8)}
    assert not any(items[f"unit@{n}"].get("drift") for n in range(8)), items
    # every prompt cache filled: 60 MiB of 1.9 MiB states, and some
    flood(lab_rack, rounds=int(host["cache_ram"] / 1.9) + 4)
    seen = processes(lab_rack)
    for unit, (rss, restarts) in seen.items():
        assert restarts == 0, seen
        assert 0 < rss <= shares[unit]["total_mib"], (unit, rss, shares[unit])
    print(f"VmRSS of each unit after its prompt cache filled (MiB): {seen}; its share: {shares}")


def test_a_host_capped_smaller_is_refused_with_the_ledger_and_its_units_are_not_touched(lab_rack):
    before = units(lab_rack)
    deploying.sh(lab_rack, HOST, "systemctl restart 'llamarack-server@*.service'")  # their caches go: the cap can drop
    lab_rack.cap_memory(HOST, SMALL)
    assert mem_total(lab_rack) == SMALL
    rc, out = deploying.deploy(lab_rack, HOST, *DATA)
    assert rc != 0, out[-6000:]
    said = re.search(rf"{HOST}: host-memory: found MemTotal {SMALL} MiB; 8 units at --cache-ram 16, "
                     r"server_cache_ram_min take [\d,]+ MiB: (.*?); needed at most 344 MiB for the units: "
                     r"MemTotal less server_host_ram_reserve_mib 256\. Fix: fewer units", out)  # fmt: skip
    assert said, out[-6000:]
    assert "llamarack-server@0.service" in said.group(1) and "llamarack-server@7.service" in said.group(1)
    assert "prompt cache 16" in said.group(1), said.group(1)
    assert units(lab_rack) == before
    why = deploying.audit_json(HOST, "--data", RESERVE, "--data", FLOOR)["items"]["units"]["wanted"]["why"]
    assert "host-memory" in why, why


def test_shown_once_a_host_left_to_llama_cpps_default_prompt_cache_is_oom_killed(lab_rack):
    lab_rack.cap_memory(HOST, CAP)
    planned = units(lab_rack)
    # the units as written before the host's memory was planned: no --cache-ram (8,192 MiB each)
    deploying.sh(lab_rack, HOST, f"sed -i -E 's/ --cache-ram -?[0-9]+//' {UNITS}/llamarack-server@*.service && "
                 "systemctl daemon-reload && systemctl restart 'llamarack-server@*.service'")  # fmt: skip
    assert all(cache_ram(u) is None for u in units(lab_rack).values())
    since = deploying.sh(lab_rack, HOST, "date +%s")
    start = time.monotonic()

    def killed() -> bool:
        return any(restarts for _, restarts in processes(lab_rack).values())

    rounds = flood(lab_rack, rounds=200, until=killed)
    journal = deploying.sh(lab_rack, HOST, f"journalctl --since {shlex.quote('@' + since)} "
                           "-u 'llamarack-server@*' --no-pager")  # fmt: skip
    assert "status=9/KILL" in journal, journal[-3000:]
    print(f"OOM-killed after {rounds} rounds of 8 prompts ({time.monotonic() - start:.0f} s): "
          + "; ".join(line for line in journal.splitlines() if "status=9/KILL" in line))
    # the deploy writes the planned units back: the same prompts then kill nothing
    rc, out = deploying.deploy(lab_rack, HOST, *DATA)
    assert rc == 0 and units(lab_rack) == planned, out[-6000:]
    flood(lab_rack, rounds=rounds + 4)
    assert not killed(), processes(lab_rack)
