"""docs/benchmarks.md is generated from bench/results/ (bench/benchmarks_doc.py): the
committed page is what the committed results render; each section names its result's
command, commit, machine and scripts, or says the result predates the stamp; the figures
of each result's current shape (a fallback, the product's residency cause, the scripted
build proof, a move from an older llamarack) render as they are."""

import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
_spec = importlib.util.spec_from_file_location("benchmarks_doc", ROOT / "bench/benchmarks_doc.py")
doc = sys.modules.setdefault("benchmarks_doc", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(doc)

import benchmarks_doc_gpu as gpu  # noqa: E402  (bench/, after benchmarks_doc)

COMMITTED = doc.Results(doc.RESULTS)


def test_the_committed_page_is_what_the_committed_results_render():
    page = doc.render(COMMITTED, doc.TEMPLATE.read_text())
    assert doc.DOC.read_text() == page, "run: python3 bench/benchmarks_doc.py"
    assert doc.main(["--check"]) == 0


def test_every_place_of_the_template_is_rendered_and_every_result_is_named():
    places = set(doc.PLACE.findall(doc.TEMPLATE.read_text()))
    assert places == set(doc.lab_sections()) | set(gpu.gpu_sections())
    page = doc.DOC.read_text()
    assert all(f"`{p.name}`" in page for p in doc.RESULTS.glob("*.json")), "a result the page does not name"


# An audit result as an earlier script wrote it: no stamp.
UNSTAMPED_AUDIT = {"date": "2026-12-05", "machine": {"cpu": "AMD EPYC", "cores": 2, "python": "3.11.7"}, "hosts": 5,
                   "audit_s": {"median": 1.465, "runs": [1.735, 1.65, 1.65, 1.465, 1.405, 1.422, 1.301]},
                   "ssh_true_fan_out_s": {"median": 0.395}, "audit_control_cpu_s": 0.807,
                   "remote_commands_per_host": {"lab-v100-a": 1, "lab-gw": 1},
                   "script_bytes": {"lab-v100-a": 47621, "lab-gw": 8509},
                   "hosts_unchanged": {"lab-v100-a": True, "lab-gw": True}}  # fmt: skip


def stamp(**over) -> dict:
    return {"schema": "llamarack-bench-provenance/1", "commit": "0123456789abcdef" * 2 + "01234567",
            "commit_from": "git", "tree": "clean", "changed": [], "command": "python3 bench/audit_bench.py --reuse",
            "scripts": {"bench/audit_bench.py": "a" * 64, "bench/provenance.py": "b" * 64},
            "started": "2026-12-10T10:00:00+00:00", "written": "2026-12-10T10:05:00+00:00",
            "machine": {"cpu": "AMD EPYC 7B13", "cores": 2, "memory_gib": 23.5, "kernel": "6.1", "os": "Debian 12",
                        "python": "3.11.7", "gpus": []}, **over}  # fmt: skip


def test_a_stamped_result_names_its_command_commit_machine_and_scripts():
    line = doc.source("audit", {"provenance": stamp()})
    assert line == ("Result `audit.json`: `python3 bench/audit_bench.py --reuse`, at commit `0123456789` (clean tree); "
                    "AMD EPYC 7B13, 2 cores, 23.5 GiB; Debian 12; 2026-12-10. sha256: `bench/audit_bench.py` "
                    "aaaaaaaaaaaa, `bench/provenance.py` bbbbbbbbbbbb.")  # fmt: skip
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "driver": "580.95.05", "memory": "81559 MiB", "compute_cap": "9.0"}]
    machine = {**stamp()["machine"], "gpus": gpus}
    runs = [{"command": "bash bench/gpu/awq.sh"}, {"command": "bash bench/gpu/awq.sh check"}]
    line = doc.source("gpu-awq", {"provenance": stamp(tree="dirty", changed=["roles/x.py"], machine=machine,
                                                      runs=runs, mixed=True, command="bash bench/gpu/awq.sh check")})
    assert "2 commands, the last `bash bench/gpu/awq.sh check`" in line and "(tree dirty: roles/x.py)" in line
    assert "NVIDIA H100 80GB HBM3, driver 580.95.05, 81559 MiB; AMD EPYC" in line
    assert line.endswith("**Its commands ran different commits or scripts.**")


