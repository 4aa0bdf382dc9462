"""The fault bench's judgement and its report, apart from the lab (``bench/reliability.py``).

A fault counts only where it shows that it acted: each fault's evidence is a
list of proofs, each a check, whether it held, and what was seen (a line of
the failed run's output, a counter of the lab's hub or firewall, a file's
size, an exit status, a process that ran when the fault hit, a new boot).
A fault whose proofs do not all hold did not fire: it is reported as "not
fired", never as survived, whatever its run did.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from typing import Optional

SCHEMA = "llamarack-reliability/2"


# --- proofs -------------------------------------------------------------------------


def proof(check: str, held, seen) -> dict:
    """One piece of evidence: what was checked, whether it held, what was seen."""
    return {"check": check, "held": bool(held), "seen": seen}


def first_line(output: str, pattern: str) -> Optional[str]:
    """The first line of ``output`` that ``pattern`` matches (spaces squeezed, cut at 300), or None."""
    rx = re.compile(pattern)
    return next((" ".join(x.split())[:300] for x in output.splitlines() if rx.search(x)), None)


def line_proof(check: str, output: str, pattern: str) -> dict:
    """Held when a line of the failed run's ``output`` matches ``pattern``; the line is what was seen."""
    line = first_line(output, pattern)
    return proof(check, line is not None, line if line is not None else f"no line matches {pattern!r}")


def count_proof(check: str, value, least: int = 1) -> dict:
    """Held when ``value`` (a count; None: never measured) is at least ``least``."""
    return proof(check, value is not None and value >= least, value)


def key_values(text: str) -> dict:
    """``key=value`` lines (what the bench's host-side commands print) as a dict; an integer
    value as an int."""
    out = {}
    for line in text.splitlines():
        key, eq, value = line.strip().partition("=")
        value = value.strip()
        if eq and re.fullmatch(r"[a-z_]+", key):
            out[key] = int(value) if re.fullmatch(r"-?\d+", value) else value
    return out


def driver_versions(note: str) -> tuple:
    """(package, loaded module) versions from ``llamarack_lab.driver.set_driver``'s words; None
    for one that is not a version (not installed, none)."""
    m = re.search(r"package (.+?), loaded module (\S+)", note or "")
    return tuple(v if m and re.fullmatch(r"\d[\d.]*", v) else None for v in (m.groups() if m else ("", "")))


def rejected_packets(listing: str) -> Optional[int]:
    """Packets the REJECT rule for port 22 turned away, from ``iptables -L INPUT -v -n -x``;
    None when the listing has no such rule."""
    counts = [int(x.split()[0]) for x in listing.splitlines()
              if "dpt:22" in x and len(x.split()) > 2 and x.split()[2] == "REJECT" and x.split()[0].isdigit()]
    return sum(counts) if counts else None


# --- verdicts -----------------------------------------------------------------------


def fired(evidence: list) -> bool:
    """A fault fired when it has evidence and every proof of it held."""
    return bool(evidence) and all(p["held"] for p in evidence)


def judge(res: dict) -> dict:
    """Set ``fired``, ``survived`` and ``outcome`` on one fault's result: ``not fired`` (no
    evidence that it acted), ``survived`` (fired, nothing lost, served throughout) or
    ``not survived``. A result the bench could not carry out (``error``) did not fire."""
    res["fired"] = "error" not in res and fired(res.get("evidence") or [])
    res["survived"] = bool(res["fired"] and res.get("nothing_lost") and res.get("served_throughout"))
    res["outcome"] = "not fired" if not res["fired"] else "survived" if res["survived"] else "not survived"
    return res


# --- the command that ran -----------------------------------------------------------


