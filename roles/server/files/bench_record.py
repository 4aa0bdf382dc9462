# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Run llama-bench once and record its pp512 and tg128 figures beside the served build and model;
join the measurements of a host's units into one record.

    python3 -c SOURCE OUT RECORD_JSON LLAMA_BENCH [ARG ...]
    python3 -c SOURCE join OUT UNITS_JSON

Runs ``LLAMA_BENCH ARG ... -o json`` (its own log goes beside OUT, as OUT's name
with ``.log``), takes the prompt-processing test (n_prompt > 0, n_gen 0) and
the generation test (n_gen > 0, n_prompt 0) of its JSON, and writes
RECORD_JSON (what the control machine knows: key, mode, roofline) with
them, and llama-bench's own entries, to OUT: beside it first, fsync'd, then
renamed over it, so OUT is always a whole record or the previous one.
Exit 0: recorded; else a message (the log's tail) and nothing replaced.

``join`` writes the host's record: UNITS_JSON lists its units (``units``, and
``alternative``: a layout measured, not served), each naming the measurement
(``part``: a file the first form wrote) or the unit whose figures it shares
(``as``). The record's top level is the first part's whole record (what a
record of one unit holds), its ``units`` and ``alternative`` each unit with its
figures; the parts are removed once it is written. The readers below take a
record of either shape, or one written before units were listed.
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
    log = os.path.splitext(out)[0] + ".log"
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
    write(out, record)
    return 0


def write(out: str, record: dict) -> None:
    """``record`` to ``out``: beside it, fsync'd, renamed over it."""
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


# A unit's own figures, taken from its measurement; those a unit shares with another ("as").
MEASURED = ("pp512", "tg128", "roofline_fraction", "measured_at", "seconds", "llama_bench")
SHARED = ("pp512", "tg128", "roofline_fraction")


def join(out: str, units_json: str) -> object:
    """The host's record from its units' measurements (``part``) and shares (``as``)."""
    listed = json.loads(units_json)
    parts, record, named = {}, None, {}
    for entry in listed.get("units", []) + listed.get("alternative", []):
        if "part" in entry:
            path = entry.pop("part")
            with open(path) as f:
                parts[path] = measured = json.load(f)
            if record is None:
                record = dict(measured)
            if measured.get("key") != record.get("key"):
                return f"{path} measured {measured.get('key')}, not {record.get('key')}: not joined"
            entry.update({k: measured[k] for k in MEASURED if k in measured})
        else:
            shared = named.get(entry.get("as"))
            if shared is None:
                return f"{entry.get('name')} is as {entry.get('as')!r}, which no unit before it is"
            entry.update({k: shared[k] for k in SHARED if k in shared})
        named[entry.get("name")] = entry
    if record is None:
        return "no measurement to join"
    record["units"] = listed.get("units", [])
    if listed.get("alternative"):
        record["alternative"] = listed["alternative"]
    write(out, record)
    for path in parts:
        os.remove(path)
    return 0


def entries(record, serving: bool = True) -> list:
    """The units of a record with their figures: its ``units`` (with ``serving`` False, its
    ``alternative`` after them). A record written before units were listed holds one
    measurement, which stood for every unit of its host: it is the one entry, named None."""
    if not isinstance(record, dict):
        return []
    listed = record.get("units")
    if not isinstance(listed, list):
        return [dict(record, name=None)]
    more = record.get("alternative") if not serving and isinstance(record.get("alternative"), list) else []
    return [e for e in listed + more if isinstance(e, dict)]


def of_unit(record, name=None):
    """The entry of the unit ``name`` in a record, or None; a record written before units were
    listed: its one measurement, whatever the unit."""
    return next((e for e in entries(record) if e.get("name") is None or e.get("name") == name), None)


def of_cards(record, cards):
    """The entry measured on exactly ``cards`` (their UUIDs, in order): a unit's, else one of the
    layout measured beside (which the host may serve since); a record written before units
    were listed: its one measurement. None when no entry is."""
    return next((e for e in entries(record, serving=False) if e.get("name") is None or e.get("cards") == list(cards)),
                None)  # fmt: skip


def tokens_per_second(entry, test: str):
    """An entry's figure of ``test`` (pp512, tg128) in tokens/s, or None."""
    value = ((entry or {}).get(test) or {}).get("tokens_per_second") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def signature(entry: dict) -> str:
    """What llama-bench ran for a unit, as far as its figures go: its kind of cards, in order,
    and the served flags (KV types, layers on the cards, the split)."""
    return json.dumps([entry.get("card_names"), entry.get("served"), entry.get("split_args")], sort_keys=True)


if __name__ == "__main__":
    sys.exit(join(*sys.argv[2:]) if sys.argv[1:2] == ["join"] else main(*sys.argv[1:]))