def test_an_unstamped_result_says_so_and_a_missing_one_renders_no_figure():
    line = doc.source("audit", UNSTAMPED_AUDIT)
    assert line == f"Result `audit.json` ({doc.NOT_STAMPED}: no commit or script recorded): AMD EPYC, 2 cores, 2026-12-05."
    assert doc.section("audit", None, doc.audit_body) == "No result `audit.json` yet: its script writes it."


def test_the_residency_cause_renders_as_the_product_worked_it_out():
    r = copy.deepcopy(COMMITTED("gpu-residency"))
    r["device_denied"].update(unit_allows=["nvidia", "nvidiactl", "nvidia-uvm"], unit_denies=[],
                              residency="no CUDA device: llama-server is on no card (failed to initialize CUDA)")
    r["unit_denies"] = {**r["device_denied"], "unit_allows": ["nvidia-uvm"], "unit_denies": ["nvidia", "nvidiactl"],
                        "residency": "device denied: the unit does not allow nvidia, nvidiactl, so llama-server "
                                     "serves from the CPU"}  # fmt: skip
    text = gpu.residency_body(r)
    assert "handed to the check" not in text
    assert ('the residency check: "no CUDA device: llama-server is on no card (failed to initialize CUDA)" (the unit '
            "allows nvidia, nvidiactl, nvidia-uvm; its rule denies none of the nodes)") in text
    assert "- The same, a unit without the `nvidia` and `nvidiactl` lines: served from the CPU" in text
    assert "its rule denies nvidia, nvidiactl)" in text
    # a result from before the product worked the cause out: no unit_allows in its case
    old = copy.deepcopy(COMMITTED("gpu-residency"))
    for key in ("unit_allows", "unit_denies"):
        old["device_denied"].pop(key, None)
    assert "handed to the check by the harness" in gpu.residency_body(old)


def test_a_model_made_by_the_fallback_is_said_and_the_roofline_kept():
    r = copy.deepcopy(COMMITTED("gpu-proof"))
    r["phases"]["model8b"]["ok"] = False
    r["summary"]["model_8b"] = {"route": "fallback: the model role failed (see deploy-model.log)",
                                "made_by_the_role": False, "systemd_run": None, "gguf_bytes": 4916265056}
    text = gpu.proof_body(r)
    assert "- **The 8B model was not made by the model role** (the phase `model8b` is not ok): fallback: the " in text
    roofline = gpu.num(r["summary"]["decode_8b"]["roofline_tps"])
    assert "- Phases not ok: model8b." in text and f"a copy-bandwidth roofline of {roofline} (" in text
    r["summary"]["model_8b"] = {"made_by_the_role": True, "systemd_run": "tests/support/fake_systemd_run.py, the "
                                                                         "unit tests' stand-in"}
    assert "made by the model role, its steps through tests/support/fake_systemd_run.py." in gpu.proof_body(r)


def build_proof() -> dict:
    return {"machine": {"gpu": "NVIDIA H100 80GB HBM3 (compute capability 9.0, 81559 MiB)", "cpus": 16},
            "right_arch": {"first_deploy": {"rc": 0, "seconds": 412, "jobs": 16, "cubins": 144, "cuda_archs": ["90"]},
                           "second_deploy": {"rc": 0, "seconds": 4, "changed_operations": 0},
                           "proof": {"devices_used": ["CUDA0"], "tokens_per_second": 1012.3}},
            "wrong_arch": {"settings": {"llamacpp_cuda_archs": ["80-real"]}, "deploy": {"rc": 1, "seconds": 330},
                           "current_at_start": "2b5f9fcb7c40fa23", "current_at_end": "2b5f9fcb7c40fa23",
                           "output": ["[@local] 0.00.3 E CUDA error: no kernel image is available"]},
            "provenance": stamp(command="bash bench/gpu/build_proof.sh wrong")}  # fmt: skip


def test_the_scripted_build_proof_renders_both_cases():
    row = gpu.build_proof_row(build_proof())
    assert "first deploy 412 s (rc 0) on 16 jobs, second 4 s (rc 0) with no change; 144 cubins for arch 90" in row
    assert "the smoke run on CUDA0: 1,012.3 tokens/s" in row
    assert ('refused with "CUDA error: no kernel image is available"; `builds/current` unchanged (2b5f9fcb7c40fa23 '
            "before, 2b5f9fcb7c40fa23 after)") in row  # fmt: skip
    moved = build_proof()
    moved["wrong_arch"]["current_at_end"] = "1b8c86e6ec117593"
    del moved["right_arch"]
    row = gpu.build_proof_row(moved)
    assert "no right-arch deploy in this result" in row and "`builds/current` **changed**" in row


