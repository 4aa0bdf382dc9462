"""The build proof's result, from what bench/gpu/build_proof.sh left: gpu-build-proof.json.

    python3 bench/gpu/build_report.py right|wrong --root ROOT --out OUT --jobs N [--at-start LINK]

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
sys.path.insert(0, str(ROOT / "bench"))

import provenance  # noqa: E402  (bench/provenance.py)

RAN_WITH = ("bench/gpu/build_proof.sh", "bench/gpu/build_deploy.py")
WHAT = ("the llama.cpp role (bench/gpu/build_deploy.py through pyinfra @local) builds for the card's arch and its "
        "smoke run computes on the GPU before the switch, and a second deploy changes nothing; a build for sm_80 "
        "only (80-real, no PTX), with the rules bypassed, is refused by the smoke run with llama.cpp's own error "
        "and builds/current stays")  # fmt: skip
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
    ap.add_argument("case", choices=("right", "wrong"))
    ap.add_argument("--root", type=Path, required=True, help="the llamarack root the deploys used")
    ap.add_argument("--out", type=Path, required=True, help="this command's OUT (steps.tsv, the deploys' logs)")
    ap.add_argument("--jobs", type=int, required=True)
    ap.add_argument("--at-start", help="where builds/current pointed before the deploy (wrong)")
    ap.add_argument("--state", type=Path, default=Path("/tmp/buildproof/gpu-build-proof.json"))
    a = ap.parse_args(argv)
    result = json.loads(a.state.read_text()) if a.state.is_file() else {"what": WHAT}
    if "machine" not in result:  # the first command's machine: the state is kept on it
        result["machine"] = machine()
    result[f"{a.case}_arch"] = right(a) if a.case == "right" else wrong(a)
    result["provenance"] = provenance.joined(result.get("provenance"), provenance.stamp(__file__, extra=RAN_WITH))
    text = json.dumps(result, indent=1) + "\n"
    a.state.parent.mkdir(parents=True, exist_ok=True)
    a.state.write_text(text)
    (a.out / "gpu-build-proof.json").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
