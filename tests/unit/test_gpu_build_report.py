"""bench/gpu/build_report.py: the build proof's result made by its script from what
build_proof.sh left (each deploy's status, seconds and changes, the role's build record,
the refusal of the wrong arch), both cases of one warm machine in one result, stamped; and
the tools' result of a build with model_quality, each tool's figures from its own log."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_build_report", ROOT / "bench/gpu/build_report.py")
report = sys.modules.setdefault("gpu_build_report", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(report)

sys.path.insert(0, str(ROOT / "bench"))
import benchmarks_doc_gpu as gpu  # noqa: E402  (bench/)

TOTALS = "    Grand total          1          {}          0          0\n"


def command_out(tmp_path: Path, name: str, deploys: dict) -> Path:
    out = tmp_path / name
    out.mkdir()
    for deploy, (rc, seconds, changed, text) in deploys.items():
        with open(out / "steps.tsv", "a") as f:
            f.write(f"{deploy}\t{rc}\t{seconds}\n")
        (out / f"{deploy}.log").write_text(text + TOTALS.format(changed))
    return out


def built(root: Path, stamp: str, proof: dict = None) -> Path:
    build = root / "builds" / stamp
    build.mkdir(parents=True)
    (build / "build-info.json").write_text(json.dumps({"stamp": stamp, "cuda_archs": ["90"], "cmake_args": ["-D"],
                                                       "proof": proof or {"devices_used": ["CUDA0"], "tokens": 8}}))
    (build / "cubins.txt").write_text("a.sm_90.cubin\nb.sm_90.cubin\n")
    (build / "version.txt").write_text("version: 1 (abc)\n")
    os.symlink(stamp, root / "builds/current")
    return build


def test_both_cases_of_one_machine_make_one_stamped_result(tmp_path, monkeypatch):
    root, state = tmp_path / "root", tmp_path / "state/gpu-build-proof.json"
    monkeypatch.setattr(report, "machine", lambda: {"gpu": "NVIDIA H100 (compute capability 9.0, 81559 MiB)"})
    built(root, "2b5f9fcb7c40fa23")
    out = command_out(tmp_path, "one", {"deploy1": (0, 398, "-", "built\n"), "deploy2": (0, 3, "-", "nothing\n")})
    common = ["--root", str(root), "--jobs", "16", "--state", str(state.parent)]
    monkeypatch.setenv("BENCH_COMMAND", "bash bench/gpu/build_proof.sh right")
    assert report.main(["right", "--out", str(out), *common]) == 0
    refusal = ("[@local] llama.cpp build 1b8c cannot compute, refusing it\n"
               "[@local] 0.00.348 E CUDA error: no kernel image is available for execution on the device\n")
    out = command_out(tmp_path, "two", {"wrong_arch": (1, 328, "2", refusal)})
    monkeypatch.setenv("BENCH_COMMAND", "bash bench/gpu/build_proof.sh wrong")
    assert report.main(["wrong", "--out", str(out), "--at-start", "2b5f9fcb7c40fa23", *common]) == 0
    result = json.loads((out / "gpu-build-proof.json").read_text())
    assert result == json.loads(state.read_text())
    first = result["right_arch"]["first_deploy"]
    assert (first["rc"], first["seconds"], first["jobs"], first["cubins"], first["cuda_archs"]) == (0, 398, 16, 2,
                                                                                                    ["90"])
    assert result["right_arch"]["second_deploy"] == {"rc": 0, "seconds": 3, "changed_operations": 0}  # "-": none
    assert result["right_arch"]["proof"]["devices_used"] == ["CUDA0"]
    wrong = result["wrong_arch"]
    assert wrong["deploy"] == {"rc": 1, "seconds": 328, "changed_operations": 2}
    assert wrong["current_at_start"] == wrong["current_at_end"] == "2b5f9fcb7c40fa23"
    assert wrong["output"][-1].endswith("no kernel image is available for execution on the device")
    assert [r["command"] for r in result["provenance"]["runs"]] == ["bash bench/gpu/build_proof.sh right",
                                                                    "bash bench/gpu/build_proof.sh wrong"]
    assert {"bench/gpu/build_report.py", "bench/gpu/build_proof.sh", "bench/gpu/build_deploy.py"} \
        <= set(result["provenance"]["scripts"])  # fmt: skip


def test_the_driver_passes_the_settings_this_tree_accepts():
    text = (ROOT / "bench/gpu/build_proof.sh").read_text()
    assert "--data llamarack_allow_shared_dirs=True" in text and "ROOT=/tmp/llamarack" in text


def test_the_quality_case_reads_each_tools_figures_from_its_log(tmp_path, monkeypatch):
    root, state = tmp_path / "root", tmp_path / "state"
    monkeypatch.setattr(report, "machine", lambda: {"gpu": "NVIDIA H100 (compute capability 9.0, 81559 MiB)"})
    proof = {"variant": "native", "runtime_args": [], "batch": 512, "tools": ["llama-perplexity", "llama-bench"],
             "devices_used": ["CUDA0 (NVIDIA H100 80GB HBM3)"], "gpu_mib": 602, "offloaded": "3/3"}
    smoke = built(root, "7c1d0e5a9b3f2468", proof) / "smoke"
    smoke.mkdir()
    (smoke / "perplexity-base.log").write_text("Final estimate: PPL = 303.0368 +/- 12.34567\n")
    for kv, kld in (("f16", "0.004494"), ("q4_0", "0.007396")):
        (smoke / f"perplexity-kv-{kv}.log").write_text(f"Mean PPL(Q)                   : 296.141369 ±   9.876543\n"
                                                       f"Mean    KLD:   {kld} ±   0.000123\n")
    (smoke / "bench.log").write_text("| model | size | params | backend | ngl | test | t/s |\n"
                                     "| llama ?B Q4_K - Medium | 1.23 MiB | 1.23 M | CUDA | 99 | pp512 | "
                                     "160409.19 ± 1234.56 |\n")  # fmt: skip
    out = command_out(tmp_path, "q", {"quality1": (0, 310, "5", "built\n"), "quality2": (0, 2, "-", "nothing\n")})
    monkeypatch.setenv("BENCH_COMMAND", "bash bench/gpu/build_proof.sh quality")
    assert report.main(["quality", "--out", str(out), "--root", str(root), "--jobs", "16", "--state", str(state),
                        "--at-start", "2b5f9fcb7c40fa23"]) == 0  # fmt: skip
    result = json.loads((out / "gpu-build-proof-tools.json").read_text())
    assert not (out / "gpu-build-proof.json").exists() and (state / "gpu-build-proof-tools.json").is_file()
    q = result["quality"]
    assert q["first_deploy"]["note"] == "a new build stamp: llama-perplexity among the targets"
    assert q["second_deploy"] == {"rc": 0, "seconds": 2, "changed_operations": 0} and q["proof"] == proof
    assert q["kl_divergence"] == [{"kv": "f16", "mean_kld": 0.004494, "ppl_base": 303.0368, "ppl_quant": 296.141369},
                                  {"kv": "q4_0", "mean_kld": 0.007396, "ppl_base": 303.0368, "ppl_quant": 296.141369}]
    assert q["bench_pp512_tokens_per_second"] == 160409.19
    assert result["provenance"]["command"] == "bash bench/gpu/build_proof.sh quality"
    row = gpu.tools_row(result)
    assert "on CUDA0 (NVIDIA H100 80GB HBM3): 3/3 layers, 602 MiB; llama-bench pp512 160,409 t/s; KLD f16 0.0045" in row
    assert "`quality`: first deploy 310 s (rc 0; a new build stamp: llama-perplexity among the targets)" in row


CUOBJDUMP = "".join(f"ELF file    {i}: libggml-cuda.so.0.25.{i}.sm_90.cubin\n" for i in range(1, 4))  # the H100's


def shipped_build(root: Path, cpu_flags: list, compiled: bool) -> Path:
    """A build as the role leaves it (bin -> build/bin), its CPU library compiled here with ``cpu_flags``."""
    build = built(root, "4fa7460a72c1e963")
    (build / "build/bin").mkdir(parents=True)
    (build / "bin").symlink_to("build/bin")
    src = root / "dot.c"
    src.write_text("float dot(const float *a, const float *b, int n) { float s = 0; "
                   "for (int i = 0; i < n; i++) s += a[i] * b[i]; return s; }\n")
    subprocess.run(["gcc", "-O3", "-shared", "-fPIC", *cpu_flags, "-o", str(build / "build/bin/libggml-cpu.so.0.25.3"),
                    str(src)], check=True)  # fmt: skip
    (build / "build/bin/libggml-cuda.so.0.25.3").write_bytes(b"\x7fELF cuda")
    (build / "build/bin/llama-server").write_bytes(b"\x7fELF server")
    if compiled:
        (build / "build/CMakeCache.txt").write_text("CMAKE_BUILD_TYPE:STRING=Release\n")
    return build


def test_the_ship_case_checks_the_received_artifact_itself(tmp_path, monkeypatch):
    maker, receiver, ship_dir = tmp_path / "maker", tmp_path / "receiver", tmp_path / "ship"
    monkeypatch.setattr(report, "machine", lambda: {"gpu": "NVIDIA H100 (compute capability 9.0, 81559 MiB)"})
    monkeypatch.setattr(report, "sh", lambda *argv: CUOBJDUMP if argv[0] == "cuobjdump" else "")
    baseline = ["-mavx2", "-mfma", "-mf16c"]
    shipped_build(maker, baseline, compiled=True)
    got = shipped_build(receiver, baseline, compiled=False)
    ship_dir.mkdir()
    (ship_dir / "4fa7460a72c1e963.json").write_text(json.dumps({"path": "x.tar", "sha256": "96a0", "bytes": 97751040,
                                                               "source": "@local"}))  # fmt: skip
    said = "[@local] llama.cpp build 4fa7460a72c1e963: receiving it from @local (93 MiB), not compiling it\n"
    out = command_out(tmp_path, "one", {"maker": (0, 247, 4, "built\n"), "maker_again": (0, 2, 0, ""),
                                        "receiver": (0, 6, 4, said), "receiver_again": (0, 2, 0, "")})  # fmt: skip
    args = ["ship", "--root", str(maker), "--receiver", str(receiver), "--ship-dir", str(ship_dir), "--out", str(out),
            "--jobs", "16", "--state", str(tmp_path / "state")]  # fmt: skip
    assert report.main(args) == 0
    ship = json.loads((out / "gpu-ship-proof.json").read_text())["ship"]
    assert ship["receiver"]["said"] == [said.strip()] and ship["shipped"][0]["bytes"] == 97751040
    assert ship["same_files"] == {"files": 3, "identical": True, "differ": []}
    assert ship["cmake_cache"] == {"maker": True, "receiver": False}
    art = ship["artifact"]
    assert (art["cubins"], art["cubin_archs"], art["cuda_library"]) == (3, ["sm_90"], "libggml-cuda.so.0.25.3")
    cpu = art["cpu_code"]["libggml-cpu.so.0.25.3"]
    assert cpu["avx512_zmm"] == 0 and cpu["avx2_ymm"] > 0 and cpu["instructions"] > 10
    row = gpu.ship_row(json.loads((out / "gpu-ship-proof.json").read_text()))
    assert "0 naming an AVX-512 register" in row and "3 files byte for byte the same" in row and "all sm_90" in row

    # the checks can fail: a flipped byte in transit, CPU code tuned to the building host's AVX-512
    data = bytearray((got / "build/bin/llama-server").read_bytes())
    data[-1] ^= 1
    (got / "build/bin/llama-server").write_bytes(bytes(data))
    subprocess.run(["gcc", "-O3", "-shared", "-fPIC", "-mavx512f", "-mprefer-vector-width=512", "-o",
                    str(got / "build/bin/libggml-cpu.so.0.25.3"), str(receiver / "dot.c")], check=True)  # fmt: skip
    assert report.main(args) == 0
    ship = json.loads((out / "gpu-ship-proof.json").read_text())["ship"]
    assert ship["same_files"]["differ"] == ["libggml-cpu.so.0.25.3", "llama-server"]
    assert ship["artifact"]["cpu_code"]["libggml-cpu.so.0.25.3"]["avx512_zmm"] > 0
    assert "differing: libggml-cpu.so.0.25.3, llama-server" in gpu.ship_row(json.loads(
        (out / "gpu-ship-proof.json").read_text()))