def test_a_move_from_an_older_llamarack_renders_only_where_measured():
    r = copy.deepcopy(COMMITTED("tool-upgrade"))
    assert "No move from an older llamarack is in this result" in doc.tool_upgrade_body(r)
    step = {"seconds": 6.5, "changed_operations": 8, "reproved_builds": 4, "hosts_with_a_new_build_or_restart": []}
    r["cross_version"] = {"from": "14f3510f66b19ee78286f4f178d7858860246fe5", "onto_older": step,
                          "older_converged": step, "plan_upgrade": ["lab-t4: 2 change(s)"], "upgrade_deploy": step,
                          "error": {"step": "next_deploy", "said": "deploy failed (rc 1)"}}  # fmt: skip
    text = doc.tool_upgrade_body(r)
    assert "From commit `14f3510f66`'s llamarack to this one: put on it: 6.50 s, 8 changed operations" in text
    assert "    lab-t4: 2 change(s)" in text and "**next_deploy failed**: deploy failed (rc 1)" in text


def test_a_paced_rollout_renders_its_table_without_the_old_versions_notes():
    r = {"load": {"pace_s": 0.25, "n_predict": 16}, "provenance": stamp(),
         "baseline": {"seconds": 60.0, "load": {"sent": 240, "failed": 0, "seconds_with_failure": 0, "p50_s": 0.01,
                                                "p99_s": 0.1}}}  # fmt: skip
    text = doc.rollout_body(r)
    assert text.splitlines()[2] == "| quiet baseline | 60.0 | 240 | 0 | 0 | 10.0 | 100.0 |  |  |"
    assert "not the paced one" not in text and "mixes" not in text
    # an unstamped result of an earlier script: a closed loop, its baseline measured again later
    old = doc.rollout_body({"load": {"n_predict": 8}, "baseline": {**r["baseline"], "when": "2026-11-30T10:00:00"}})
    assert "not the paced one above" in old and "the result mixes two versions" in old


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "bench/results").glob("*.json")))
def test_each_committed_result_is_read_by_a_section(name):
    assert isinstance(COMMITTED(name), dict)
    assert f"Result `{name}.json`" in doc.DOC.read_text()


def test_the_stamp_is_read_from_results_written_by_the_scripts(tmp_path):
    (tmp_path / "audit.json").write_text(json.dumps({**UNSTAMPED_AUDIT, "provenance": stamp()}))
    page = doc.render(doc.Results(tmp_path), "{{ audit }}")
    assert page.startswith("Result `audit.json`: `python3 bench/audit_bench.py --reuse`, at commit `0123456789`")
    assert "took 1.47 s (median of 7; 1.30 to 1.74 s)" in page
    assert doc.render(doc.Results(tmp_path), "{{ converged }}").startswith("No result `converged.json` yet")


def test_the_build_tools_layers_and_sleep_results_render_their_figures():
    page = doc.DOC.read_text()
    assert ("on CUDA0 (NVIDIA H100 80GB HBM3): 3/3 layers, 602 MiB; llama-bench pp512 215,514 t/s; KLD f16 0.0045, "
            "q4_0 0.0074, q8_0 0.0044") in page  # fmt: skip
    assert "`quality`: first deploy 312 s (rc 0; a new build stamp: llama-perplexity among the targets), second 3 s" in page
    assert ('`--n-gpu-layers 1` at verbosity 4: `offloaded 1/3 layers to GPU`; the check refused it: "fewer layers '
            'offloaded than planned: 1/3" (528 MiB on the card)') in page  # fmt: skip
    assert "`--n-gpu-layers 1` at llama.cpp's default verbosity: no layer line in the log; the check passed it" in page
    assert "held 1,052 MiB of the card awake, 586 MiB asleep (it gave back 466 MiB" in page
    woke = {**COMMITTED("gpu-sleep"), "asleep_after_health_metrics_props": False}
    assert "**`/health`, `/metrics` or `/props` woke it**" in gpu.sleep_body(woke)


