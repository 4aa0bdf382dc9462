"""The build proof's results, from what bench/gpu/build_proof.sh left: gpu-build-proof.json
(``right``, ``wrong``) and gpu-build-proof-tools.json (``quality``).

    python3 bench/gpu/build_report.py right|wrong|quality --root ROOT --out OUT --jobs N [--at-start LINK]

``build_proof.sh right`` deploys the llama.cpp role twice and ``build_proof.sh wrong`` once
for an arch the card cannot run; each ends with this report for its case: each deploy's
exit status and seconds (``OUT/steps.tsv``: NAME RC SECONDS, a line a deploy), its changed
operations (pyinfra's "Grand total" row in ``OUT/NAME.log``), the build the role recorded
(``ROOT/builds/current/build-info.json``, its cubins) and, for ``wrong``, where
``builds/current`` pointed before and after, and the smoke run's refusal from the log.

The two cases are two commands (each near the machine's 600 s): the result is kept on
the machine (``--state``), so the second command on the same warm machine adds its case
to the first's, and each command's stamp (``bench/provenance.py``) is one of the
stamp's ``runs``. A case missing from the result ran on no machine that kept it.

``build_proof.sh quality`` deploys the build with ``model_quality`` twice: its proof then runs
every tool the deploy runs afterwards on the smoke model, and this report adds, beside the
deploys and the proof's record, each tool's figures from the logs the proof kept
(``builds/current/smoke/``): the mean KL divergence and perplexity with each KV type
(``perplexity-kv-<type>.log``, read by the model role's own ``model_quality``), the base's
perplexity (``perplexity-base.log``) and llama-bench's pp (``bench.log``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import provenance  # noqa: E402  (bench/provenance.py)
from roles.model.files.model_quality import parse_kld, parse_perplexity  # noqa: E402

RAN_WITH = ("bench/gpu/build_proof.sh", "bench/gpu/build_deploy.py")
WHAT = ("the llama.cpp role (bench/gpu/build_deploy.py through pyinfra @local) builds for the card's arch and its "
        "smoke run computes on the GPU before the switch, and a second deploy changes nothing; a build for sm_80 "
        "only (80-real, no PTX), with the rules bypassed, is refused by the smoke run with llama.cpp's own error "
        "and builds/current stays")  # fmt: skip
TOOLS_WHAT = ("the build proof runs every llama.cpp tool the deploy runs afterwards, on the smoke model, with the "
              "proven rung's runtime switches and one batch: the server, llama-bench pp and, with model_quality "
              "(the build then carries llama-perplexity), llama-perplexity for the f16 logits and the quant's KL "
              "divergence with each KV type, all on the card")  # fmt: skip
RESULTS = {"right": "gpu-build-proof.json", "wrong": "gpu-build-proof.json", "quality": "gpu-build-proof-tools.json"}
BENCH_PP = re.compile(r"\|\s*pp(\d+)\s*\|\s*([\d.]+)\s*±")  # llama-bench's table: | ... | pp512 | 1234.56 ± 7.8 |
WRONG_SETTINGS = {"llamacpp_cuda_archs": ["80-real"], "bench_skip_rules": True}
REFUSAL = re.compile(r"cannot compute|died with|no kernel image|CUDA error|smoke run")


def sh(*argv: str) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def steps(out: Path) -> dict:
    """{deploy: {rc, seconds, changed_operations}} from OUT/steps.tsv and each deploy's log."""
    found = {}
    tsv = out / "steps.tsv"
    for line in (tsv.read_text().splitlines() if tsv.is_file() else []):
        name, rc, seconds = line.split("\t")
        log = out / f"{name}.log"
        totals = re.findall(r"^\s*Grand total\s+\S+\s+(\S+)", log.read_text(errors="replace"), re.M) \
            if log.is_file() else []  # fmt: skip
        found[name] = {"rc": int(rc), "seconds": int(seconds),
                       "changed_operations": sum(int(t) for t in totals if t.isdigit()) if totals else None}
    return found


def build_record(root: Path) -> dict:
    """What the role recorded of the build ``builds/current`` points at (None where it points nowhere)."""
    current = root / "builds/current"
    info = current / "build-info.json"
    if not info.is_file():
        return {}
    rec = json.loads(info.read_text())
    cubins = current / "cubins.txt"
    return {"stamp": rec.get("stamp"), "cuda_archs": rec.get("cuda_archs"), "cmake_args": rec.get("cmake_args"),
            "cubins": cubins.read_text().count("cubin") if cubins.is_file() else None,
            "version": (current / "version.txt").read_text().strip() if (current / "version.txt").is_file() else None,
            "proof": rec.get("proof")}  # fmt: skip


