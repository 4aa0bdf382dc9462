"""bench/gpu/build_report.py: the build proof's result made by its script from what
build_proof.sh left (each deploy's status, seconds and changes, the role's build record,
the refusal of the wrong arch), both cases of one warm machine in one result, stamped."""

import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_build_report", ROOT / "bench/gpu/build_report.py")
report = sys.modules.setdefault("gpu_build_report", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(report)

TOTALS = "    Grand total          1          {}          0          0\n"


def command_out(tmp_path: Path, name: str, deploys: dict) -> Path:
    out = tmp_path / name
    out.mkdir()
    for deploy, (rc, seconds, changed, text) in deploys.items():
        with open(out / "steps.tsv", "a") as f:
            f.write(f"{deploy}\t{rc}\t{seconds}\n")
        (out / f"{deploy}.log").write_text(text + TOTALS.format(changed))
    return out


def built(root: Path, stamp: str) -> None:
    build = root / "builds" / stamp
    build.mkdir(parents=True)
    (build / "build-info.json").write_text(json.dumps({"stamp": stamp, "cuda_archs": ["90"], "cmake_args": ["-D"],
                                                       "proof": {"devices_used": ["CUDA0"], "tokens": 8}}))
    (build / "cubins.txt").write_text("a.sm_90.cubin\nb.sm_90.cubin\n")
    (build / "version.txt").write_text("version: 1 (abc)\n")
    os.symlink(stamp, root / "builds/current")


def test_both_cases_of_one_machine_make_one_stamped_result(tmp_path, monkeypatch):
    root, state = tmp_path / "root", tmp_path / "state/gpu-build-proof.json"
    monkeypatch.setattr(report, "machine", lambda: {"gpu": "NVIDIA H100 (compute capability 9.0, 81559 MiB)"})
    built(root, "2b5f9fcb7c40fa23")
    out = command_out(tmp_path, "one", {"deploy1": (0, 398, "-", "built\n"), "deploy2": (0, 3, "-", "nothing\n")})
    common = ["--root", str(root), "--jobs", "16", "--state", str(state)]
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