def test_the_host_ram_result_renders_each_case_against_its_share():
    r = COMMITTED("cpu-host-ram")
    text = gpu.host_ram_body(r)
    # the ledger's and llama.cpp's figures are the plan's and the log's; the resident memory is the run's own
    c = r["cases"]["cache8"]
    rss = f"{c['rss_mib'][0]['VmRSS']} / {c['rss_mib'][-1]['VmRSS']} ({c['rss_mib'][-1]['VmHWM']})"
    row = f"| cache8 | 8 | 44.0 (1.0 + 2.0 + 6.0 + 27.0 + 8.0) | 1.02 + 2.00 + 6.01 | {rss} | {c['rss_minus_ledger_mib']} |"
    assert row in text
    assert "within 0.02 MiB of the ledger's weights, KV and compute" in text
    beyond = r["cases"]["cache0"]["beyond_buffers_mib"]
    assert f"With the prompt cache off (cache0), VmRSS was {beyond} MiB beyond them" in text
    over = copy.deepcopy(COMMITTED("cpu-host-ram"))
    over["cases"]["cache8"]["within_ledger"] = False
    assert f"| {c['rss_minus_ledger_mib']} **over its share** |" in gpu.host_ram_body(over)
    both = gpu.host_ram(COMMITTED)
    assert "A CPU build" in both and "A CUDA build" in both  # the GPU machine's result beside this one's
    assert "No result `gpu-host-ram.json` yet" in gpu.host_ram(lambda name: None if name == "gpu-host-ram"
                                                                 else COMMITTED(name))  # fmt: skip


def test_an_affinity_result_renders_each_case():
    summary = {"sent": 144, "failed": 1, "reasons": ["HTTP 503"], "cached_share": 0.9731, "turns_cached_enough": 0.95,
               "ttft_first_p50_s": 0.0412, "ttft_first_p90_s": 0.09, "ttft_returning_p50_s": 0.021,
               "ttft_returning_p90_s": 0.05}  # fmt: skip
    r = {"load": {"conversations": 24, "turns": 6, "concurrency": 6, "max_tokens": 16, "url": "http://10.0.0.9:8000"},
         "leastconn": {"balance": "leastconn", "summary": {**summary, "failed": 0, "reasons": []}},
         "affinity": {"balance": "affinity", "summary": summary}, "provenance": stamp()}  # fmt: skip
    text = doc.affinity_body(r)
    assert text.startswith("24 conversations of 6 turns, 6 at once, 16 tokens an answer, through http://10.0.0.9:8000")
    assert "| affinity | 144 | 1 | 97% | 95% | 0.041 s / 0.090 s | 0.021 s / 0.050 s |" in text
    assert text.endswith("Why turns failed: affinity: HTTP 503.")
    assert doc.section("affinity", None, doc.affinity_body) == "No result `affinity.json` yet: its script writes it."


def test_the_cpu_profiles_table_says_where_each_build_computed():
    ran = {"computed": True, "rc": 0, "signal": None, "tokens_per_second": {"pp16": 120.5, "tg8": 60.25}}
    died = {"computed": False, "rc": -4, "signal": "SIGILL", "tokens_per_second": {}}
    result = {"qemu": "qemu-x86_64 version 7.2.18", "shipped_runs_where_the_rule_passes_and_only_there": True,
              "builds": {"shipped": {"build_exit_code": 0, "build_s": 600.0, "cpu_code": {
                  "libggml-cpu.so": {"instructions": 1000, "avx512_zmm": 0, "avx2_ymm": 300}}}},
              "profiles": [{"profile": "Haswell", "qemu_cpu": "Haswell-v4", "what": "x86-64-v3",
                            "cpu_reports": ["avx2"], "rule_for_shipped": {"passes": True}, "shipped": ran,
                            "native": died},
                           {"profile": "Westmere", "qemu_cpu": "Westmere-v1", "what": "x86-64-v2",
                            "cpu_reports": ["sse4_2"], "shipped": died, "native": died,
                            "rule_for_shipped": {"passes": False, "found": "a CPU without avx"}}]}  # fmt: skip
    body = gpu.cpu_profiles_body(result)
    assert "| Haswell (QEMU `Haswell-v4`): x86-64-v3 | avx2 | passes | computed (pp16 120.5 t/s, tg8 60.2 t/s) | " \
           "**died: SIGILL** |" in body  # fmt: skip
    assert "| refuses: a CPU without avx | **died: SIGILL** |" in body
    assert "0 naming an AVX-512 register" in body and body.endswith("on no other: yes.")
