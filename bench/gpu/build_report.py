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
import hashlib
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
SHIP_WHAT = ("one portable build (ggml's CPU baseline in its stamp, the card's arch as real SASS) is compiled once "
             "by the llama.cpp role and published to a directory pyinfra runs share (LLAMARACK_SHIP_DIR, as a "
             "rollout's stage does); a second run with a root of its own receives it as a receiving host does: "
             "the tar checked, every file against the seal, the smoke run on the card, then sealed and switched in, "
             "nothing compiled; the artifact itself is checked here: its cubins (cuobjdump --list-elf) and its CPU "
             "code (no AVX-512 register in ggml's CPU library)")  # fmt: skip
RESULTS = {"right": "gpu-build-proof.json", "wrong": "gpu-build-proof.json", "quality": "gpu-build-proof-tools.json",
           "ship": "gpu-ship-proof.json"}  # fmt: skip
RECEIVED = re.compile(r"receiving it from|not compiling it|refused here|compiling it here|waiting for")
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


def artifact(build: Path) -> dict:
    """The build's own files, checked: the CUDA library's cubins and ggml's CPU code."""
    libs = lambda pattern: [p for p in sorted(build.glob(pattern)) if not p.is_symlink()]  # noqa: E731
    cuda = next(iter(libs("bin/libggml-cuda.so*")), None)
    elf = sh("cuobjdump", "--list-elf", str(cuda)) if cuda else ""
    cpu = {}
    for lib in libs("bin/libggml-cpu*.so*"):  # AVX-512 code names zmm registers
        asm = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True, text=True).stdout
        cpu[lib.name] = {"instructions": len(re.findall(r"^\s+[0-9a-f]+:\t", asm, re.M)),
                         "avx512_zmm": len(re.findall(r"%zmm\d", asm)), "avx2_ymm": len(re.findall(r"%ymm\d", asm))}
    return {"cuda_library": cuda.name if cuda else None, "cubins": elf.count(".cubin"),
            "cubin_archs": sorted(set(re.findall(r"\.(sm_\d+a?)\.cubin", elf))), "cuobjdump_head": elf.splitlines()[:3],
            "cpu_code": cpu}  # fmt: skip


def same_files(a: Path, b: Path) -> dict:
    """Whether two builds' bin/ hold the same files, byte for byte (sha256 of each)."""
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    files = lambda d: {p.name: digest(p) for p in sorted(d.glob("bin/*")) if p.is_file()}  # noqa: E731
    fa, fb = files(a), files(b)
    return {"files": len(fa), "identical": bool(fa) and fa == fb,
            "differ": sorted(n for n in fa.keys() | fb.keys() if fa.get(n) != fb.get(n))}  # fmt: skip


def ship(a) -> dict:
    ran = steps(a.out)
    maker, receiver = build_record(a.root), build_record(a.receiver)
    notes = [json.loads(p.read_text()) for p in sorted(a.ship_dir.glob("*.json"))] if a.ship_dir.is_dir() else []
    log = a.out / "receiver.log"
    said = [" ".join(x.split())[:300] for x in (log.read_text(errors="replace").splitlines() if log.is_file() else [])
            if RECEIVED.search(x)]  # fmt: skip
    current = lambda root: (root / "builds/current").resolve()  # noqa: E731
    return {"maker": {**ran.get("maker", {}), "jobs": a.jobs, **{k: maker.get(k) for k in (
                "stamp", "cuda_archs", "cmake_args", "version")}, "proof": maker.get("proof")},
            "maker_again": ran.get("maker_again"),
            "shipped": [{k: n.get(k) for k in ("sha256", "bytes", "source")} for n in notes],
            "receiver": {**ran.get("receiver", {}), "stamp": receiver.get("stamp"), "said": said,
                         "proof": receiver.get("proof")},
            "receiver_again": ran.get("receiver_again"),
            "same_files": same_files(current(a.root), current(a.receiver)),
            "artifact": artifact(current(a.receiver)),
            "cmake_cache": {"maker": (current(a.root) / "build/CMakeCache.txt").is_file(),  # compiled there
                            "receiver": (current(a.receiver) / "build/CMakeCache.txt").is_file()}}  # fmt: skip


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
    ap.add_argument("--receiver", type=Path, default=Path("/tmp/llamarack-receiver"), help="the receiver's root (ship)")
    ap.add_argument("--ship-dir", type=Path, default=Path("/tmp/buildproof-ship"), help="the runs' shared directory")
    ap.add_argument("--at-start", help="where builds/current pointed before the deploy (wrong)")
    ap.add_argument("--state", type=Path, default=Path("/tmp/buildproof"), help="where the machine keeps the results")
    a = ap.parse_args(argv)
    kept = a.state / RESULTS[a.case]
    what = {"quality": TOOLS_WHAT, "ship": SHIP_WHAT}.get(a.case, WHAT)
    result = json.loads(kept.read_text()) if kept.is_file() else {"what": what}
    if "machine" not in result:  # the first command's machine: the state is kept on it
        result["machine"] = machine()
    if a.case == "quality":
        result["quality"] = quality(a)
    elif a.case == "ship":
        result["ship"] = ship(a)
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
