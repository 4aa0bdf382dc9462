"""The rollout bench's summary and table, apart from the lab (``bench/rollout_bench.py``
writes the result; ``bench/benchmarks_doc.py`` renders it): standard library only."""

from __future__ import annotations

WAYS = ("rollout", "serial", "parallel")


def cases(result: dict):
    """(name, record) of each case with a load, in the result's order (``three_way.WAY``)."""
    for name, v in result.items():
        if name == "three_way" and isinstance(v, dict):
            yield from ((f"three_way.{w}", v[w]) for w in WAYS if w in v)
        elif isinstance(v, dict) and "load" in v:
            yield name, v


def summary(result: dict) -> dict:
    """Each case's sent, failed, seconds with a failure, failures by reason, p50 and p99 (s),
    and its latencies against the quiet baseline's."""
    base = result.get("baseline", {}).get("load", {})
    out = {}
    for name, v in cases(result):
        load = v["load"]
        out[name] = {k: load.get(k) for k in ("sent", "failed", "seconds_with_failure", "reasons", "p50_s", "p99_s")}
        out[name]["seconds"] = v.get("seconds")
        if name != "baseline" and base.get("p50_s") and load.get("p50_s"):
            out[name].update(p50_x=round(load["p50_s"] / base["p50_s"], 2),
                             p99_x=round(load["p99_s"] / base["p99_s"], 2))
    return out


LABELS = {
    "baseline": "quiet baseline",
    "three_way.rollout": "`llamarack rollout`",
    "three_way.serial": "`pyinfra --serial` (one host at a time, no drain)",
    "three_way.parallel": "plain `pyinfra` (every host at once)",
    "bump_rollout": "llama.cpp bump, canary first",
    "converged_rollout": "the same rollout, converged",
    "canary_fails": "canary fails its gate",
    "revert_rollout": "revert (canary included)",
    "driver_upgrade": "driver upgrade with reboot",
    "driver_hold": "the project's deploy after it",
}


def table(result: dict) -> str:
    """The result as docs/benchmarks.md's table (Markdown)."""
    def ms(s):
        return "" if s is None else f"{s * 1000:,.1f}"

    def count(n):
        return "" if n is None else f"{n:,}"

    rows = ["| case | s | sent | failed | seconds with a failure | p50 ms | p99 ms | restarted | longest drained s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
    for name, v in cases(result):
        load = v["load"]
        moved = f"{len(v['restarted'])} of {len(v['driver'])}" if "restarted" in v and "driver" in v else ""
        seconds = v.get("seconds", load.get("seconds"))
        drained = [s for s in (v.get("drained_s") or {}).values() if s is not None]
        rows.append(f"| {LABELS.get(name, name)} | {seconds} | {count(load.get('sent'))} | "
                    f"{count(load.get('failed'))} | {count(load.get('seconds_with_failure'))} | "
                    f"{ms(load.get('p50_s'))} | {ms(load.get('p99_s'))} | {moved} | {max(drained, default='')} |")  # fmt: skip
    return "\n".join(rows) + "\n"

