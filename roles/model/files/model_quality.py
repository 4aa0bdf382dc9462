# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""A new artifact's quality: llama-perplexity's figures read from its logs, recorded, and bounded.

    python3 model_quality.py record --stamp STAMP_PLAN_JSON --logs DIR --text-sha256 HEX --ctx N
    python3 model_quality.py check --stamp STAMP_JSON --max-kld X --name NAME

``record`` reads the logs the quality steps left in ``DIR`` (``quality-f16.log``:
the f16 GGUF with ``--kl-divergence-base``; ``quality-kv-<type>.log``: the served
quant with ``--kl-divergence`` and that KV type) and adds ``quality`` to the
artifact's record before it is sealed. ``check`` exits 1, naming the figure,
when a KV type's mean KL divergence is above the bound.

The lines read are llama-perplexity's own (tools/perplexity/perplexity.cpp):
``Final estimate: PPL = %.4lf +/- %.5lf`` (perplexity), ``Mean PPL(Q) : %10.6lf ±
%10.6lf`` and ``Mean    KLD: %10.6lf ± %10.6lf`` (KL divergence statistics).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

KV_TYPES = ("f16", "q8_0", "q4_0")
_NUMBER = r"([-+]?(?:[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?|nan|inf))"
FINAL_PPL = re.compile(r"Final estimate: PPL = " + _NUMBER + r" \+/- " + _NUMBER)
MEAN_PPL_Q = re.compile(r"Mean PPL\(Q\)\s*: +" + _NUMBER + r" ± +" + _NUMBER)
MEAN_KLD = re.compile(r"Mean {4}KLD: +" + _NUMBER + r" ± +" + _NUMBER)


def _last(pattern, text: str):
    found = pattern.findall(text)
    return (float(found[-1][0]), float(found[-1][1])) if found else None


def parse_perplexity(text: str) -> dict | None:
    """The perplexity of a plain (or ``--kl-divergence-base``) run: ``{"ppl", "ppl_error"}``."""
    found = _last(FINAL_PPL, text)
    return {"ppl": found[0], "ppl_error": found[1]} if found else None


def parse_kld(text: str) -> dict | None:
    """A ``--kl-divergence`` run's perplexity of the quant and mean KL divergence against the base:
    ``{"ppl", "ppl_error", "kld", "kld_error"}``; None without the KLD line (llama-perplexity
    prints no statistics under 100 tokens)."""
    kld, ppl = _last(MEAN_KLD, text), _last(MEAN_PPL_Q, text)
    if not kld:
        return None
    return {**({"ppl": ppl[0], "ppl_error": ppl[1]} if ppl else {}), "kld": kld[0], "kld_error": kld[1]}


def _log(logs: str, name: str) -> str:
    """A quality run's log in ``logs`` ("" when the run left none)."""
    path = os.path.join(logs, name)
    if not os.path.isfile(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def quality_of(logs: str, text_sha256: str, ctx: int) -> dict:
    """The record's ``quality``: the f16 GGUF's perplexity, and per KV type the served quant's
    perplexity and KL divergence; a run whose log holds no figure is named in ``missing``."""
    quality: dict = {"text_sha256": text_sha256, "ctx": ctx, "kv": {}, "missing": []}
    base = parse_perplexity(_log(logs, "quality-f16.log"))
    if base:
        quality["f16"] = base
    else:
        quality["missing"].append("f16")
    for kv in KV_TYPES:
        figures = parse_kld(_log(logs, f"quality-kv-{kv}.log"))
        if figures:
            quality["kv"][kv] = figures
        else:
            quality["missing"].append(f"kv {kv}")
    return quality


def kld_problem(quality: dict | None, max_kld: float | None, name: str) -> str | None:
    """Why an artifact of this ``quality`` is refused by the bound ``max_kld``, or None."""
    if max_kld is None or not isinstance(quality, dict):
        return None
    worst = max(((v.get("kld"), kv) for kv, v in (quality.get("kv") or {}).items()
                 if isinstance(v, dict) and isinstance(v.get("kld"), (int, float))), default=None)  # fmt: skip
    if worst is None or worst[0] <= max_kld:
        return None
    return (f"{name}: found a mean KL divergence of {worst[0]:.6f} ({worst[1]} KV) against its f16 GGUF on the "
            f"held-out text; allowed: at most model_quality_max_kld = {max_kld}. Refused: models/current is "
            "not switched, the served artifact stays. Fix: another model_quant or model_route, or a higher "
            "model_quality_max_kld")


def cmd_record(args) -> None:
    with open(args.stamp) as f:
        record = json.load(f)
    record["quality"] = quality_of(args.logs, args.text_sha256, args.ctx)
    tmp = args.stamp + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.rename(tmp, args.stamp)
    print("quality " + json.dumps(record["quality"], sort_keys=True))


def cmd_check(args) -> int:
    with open(args.stamp) as f:
        problem = kld_problem(json.load(f).get("quality"), args.max_kld, args.name)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


# Each command: its function and its options (all required), as (option, type).
COMMANDS = {
    "record": (cmd_record, (("--stamp", str), ("--logs", str), ("--text-sha256", str), ("--ctx", int))),
    "check": (cmd_check, (("--stamp", str), ("--max-kld", float), ("--name", str))),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Record and bound a model artifact's quality (llamarack).")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, options) in COMMANDS.items():
        command = sub.add_parser(name)
        for option, kind in options:
            command.add_argument(option, type=kind, required=True)
    args = parser.parse_args(argv)
    return COMMANDS[args.command][0](args) or 0


if __name__ == "__main__":
    sys.exit(main())