def right(a) -> dict:
    ran = steps(a.out)
    build = build_record(a.root)
    return {"first_deploy": {**ran.get("deploy1", {}), "jobs": a.jobs, **{k: build.get(k) for k in (
                "stamp", "cubins", "cuda_archs", "cmake_args", "version")}},
            "second_deploy": ran.get("deploy2"), "proof": build.get("proof")}  # fmt: skip


def wrong(a) -> dict:
    log = a.out / "wrong_arch.log"
    text = log.read_text(errors="replace") if log.is_file() else ""
    current = a.root / "builds/current"
    return {"settings": WRONG_SETTINGS, "deploy": steps(a.out).get("wrong_arch"),
            "current_at_start": a.at_start or None,
            "current_at_end": os.readlink(current) if current.is_symlink() else None,
            "output": [" ".join(x.split())[:300] for x in text.splitlines() if REFUSAL.search(x)][:20]}  # fmt: skip


def tool_figures(smoke: Path) -> dict:
    """What each tool's log in the proof's ``smoke`` folder says (nothing for a log it did not leave)."""
    read = lambda name: (smoke / name).read_text(errors="replace") if (smoke / name).is_file() else ""  # noqa: E731
    base = parse_perplexity(read("perplexity-base.log")) or {}
    klds = []
    for log in sorted(smoke.glob("perplexity-kv-*.log")):
        kld = parse_kld(log.read_text(errors="replace")) or {}
        klds.append({"kv": log.stem[len("perplexity-kv-"):], "mean_kld": kld.get("kld"), "ppl_base": base.get("ppl"),
                     "ppl_quant": kld.get("ppl")})  # fmt: skip
    pp = BENCH_PP.findall(read("bench.log"))
    return {"kl_divergence": klds, **({f"bench_pp{pp[-1][0]}_tokens_per_second": float(pp[-1][1])} if pp else {})}


def quality(a) -> dict:
    ran = steps(a.out)
    build = build_record(a.root)
    first = {**ran.get("quality1", {}), "jobs": a.jobs, "stamp": build.get("stamp"), "build_before": a.at_start or None}
    if build.get("stamp") and a.at_start and not a.at_start.endswith(build["stamp"]):
        tools = (build.get("proof") or {}).get("tools") or []
        first["note"] = "a new build stamp" + (": llama-perplexity among the targets" if "llama-perplexity" in tools
                                                else "")  # fmt: skip
    return {"first_deploy": first, "second_deploy": ran.get("quality2"), "proof": build.get("proof"),
            **tool_figures(a.root / "builds/current/smoke")}  # fmt: skip


def machine() -> dict:
    gpu = [f.strip() for f in sh("nvidia-smi", "--query-gpu=name,compute_cap,memory.total,driver_version",
                                 "--format=csv,noheader").split("\n")[0].split(",")]  # fmt: skip
    nvcc = next((x for x in sh("nvcc", "--version").splitlines() if "release" in x), None)
    return {"gpu": f"{gpu[0]} (compute capability {gpu[1]}, {gpu[2]})" if len(gpu) == 4 else None,
            "driver": gpu[3] if len(gpu) == 4 else None, "toolkit": nvcc,
            "host_gcc": sh("gcc", "-dumpfullversion") or None, "cpus": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d")}  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=tuple(RESULTS))
    ap.add_argument("--root", type=Path, required=True, help="the llamarack root the deploys used")
    ap.add_argument("--out", type=Path, required=True, help="this command's OUT (steps.tsv, the deploys' logs)")
    ap.add_argument("--jobs", type=int, required=True)
    ap.add_argument("--at-start", help="where builds/current pointed before the deploy (wrong)")
    ap.add_argument("--state", type=Path, default=Path("/tmp/buildproof"), help="where the machine keeps the results")
    a = ap.parse_args(argv)
    kept = a.state / RESULTS[a.case]
    result = json.loads(kept.read_text()) if kept.is_file() else {"what": TOOLS_WHAT if a.case == "quality" else WHAT}
    if "machine" not in result:  # the first command's machine: the state is kept on it
        result["machine"] = machine()
    if a.case == "quality":
        result["quality"] = quality(a)
    else:
        result[f"{a.case}_arch"] = right(a) if a.case == "right" else wrong(a)
    result["provenance"] = provenance.joined(result.get("provenance"), provenance.stamp(__file__, extra=RAN_WITH))
    text = json.dumps(result, indent=1) + "\n"
    a.state.mkdir(parents=True, exist_ok=True)
    kept.write_text(text)
    (a.out / RESULTS[a.case]).write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
