"""bench/gpu/proof.py's logic, on this machine: the lab found under lab/, the model role's
steps through the systemd-run stand-in where no systemd runs, a phase whose product route
fell back recorded as not ok (its figures kept, the route named), the summary's roofline
and served label, each command's stamp, and results of several machines merged."""

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_proof", ROOT / "bench/gpu/proof.py")
proof = sys.modules.setdefault("gpu_proof", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(proof)


def test_the_lab_package_is_found_under_lab(tmp_path):
    # -S: no site-packages, so no installed lab: only PYTHONPATH can find it.
    r = subprocess.run([sys.executable, "-S", "-c", "import llamarack_lab.hub_server as h; print(h.__file__)"],
                       cwd=tmp_path, env=proof.lab_env(), capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(ROOT / "lab/llamarack_lab/hub_server.py")
    assert "PYTHONPATH=/tmp/site:$PWD:$PWD/lab " in (ROOT / "bench/gpu/proof.sh").read_text()


def test_without_systemd_the_model_role_runs_through_the_stand_in(tmp_path, monkeypatch):
    monkeypatch.setattr(proof.shutil, "which", lambda name: None)
    said, path = proof.systemd_run_path(tmp_path)
    assert said == proof.FAKE_SYSTEMD_RUN and "neither as the pipeline user nor in the sandbox" in said
    first = Path(path.split(os.pathsep)[0])
    assert os.access(first / "systemd-run", os.X_OK)
    r = subprocess.run(["systemd-run", "--quiet", "--wait", "--pipe", "--collect", "--uid=root",
                        f"--working-directory={tmp_path}", "-p", "PrivateTmp=yes", "--", "sh", "-c", "pwd"],
                       env={**os.environ, "PATH": path}, capture_output=True, text=True)  # fmt: skip
    assert r.stdout.strip() == str(tmp_path)


def test_a_fallback_is_not_ok_but_its_model_serves_the_later_phases():
    fell_back = {"ok": False, "rc": 1, "route": "fallback: made another way",
                 "fallback": {"ok": True, "gguf_bytes": 4_000_000_000}}  # fmt: skip
    assert proof.done(fell_back) and not fell_back["ok"]
    assert not proof.done({"ok": False, "fallback": {"ok": False}}) and proof.done({"ok": True})
    assert proof.model_8b(fell_back) == {"route": "fallback: made another way", "made_by_the_role": False,
                                         "systemd_run": None, "gguf_bytes": 4_000_000_000}  # fmt: skip


def bench_row(n_prompt, n_gen, ts, **kw):
    return {"n_prompt": n_prompt, "n_gen": n_gen, "avg_ts": ts, **kw}


def phases(model8b: dict) -> dict:
    flags = ["-ctk", "f16", "-ctv", "f16", "-ngl", "33", "-fa", "on", "-lm", "none"]
    decode = {"median_tps": 240.0, "tokens_sha256": "ab"}
    return {
        "model8b": model8b, "roofline": {"ok": True, "bandwidth_GBps": 4000.0},
        "bench8b": {"ok": True, "served_flags": flags, "runs": {
            "served_flags": {"results": [bench_row(512, 0, 9000.0), bench_row(0, 128, 270.0)]},
            "cuda_graphs_off": {"results": [bench_row(0, 128, 243.0)]}}},
        "serve8b": {"ok": True, "plan": {"exec_start": ["llama-server"]}, "decode_default_sampling": decode,
                    "decode_greedy": decode, "prefill_single_pp512": {"median_tps": 9500.0}},
    }  # fmt: skip


def test_the_summary_keeps_the_roofline_on_the_fallback_and_labels_the_served_kv_from_its_flags():
    fell_back = {"ok": False, "route": "fallback: x", "fallback": {"ok": True, "gguf_bytes": 4 * 10**9}}
    for model in ({"ok": True, "gguf_bytes": 4 * 10**9, "route": "the model role"}, fell_back):
        s = proof.summarize({"phases": phases(model)})
        assert s["decode_8b"]["roofline_tps"] == 1000.0 and s["decode_8b"]["served_roofline_fraction"] == 0.24
        assert s["model_8b"]["made_by_the_role"] is model["ok"]
        variants = s["decode_8b"]["llama_bench_tg128_variants"]
        assert variants["f16_kv_fa_on (served)"] == 270.0 and variants["f16_kv_fa_on_cuda_graphs_off"] == 243.0
    assert proof.served_label(["-ctk", "q4_0", "-fa", "1"]) == "q4_0_kv_fa_on"
    assert proof.served_label(["-ngl", "99"]) == "f16_kv_fa_auto"


def args(tmp_path, limit=500.0) -> argparse.Namespace:
    return argparse.Namespace(work=str(tmp_path / "work"), out=str(tmp_path / "out"), cpu_check="/nonexistent",
                              root=str(tmp_path / "root"), commit="c" * 40, limit=limit)  # fmt: skip


def test_a_fallen_back_phase_is_recorded_not_ok_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(proof, "T0", time.time())  # the command's start: its time limit counts from there
    monkeypatch.setattr(proof.Proof, "PHASES", (("build", 1), ("model8b", 1), ("roofline", 1)))
    monkeypatch.setattr(proof.Proof, "start_checkpoint", lambda self: None)
    monkeypatch.setattr(proof.Proof, "build", lambda self: {"ok": True})
    monkeypatch.setattr(proof.Proof, "model8b", lambda self: {"ok": False, "route": "fallback: x",
                                                              "fallback": {"ok": True, "gguf_bytes": 1}})
    monkeypatch.setattr(proof.Proof, "roofline", lambda self: {"ok": True})
    first = proof.Proof(args(tmp_path))
    first.run({"build", "model8b"})
    result = json.loads((tmp_path / "out/gpu-proof.json").read_text())
    assert result["phases"]["model8b"]["ok"] is False and result["phases"]["model8b"]["run"] == 0
    assert result["provenance"]["runs"][0]["command"].startswith("python3 ")
    second = proof.Proof(args(tmp_path))  # a later command on the same machine
    second.run({"build", "model8b", "roofline"})
    result = json.loads((tmp_path / "out/gpu-proof.json").read_text())
    assert result["phases"]["roofline"] == {"ok": True, "phase_seconds": 0.0, "run": 1}
    assert result["phases"]["model8b"]["run"] == 0  # done by its fallback: not run again
    assert len(result["provenance"]["runs"]) == 2 and result["provenance"]["mixed"] is False


def test_results_of_two_machines_merge_phase_by_phase(tmp_path):
    stamp = proof.provenance.stamp(proof.__file__)
    one = {"phases": {"build": {"ok": True, "run": 0}, "serve8b": {"ok": False, "run": 1}},
           "machine": {"cpus": 16}, "provenance": proof.provenance.joined(stamp, stamp)}
    two = {"phases": {"build": {"ok": True, "run": 0, "seconds": 9}, "serve8b": {"ok": True, "run": 0}},
           "machine": {"cpus": 32}, "provenance": stamp}  # fmt: skip
    paths = []
    for name, r in (("one", one), ("two", two)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(r))
    merged = proof.merge([str(p) for p in paths])
    assert merged["phases"]["build"] == {"ok": True, "run": 0} and merged["phases"]["serve8b"]["run"] == 2
    assert len(merged["provenance"]["runs"]) == 3 and merged["machine"] == {"cpus": 16}
    assert merged["provenance"]["merged_by"]["command"].startswith("python3 ")
    assert "memory8b" in merged["not_run"] and "summary" in merged


@pytest.mark.parametrize("name", ["build_deploy.py", "model_deploy.py", "proof.sh", "random_model.py"])
def test_what_ran_beside_the_proof_is_hashed_in_its_stamp(name):
    assert f"bench/gpu/{name}" in proof.RAN_WITH and (ROOT / "bench/gpu" / name).is_file()
