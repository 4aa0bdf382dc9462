#!/usr/bin/env python3
"""docs/benchmarks.md, generated: the prose of ``bench/benchmarks_template.md`` with each
``{{ name }}`` line replaced by what the results under ``bench/results/`` say.

    python3 bench/benchmarks_doc.py            writes docs/benchmarks.md
    python3 bench/benchmarks_doc.py --check    exits 1 where docs/benchmarks.md differs

Each section names its result file, the command, commit and machine from the result's
stamp (``bench/provenance.py``); a result written before the stamp existed is rendered with
what it says of its machine and date, and marked "not yet re-run with its provenance". Every
figure comes from the result; a result that lacks one renders without it. The lab sections
are here, the GPU ones in ``benchmarks_doc_gpu.py``; both only read JSON (standard library).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from reliability_report import table as reliability_table  # noqa: E402
from rollout_report import table as rollout_table  # noqa: E402

TEMPLATE = ROOT / "bench/benchmarks_template.md"
RESULTS = ROOT / "bench/results"
DOC = ROOT / "docs/benchmarks.md"
PLACE = re.compile(r"^\{\{ (\w+) \}\}$", re.M)
NOT_STAMPED = "not yet re-run with its provenance"


class Results:
    """The results folder, each file read once (None where a result is missing)."""

    def __init__(self, folder: Path = RESULTS):
        self.folder, self.seen = Path(folder), {}

    def __call__(self, name: str) -> Optional[dict]:
        if name not in self.seen:
            path = self.folder / f"{name}.json"
            self.seen[name] = json.loads(path.read_text()) if path.is_file() else None
        return self.seen[name]


# --- numbers ----------------------------------------------------------------------------


def num(x, places: int = 0) -> str:
    """``x`` with thousands separated and ``places`` decimals; "?" where it is missing."""
    return "?" if x is None else f"{x:,.{places}f}"


def secs(x, places: int = 2) -> str:
    return f"{num(x, places)} s"


def span(values: list, places: int = 0, unit: str = "") -> str:
    """"A" where all are alike, else "A to B"."""
    lo, hi = min(values), max(values)
    return f"{num(lo, places)}{unit}" if lo == hi else f"{num(lo, places)} to {num(hi, places)}{unit}"


# --- where a result comes from -------------------------------------------------------------


def gpu_text(gpus: list) -> str:
    return "; ".join(f"{g.get('name')}, driver {g.get('driver')}, {g.get('memory')}" for g in gpus)


def machine_text(m: dict) -> str:
    """A stamp's machine, in a few words."""
    parts = [gpu_text(m["gpus"])] if m.get("gpus") else []
    parts.append(f"{m.get('cpu')}, {m.get('cores')} cores, {num(m.get('memory_gib'), 1)} GiB")
    return "; ".join(parts + [m["os"]] if m.get("os") else parts)


def stamped_line(name: str, p: dict) -> str:
    """The source line of a stamped result: command, commit, tree, machine, date, scripts."""
    tree = "clean tree" if p.get("tree") == "clean" else f"tree {p.get('tree')}: {', '.join(p.get('changed') or [])}"
    runs = p.get("runs") or []
    ran = f"{len(runs)} commands, the last `{p['command']}`" if len(runs) > 1 else f"`{p['command']}`"
    scripts = ", ".join(f"`{path}` {digest[:12]}" for path, digest in sorted(p.get("scripts", {}).items()))
    line = (f"Result `{name}.json`: {ran}, at commit `{str(p.get('commit'))[:10]}` ({tree}); "
            f"{machine_text(p.get('machine') or {})}; {str(p.get('written'))[:10]}. sha256: {scripts}.")  # fmt: skip
    if p.get("mixed"):
        line += " **Its commands ran different commits or scripts.**"
    return line


def legacy_machine(r: dict) -> str:
    """What an unstamped result says of its machine, in a few words."""
    m = r.get("machine")
    if isinstance(m, str):
        return m
    m = m or {}
    gpu = m.get("gpu") or m.get("nvidia_smi")
    cores = m.get("cores") or m.get("cpus") or m.get("nproc")
    memory = m.get("mem_total_mib") and f"{num(m['mem_total_mib'])} MiB"
    cpu = ", ".join(x for x in (m.get("cpu"), cores and f"{cores} cores", memory) if x)
    return "; ".join(x for x in (gpu, cpu) if x) or "machine not recorded"