def cmdline(pid="self") -> list:
    """A process's argv from /proc ([] when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [w.decode(errors="replace") for w in f.read().split(b"\0") if w]
    except OSError:
        return []


def command_line(own: list, parent: list) -> str:
    """The command line that ran: the parent's when it is ``flock`` running this one (as the
    bench's docstring says to run it), else this process's own."""
    if parent and os.path.basename(parent[0]) == "flock" and own and parent[-len(own):] == own:
        return shlex.join(parent)
    return shlex.join(own)


def this_command() -> str:
    """``command_line`` of the running process (argv as typed, every flag in it)."""
    return command_line(cmdline() or [sys.executable, *sys.argv], cmdline(os.getppid()))


# --- the report ---------------------------------------------------------------------


def summary(results: list, chosen: list) -> dict:
    """The report's counts over the faults' results; ``chosen``: the names asked for."""
    def names(keep):
        return [r["fault"] for r in results if keep(r)]
    return {
        "fired": f"{len(names(lambda r: r.get('fired')))} of {len(results)}",
        "survived": f"{len(names(lambda r: r.get('survived')))} of {len(results)}",
        "nothing_lost": f"{len(names(lambda r: r.get('fired') and r.get('nothing_lost')))} of {len(results)}",
        # the rack's endpoint (the gateway) answered throughout; and the victim host itself
        "served_throughout": f"{len(names(lambda r: r.get('fired') and r.get('served_throughout')))} of {len(results)}",
        "host_served_throughout":
            f"{len(names(lambda r: r.get('fired') and r.get('host_served_throughout')))} of {len(results)}",
        "not_fired": names(lambda r: not r.get("fired")),
        "not_survived": names(lambda r: r.get("fired") and not r.get("survived")),
        "lost_something": names(lambda r: r.get("fired") and not r.get("nothing_lost")),
        "not_run": [n for n in chosen if n not in {r["fault"] for r in results}],
    }


def evidence_cell(r: dict) -> str:
    """A table cell: what showed the fault acted, or which proof failed."""
    if "error" in r:
        return "the bench failed: " + r["error"][:120]
    failed = [p for p in r.get("evidence") or [] if not p["held"]]
    if not r.get("evidence"):
        return "**none**"
    shown = failed[0] if failed else r["evidence"][0]
    text = f"{shown['check']}: {str(shown['seen'])[:100]}".replace("|", "\\|")
    return ("**no**: " if failed else "") + text + (f" (+{len(r['evidence']) - 1})" if len(r["evidence"]) > 1 else "")


def served_cell(during: dict) -> str:
    """A poller's summary in words: throughout, or its failures and longest outage."""
    if not during["failures"]:
        return "throughout"
    return f"{during['failures']} of {during['requests']} /health failed ({during['longest_outage_s']} s)"


def gateway_words(counts: Optional[dict]) -> str:
    """What the gateway did with the host's share of the requests, where it moved any."""
    if not counts or not (counts.get("redispatched") or counts.get("taken_down")):
        return ""
    return (f"; the gateway sent it {counts['sent']}, moved {counts['redispatched']} to another host"
            + (f", took it out of service {counts['taken_down']} time(s)" if counts["taken_down"] else ""))


def table(report: dict) -> str:
    """The README's table of a results file, each fault judged again from its evidence (a
    result without any, as older files hold, did not fire)."""
    results = [judge(dict(r)) for r in report["faults"]]
    counts = summary(results, [])
    rows = ["| fault | fired (evidence) | failed run | served (through the gateway) | re-run | changed outside staging "
            "| outcome |",
            "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in results:
        if "error" in r:
            rows.append(f"| {r['fault']}: {r['what']} | {evidence_cell(r)} | | | | | **not fired** |")
            continue
        run, during = r["failed_run"], r["during"]
        served = served_cell(during)
        if r.get("during_host"):
            served += f" (the host itself: {served_cell(r['during_host'])}{gateway_words(r.get('gateway'))})"
        served += "; after: yes" if r["serving_after"] else "; after: NO"
        rerun = f"rc {r['rerun']['rc']} ({r['rerun']['seconds']} s), then {r['converged']['changes']} changes"
        rerun += {True: ", state unchanged", False: ", **the host's state changed**"}.get(
            r["converged"].get("state_unchanged"), "")
        outside = ", ".join(r["changed_outside_staging"]) or "nothing"
        if r["changed_by_the_faults_own_step"]:
            outside += " (its own step: " + ", ".join(p.rsplit("/", 1)[-1] for p in r["changed_by_the_faults_own_step"]) + ")"
        outcome = {"survived": "survived", "not fired": "**not fired**"}.get(r["outcome"])
        if outcome is None:
            outcome = "**not survived**: served with gaps, nothing lost" if r.get("nothing_lost") else "**not survived**"
        rows.append(f"| {r['fault']}: {r['what']} | {evidence_cell(r)} | rc {run['rc']} ({run['seconds']} s) "
                    f"| {served} | {rerun} | {outside} | {outcome} |")
    m, stamp = report["machine"], report.get("provenance") or {}
    commit = (stamp.get("commit") or "")[:10] + ("" if stamp.get("tree") == "clean" else "+dirty") if stamp \
        else m.get("commit", "?")[:10]  # fmt: skip
    rows.append(f"\n{counts['fired']} fired; {counts['survived']} survived, nothing lost in {counts['nothing_lost']}, "
                f"served throughout {counts['served_throughout']} (the host itself {counts['host_served_throughout']}); "
                f"{m['cpu']}, {m['cores']} cores, {m['date'][:10]}, commit {commit}, "
                f"{report['total_s']:.0f} s in all; `{report['command']}`")
    return "\n".join(rows)
