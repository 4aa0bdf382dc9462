# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Run llama-bench once and record its pp512 and tg128 figures beside the served build and model.

    python3 -c SOURCE OUT RECORD_JSON LLAMA_BENCH [ARG ...]

Runs ``LLAMA_BENCH ARG ... -o json`` (its own log goes to OUT's directory as
``bench.log``), takes the prompt-processing test (n_prompt > 0, n_gen 0) and
the generation test (n_gen > 0, n_prompt 0) of its JSON, and writes
RECORD_JSON (what the control machine knows: key, mode, roofline) with
them, and llama-bench's own entries, to OUT: beside it first, fsync'd, then
renamed over it, so OUT is always a whole record or the previous one.
Exit 0: recorded; else a message (the log's tail) and nothing replaced.
"""

import json
import os
import subprocess
import sys
import time


def figures(entries: list) -> dict:
    """{"pp512": {...}, "tg128": {...}} from llama-bench's ``-o json`` entries."""
    out = {}
    for e in entries:
        if e.get("n_prompt") and not e.get("n_gen"):
            name = f"pp{e['n_prompt']}"
        elif e.get("n_gen") and not e.get("n_prompt"):
            name = f"tg{e['n_gen']}"
        else:
            continue
        out[name] = {"tokens_per_second": round(float(e["avg_ts"]), 2),
                     "stddev": round(float(e.get("stddev_ts") or 0.0), 2),
                     "repetitions": len(e.get("samples_ts") or []) or None}  # fmt: skip
    return out


def parse(text: str) -> list:
    """llama-bench's JSON array (printed to stdout after the run)."""
    start = text.find("[")
    if start < 0:
        raise ValueError("llama-bench printed no JSON array")
    entries = json.loads(text[start:])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise ValueError("llama-bench's JSON is not a list of tests")
    return entries


def main(out: str, record_json: str, *bench: str) -> object:
    log = os.path.join(os.path.dirname(out), "bench.log")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    started = time.time()
    with open(log, "w") as err:
        result = subprocess.run([*bench, "-o", "json"], stdout=subprocess.PIPE, stderr=err, text=True)
    if result.returncode != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        return f"llama-bench exited {result.returncode}; {log}:\n{tail}"
    try:
        entries = parse(result.stdout)
    except ValueError as e:
        return f"{e}; its output began: {result.stdout[:300]!r}"
    measured = figures(entries)
    if not measured:
        return "llama-bench's JSON holds no prompt or generation test"
    record = json.loads(record_json)
    first = entries[0]
    record.update(measured)
    record.update(
        measured_at=int(started),
        seconds=round(time.time() - started, 1),
        llama_bench={"args": list(bench[1:]), "build_commit": first.get("build_commit"),
                     "backends": first.get("backends"), "cpu_info": first.get("cpu_info"),
                     "gpu_info": first.get("gpu_info"), "n_threads": first.get("n_threads"),
                     "model_size": first.get("model_size"), "entries": entries},
    )  # fmt: skip
    tps = record.get("roofline", {}).get("tokens_per_second")
    tg = measured.get("tg128", {}).get("tokens_per_second")
    record["roofline_fraction"] = round(tg / tps, 4) if tps and tg and record.get("on_card") else None
    new = out + ".new"
    with open(new, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(new, out)
    dir_fd = os.open(os.path.dirname(out), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