def legacy_date(r: dict) -> str:
    m = r.get("machine") if isinstance(r.get("machine"), dict) else {}
    return str(r.get("date") or r.get("when") or m.get("date") or r.get("written") or "date not recorded")[:10]


def source(name: str, r: Optional[dict]) -> str:
    """The line that says where a section's figures come from."""
    if r is None:
        return f"No result `{name}.json` yet: its script writes it."
    if r.get("provenance"):
        return stamped_line(name, r["provenance"])
    return f"Result `{name}.json` ({NOT_STAMPED}: no commit or script recorded): {legacy_machine(r)}, {legacy_date(r)}."


def section(name: str, r: Optional[dict], body: Callable[[dict], str]) -> str:
    """A result's source line, then what ``body`` renders of it (nothing for a missing one)."""
    return source(name, r) + ("\n\n" + body(r) if r is not None else "")


# --- the lab --------------------------------------------------------------------------------


def converged_row(name: str, r: dict) -> str:
    c, a = r["converged_s"], r.get("audit_s") or {}
    return (f"| `{name}.json` | {r['hosts']} | {secs(r.get('first_deploy_s'), 1)} | {secs(c['median'])} "
            f"(median of {len(c['runs'])}) | {num(r.get('remote_commands_per_host_median'))} | "
            f"{secs(a.get('median'))} | {secs((r.get('ssh_true_fan_out_s') or {}).get('median'), 3)} |")  # fmt: skip


def converged(results: Results) -> str:
    named = [(n, results(n)) for n in ("converged", "converged-16hosts")]
    rows = ["| result | hosts | first deploy | converged deploy | remote commands per host | audit (median) | "
            "`ssh HOST true` to all |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    rows += [converged_row(n, r) for n, r in named if r is not None]
    notes = [f"`{n}.json`: " + ", ".join(x for x in (
        r.get("lab_up_s") and f"`lab up` {secs(r['lab_up_s'], 1)}",
        r.get("lab_state") == "disk" and "the rack's state on disk (the lab's tmpfs does not hold it)",
        r.get("load_average_at_timing") and f"load average {r['load_average_at_timing'][0]:g} on {r['machine']['cores']} cores when "
                                            "the timings began (they move with it)")
        if x) + "." for n, r in named if r and (r.get("lab_up_s") or r.get("lab_state") == "disk")]  # fmt: skip
    text = "\n".join(source(n, r) for n, r in named) + "\n\n" + "\n".join(rows)
    return text + ("\n\n" + " ".join(notes) if notes else "")


def kb(n: int) -> str:
    return f"{n / 1000:.1f} KB"


def audit_body(r: dict) -> str:
    a = r["audit_s"]
    sizes: dict = {}
    for host, n in r.get("script_bytes", {}).items():
        sizes.setdefault(n, []).append(host)
    commands = sorted(set(r.get("remote_commands_per_host", {}).values()))
    changed = [h for h, same in r.get("hosts_unchanged", {}).items() if not same]
    sized = "; ".join(kb(n) + " for " + ", ".join(hosts) for n, hosts in sorted(sizes.items(), reverse=True))
    return (f"`llamarack audit inventory/lab.py --json` of the converged rack ({r['hosts']} hosts) took "
            f"{secs(a['median'])} (median of {len(a['runs'])}; {span(a['runs'], 2, ' s')}) beside "
            f"{secs(r['ssh_true_fan_out_s']['median'])} for a bare `ssh HOST true` to the same hosts, "
            f"{secs(r.get('audit_control_cpu_s'))} of CPU here; {span(commands)} remote command(s) per host "
            f"({sized}); " + ("every host's files, unit and server process unchanged." if not changed
                              else f"**changed on {', '.join(changed)}**."))  # fmt: skip


def deploy_text(d: dict) -> str:
    moved = d.get("hosts_with_a_new_build_or_restart") or []
    return (f"{secs(d['seconds'])}, {d['changed_operations']} changed operations ({d.get('reproved_builds')} "
            f"re-proofs), a new build or a restart on {', '.join(moved) or 'no host'}")  # fmt: skip


def cross_version_text(c: dict) -> str:
    said = {"onto_older": "put on it", "older_converged": "converged there", "upgrade_deploy": "this tree's deploy",
            "next_deploy": "the next one"}  # fmt: skip
    done = [f"{what}: {deploy_text(c[key])}" for key, what in said.items() if key in c]
    text = f"From commit `{c['from'][:10]}`'s llamarack to this one: " + "; ".join(done) + "."
    if c.get("plan_upgrade"):
        text += " This tree's `plan-upgrade` said, before its deploy:\n\n" + "\n".join(
            "    " + line for line in c["plan_upgrade"])
    if c.get("error"):
        text += f"\n\n**{c['error']['step']} failed**: {c['error']['said'][-300:]}"
    return text


def tool_upgrade_body(r: dict) -> str:
    text = ("`plan-upgrade` of the next llamarack said:\n\n" + "\n".join("    " + x for x in r["plan_upgrade"])
            + f"\n\nIts deploy: {deploy_text(r['upgrade_deploy'])}; its next deploy: "
            f"{deploy_text(r['second_deploy'])}; the deploy back with this tree: {deploy_text(r['back_deploy'])}.")
    if r.get("cross_version"):
        return text + "\n\n" + cross_version_text(r["cross_version"])
    return text + "\n\nNo move from an older llamarack is in this result (`--from REV` measures one)."


def lab_rows(r: dict) -> list:
    many = next((int(k.split("_")[0]) for k in r.get("converged", {}) if k.endswith("_hosts")), None)
    c, n = r.get("converged", {}), r.get("converged_nagle_on", {})
    mem = r.get(f"machine_mem_used_mib_with_{many}_hosts")
    rows = [("`lab up`, 4 hosts, the image cache empty (the image built)", r.get("cold_up_4_hosts"), ""),
            (f"`lab up`, 4 hosts, warm (median of {r.get('reps')})", r.get("warm_up_4_hosts"), ""),
            ("`lab down`, 4 hosts", r.get("down_4_hosts"), ""),
            (f"`lab up`, {many} hosts, warm", r.get(f"warm_up_{many}_hosts"),
             f" ({num(mem / 1024, 1)} GiB of the machine's memory)" if mem else ""),
            (f"`lab down`, {many} hosts", r.get(f"down_{many}_hosts"), "")]  # fmt: skip
    out = [f"| {what} | {secs(s['median_s'])}{more} |" for what, s, more in rows if s]
    for hosts, key in (("1 host", "1_host"), (f"{many} hosts", f"{many}_hosts")):
        if key in c and key in n:
            out.append(f"| a converged run of the trivial deploy, {hosts}, TCP_NODELAY on (median of "
                       f"{len(c[key]['runs_s'])}) | {secs(c[key]['median_s'])} ({secs(n[key]['median_s'])} with "
                       "Nagle's algorithm) |")  # fmt: skip
    return out


def lab_body(r: dict) -> str:
    return "\n".join(["| step | time |", "| --- | --- |", *lab_rows(r)])


MODELS = {"llama3-8b": "Llama-3 8B", "qwen2.5-7b": "Qwen2.5 7B", "gemma3-27b": "Gemma-3 27B"}


def gguf_header_body(r: dict) -> str:
    rows = ["| model | tokens | from the header | from the shape recorded at the seal | a reader taking the tokens "
            "one string at a time |", "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for key, m in r["models"].items():
        if key in MODELS:
            rows.append(f"| {MODELS[key]} | {num(m['n_vocab'])} | {secs(m['host_command_cpu_s_checkout'], 3)} | "
                        f"{secs(m['host_command_cpu_s_recorded'], 3)} | {secs(m['host_command_cpu_s_per_string'])} |")
    g = r["models"].get("written_by_gguf_py")
    if g:
        rows.append(f"\nOn {g['host']}, a header that the pinned llama.cpp's own gguf-py wrote with "
                    f"{num(g['tokens'])} tokens and {num(g['merges'])} merges: "
                    f"{secs(g['host_command_cpu_s_checkout'], 3)} from the header, "
                    f"{secs(g['host_command_cpu_s_recorded'], 3)} from the record, "
                    f"{secs(g['host_command_cpu_s_per_string'], 3)} one string at a time; "
                    + ("the same output." if g.get("same_output") else "**outputs differ**."))  # fmt: skip
    return "\n".join(rows)


def rollout_body(r: dict) -> str:
    text = rollout_table(r).rstrip("\n")
    if "pace_s" not in r.get("load", {}):
        text += (f"\n\nThis result's load is not the paced one above (a closed loop of {r['load'].get('n_predict')}-"
                 "token completions whose bodies were not read, by an earlier version of the script): its failed "
                 "counts do not compare with a paced load's.")  # fmt: skip
    if "when" in r.get("baseline", {}) and not r.get("provenance"):
        text += (f" Its baseline was measured again on {r['baseline']['when'][:10]}, into the result, by "
                 "another version of the script: the result mixes two versions.")  # fmt: skip
    staged = [(name, v["stage_received"]) for name, v in r.items()
              if isinstance(v, dict) and v.get("stage_received") and any(v["stage_received"].values())]  # fmt: skip
    if staged:
        text += "\n\nReceived in the stage from the host that made it (the others made nothing): " + "; ".join(
            f"{name}: {n['builds']} build(s), {n['models']} model(s)" for name, n in staged) + "."
    return text


def share(x) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def affinity_body(r: dict) -> str:
    load = r.get("load") or {}
    rows = ["| case | turns sent | failed | returning turns' prefix from the cache | returning turns 80% or more "
            "cached | first token, first turns (p50 / p90) | first token, returning turns (p50 / p90) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    failed = []
    for case, c in r.items():
        s = c.get("summary") if isinstance(c, dict) else None
        if s:
            rows.append(f"| {case} | {s['sent']} | {s['failed']} | {share(s.get('cached_share'))} | "
                        f"{share(s.get('turns_cached_enough'))} | {secs(s.get('ttft_first_p50_s'), 3)} / "
                        f"{secs(s.get('ttft_first_p90_s'), 3)} | {secs(s.get('ttft_returning_p50_s'), 3)} / "
                        f"{secs(s.get('ttft_returning_p90_s'), 3)} |")  # fmt: skip
            failed += [f"{case}: {', '.join(s['reasons'])}"] if s.get("reasons") else []
    text = (f"{load.get('conversations')} conversations of {load.get('turns')} turns, {load.get('concurrency')} at "
            f"once, {load.get('max_tokens')} tokens an answer, through {load.get('url')}:\n\n" + "\n".join(rows))
    return text + (f"\n\nWhy turns failed: {'; '.join(failed)}." if failed else "")


def not_survived(f: dict, lost: list) -> str:
    if f.get("changed_outside_staging"):
        return f"{f['fault']} (it changed {', '.join(f['changed_outside_staging'])}, outside the staging)"
    return f"{f['fault']} ({'lost something' if f['fault'] in lost else 'served with gaps, nothing lost'})"


def reliability_body(r: dict) -> str:
    text = reliability_table(r)
    notes = [not_survived(f, r.get("lost_something", [])) for f in r["faults"]
             if f["fault"] in r.get("not_survived", [])]  # fmt: skip
    return text + ("\n\nNot survived in this run: " + "; ".join(notes) + "." if notes else "")


def first_deploy_body(r: dict) -> str:
    ways = r["ways"]
    rows = ["| way | compiles | conversions | quantizations | hub bytes (checkpoint: "
            f"{num(next(iter(ways.values()))['checkpoint_bytes'])}) | builds received (MiB) | models received (MiB) | "
            "deploy | load average before |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, w in ways.items():
        rows.append(f"| `{name}` | {w['compiles']} of {w['serving_hosts']} | {w['conversions']} | {w['quantizations']} | "
                    f"{num(w['hub_model_bytes'])} | {w['builds_received']} ({num(w['build_mib_shipped'])}) | "
                    f"{w['models_received']} ({num(w['model_mib_shipped'])}) | {secs(w['deploy_s'], 1)} | "
                    f"{w['load_average_before'][0]:g} |")  # fmt: skip
    return "\n".join(rows)


# --- the page -------------------------------------------------------------------------------


def lab_sections() -> dict:
    one = lambda name, body: lambda results: section(name, results(name), body)  # noqa: E731
    return {"converged": converged, "audit": one("audit", audit_body),
            "tool_upgrade": one("tool-upgrade", tool_upgrade_body), "lab": one("lab", lab_body),
            "gguf_header": one("gguf-header", gguf_header_body), "rollout": one("rollout", rollout_body),
            "affinity": one("affinity", affinity_body), "first_deploy": one("first-deploy", first_deploy_body),
            "reliability": one("reliability", reliability_body)}  # fmt: skip


def render(results: Results, template: str) -> str:
    """The page: the template with each of its places rendered from the results."""
    from benchmarks_doc_gpu import gpu_sections

    sections = {**lab_sections(), **gpu_sections()}
    return PLACE.sub(lambda m: sections[m.group(1)](results), template)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 where docs/benchmarks.md differs")
    ap.add_argument("--results", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    page = render(Results(a.results), TEMPLATE.read_text())
    if a.check:
        same = DOC.read_text() == page
        print("docs/benchmarks.md is " + ("current" if same else "stale: run python3 bench/benchmarks_doc.py"))
        return 0 if same else 1
    DOC.write_text(page)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
