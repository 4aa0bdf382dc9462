"""The model role's route awq and quality measurement: settings, stamp, commands, parsers, the bound."""

import json
import re
import subprocess
import sys

import pytest

from llamarack import remote
from llamarack.errors import ModelSourceError, SettingsError
from roles.model.files import awq_apply, model_quality
from roles.model.plan import plan_from_record, plan_model
from roles.llamacpp.reads import ServerFlags
from roles.model.reads import ArtifactState
from tests.roles.test_model_ops import LISTING, SHA, STAMP, commands, on_host
from tests.support import fake_systemd_run

BASE = {"python_env_backend": "venv", "llamacpp_backend": "cpu", "model_repo": "org/tiny", "model_revision": SHA,
        "llamarack_root": "/opt/lr", "model_quality": True}  # fmt: skip


def settings(**data):
    from roles.settings import load_settings

    return load_settings("gpu01", {**BASE, **data})


def awq_plan(**data):
    return plan_model(settings(model_route="awq", **data), LISTING)


# -- settings --


def test_defaults_are_the_gguf_route_unmeasured_and_autoawqs_quant_config():
    from roles.settings import load_settings

    m = load_settings("gpu01", {k: v for k, v in BASE.items() if k != "model_quality"}).model
    assert (m.route, m.quality, m.quality_max_kld, m.keep_f16) == ("gguf", False, None, False)
    assert (m.awq_zero_point, m.awq_q_group_size, m.awq_w_bit, m.awq_version) == (True, 128, 4, "GEMM")


@pytest.mark.parametrize("data, message", [
    ({"model_route": "awq", "model_source": "url", "model_url": "https://m/x.gguf", "model_sha256": "3" * 64},
     "model_route: given 'awq' with model_source='url'; allowed: 'gguf'"),
    ({"model_route": "awq", "model_quant": "F16"}, "model_route: given 'awq' with model_quant='F16'"),
    ({"model_quality": False, "model_quality_max_kld": 0.1},
     "model_quality_max_kld: given 0.1; allowed: None unless model_quality is True"),
    ({"model_awq_w_bit": 3}, "model_awq_w_bit: given 3; allowed: an integer from 4 to 4"),
    ({"model_awq_q_group_size": 100}, "model_awq_q_group_size: given 100; allowed: 32, 64 or 128"),
    ({"model_awq_version": "Marlin"}, "model_awq_version: given 'Marlin'; allowed: one of 'GEMM', 'GEMV'"),
    ({"model_quality_max_kld": -1.0}, "model_quality_max_kld: given -1.0"),
    ({"model_route": "AWQ"}, "model_route: given 'AWQ'; allowed: one of 'gguf', 'awq'"),
])  # fmt: skip
def test_refused_settings_say_what_was_found_and_what_is_allowed(data, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        settings(**data)


def test_the_draft_takes_the_gguf_route_unmeasured():
    from roles.model.plan import draft_settings

    s = settings(model_route="awq", model_quality_max_kld=0.5, model_draft_repo="org/small",
                 model_draft_revision="b" * 40)  # fmt: skip
    d = draft_settings(s).model
    assert (d.route, d.quality, d.quality_max_kld) == ("gguf", False, None)


# -- the stamp --


def test_route_gguf_keeps_its_stamp_and_record_whatever_the_awq_and_quality_settings():
    plain = plan_model(settings(), LISTING)
    assert plain.stamp == STAMP and not plain.applies_awq
    others = plan_model(settings(model_awq_q_group_size=64, model_awq_calibration_file="/nonexistent",
                                 model_quality=False, model_keep_f16=True), LISTING)  # fmt: skip
    assert others.stamp == STAMP
    assert "awq" not in plain.record() and "route" not in plain.record() and "route" not in dict(plain.asked)


def test_route_awq_makes_another_artifact_and_every_awq_field_counts():
    awq = awq_plan()
    assert awq.stamp != STAMP and awq.applies_awq
    changed = [awq_plan(model_awq_zero_point=False), awq_plan(model_awq_q_group_size=64),
               awq_plan(model_awq_version="GEMV")]  # fmt: skip
    assert len({awq.stamp, *(p.stamp for p in changed)}) == 4
    assert awq_plan().stamp == awq.stamp  # changing nothing changes nothing
    record = awq.record()
    assert record["route"] == "awq" and record["awq"]["q_group_size"] == 128 and record["awq"]["w_bit"] == 4
    assert dict(awq.asked)["awq"] == record["awq"]


def test_the_calibration_texts_hash_counts(tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text("One paragraph.\n\nAnother one.\n")
    first = awq_plan(model_awq_calibration_file=str(text))
    assert first.stamp != awq_plan().stamp
    assert first.calibration_file == str(text)
    text.write_text("One paragraph.\n\nAnother one, changed.\n")
    assert awq_plan(model_awq_calibration_file=str(text)).stamp != first.stamp
    with pytest.raises(ModelSourceError, match="model_awq_calibration_file: cannot read /nonexistent"):
        awq_plan(model_awq_calibration_file="/nonexistent")


def test_the_held_out_text_is_never_the_calibration_text(tmp_path):
    text = tmp_path / "same.txt"
    text.write_text("The same words.\n")
    with pytest.raises(ModelSourceError, match="model_quality_text_file: given .*the calibration text"):
        awq_plan(model_awq_calibration_file=str(text), model_quality_text_file=str(text))


def test_a_record_of_route_awq_plans_itself_again_and_not_once_a_field_changes():
    awq = awq_plan()
    record = {**awq.record(), "gguf": {"size": 9}}
    state = ArtifactState(awq.stamp, 9, 9, record)
    assert plan_from_record(settings(model_route="awq"), state).stamp == awq.stamp
    assert plan_from_record(settings(model_route="awq", model_awq_zero_point=False), state) is None
    assert plan_from_record(settings(), state) is None  # the gguf route asks for another artifact


# -- the operation's commands --


def shell_of(plan, **kwargs):
    cmds, noops = commands(plan, on_host(plan, None, free=100 << 30), **kwargs)
    return [c for c in cmds if isinstance(c, str)], [c for c in cmds if isinstance(c, tuple)]


def test_route_awq_applies_the_scales_before_convert_which_reads_them():
    plan = awq_plan(model_quality=False)
    shell, uploads = shell_of(plan)
    s, w = plan.staging, f"{plan.staging}/work"
    assert f"{s}/calibration.txt" in [u[1] for u in uploads]
    steps = [(st, c) for c in shell for st in fake_systemd_run.steps(c)]
    assert [st.description for st, _ in steps] == ["llamarack model fetch", "llamarack model awq",
                                                   "llamarack model convert", "llamarack model quantize"]
    awq, line = steps[1]
    assert f">> {s}/awq.log 2>&1" in line and f"[ -e {w}/awq ]" in line  # skipped once done
    script = awq.argv[2]
    assert script.startswith(f"rm -rf -- {w}/awq.tmp.* && /opt/lr/envs/awq/bin/python -c ")
    assert "--zero-point true --q-group-size 128 --w-bit 4 --version GEMM --out " in script
    assert script.endswith(f"--out {w}/awq.tmp.$$ && sync -f -- {w}/awq.tmp.$$ && mv -T -- {w}/awq.tmp.$$ {w}/awq")
    assert ("ReadOnlyPaths", f"-{w}/hf") in awq.properties and ("PrivateNetwork", "yes") in awq.properties
    assert steps[2][0].argv[2].startswith(f"/opt/lr/envs/convert/bin/python /opt/lr/src/llama.cpp/"
                                          f"convert_hf_to_gguf.py {w}/awq --outtype f16")  # fmt: skip


def test_a_cuda_hosts_awq_step_may_open_the_gpu_and_nothing_else():
    plan = awq_plan(model_quality=False)
    shell, _ = shell_of(plan, devices=("nvidia", "nvidiactl", "nvidia-uvm"))
    (awq,) = [st for c in shell for st in fake_systemd_run.steps(c) if st.description == "llamarack model awq"]
    assert ("PrivateDevices", "yes") not in awq.properties and ("DevicePolicy", "closed") in awq.properties
    assert ("DeviceAllow", "char-nvidia-uvm rw") in awq.properties


def test_a_new_artifact_is_measured_against_its_f16_gguf_then_recorded_before_its_seal():
    plan = plan_model(settings(), LISTING)
    shell, uploads = shell_of(plan)
    s, w = plan.staging, f"{plan.staging}/work"
    assert ("upload", f"{s}/quality.txt", open(plan.quality_file).read()) in uploads
    runs = [st for c in shell for st in fake_systemd_run.steps(c) if st.description.startswith("llamarack model q")]
    names = [st.description for st in runs]
    assert names == ["llamarack model quantize", "llamarack model quality f16", "llamarack model quality kv-f16",
                     "llamarack model quality kv-q8_0", "llamarack model quality kv-q4_0"]  # fmt: skip
    base = ["-c", "256", "-b", "256", "--kl-divergence-base", f"{w}/quality.logits"]
    assert runs[1].argv == ["/opt/lr/builds/current/bin/llama-perplexity", "-m", f"{w}/model-f16.gguf", "-f",
                            f"{s}/quality.txt", *base]  # fmt: skip
    assert runs[3].argv == ["/opt/lr/builds/current/bin/llama-perplexity", "-m", f"{w}/model.gguf", *base,
                            "--kl-divergence", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]  # fmt: skip
    record = next(i for i, c in enumerate(shell) if c.startswith(remote.command("model_quality", "record")))
    seal = next(i for i, c in enumerate(shell) if c.startswith(remote.command("model_fetch", "seal")))
    take_over = next(i for i, c in enumerate(shell) if c.startswith(f"if [ -d {w} ]; then"))
    assert take_over < record < seal
    # the f16 GGUF goes with the work directory, unless kept
    assert "for n in model.gguf; do" in shell[take_over]
    kept, _ = shell_of(plan_model(settings(model_keep_f16=True), LISTING))
    assert any("for n in model.gguf model-f16.gguf; do" in c for c in kept)


def test_every_quality_run_takes_the_runtime_switches_the_builds_proof_needed():
    """A build whose proof computed only with ``--no-repack`` (the CPU's repacked or AMX kernels
    fault) runs every quality measurement with it too, read from the build's record."""
    plan = plan_model(settings(), LISTING)
    flags = ServerFlags(("--load-mode", "none"), True, True, True, ("--no-repack",), ("--no-repack",))
    cmds, _ = commands(plan, on_host(plan, None, free=100 << 30, flags=flags))
    runs = [st for c in cmds if isinstance(c, str) for st in fake_systemd_run.steps(c)
            if st.description.startswith("llamarack model quality")]  # fmt: skip
    assert len(runs) == 4 and all(st.argv.count("--no-repack") == 1 for st in runs), [st.argv for st in runs]
    # OpenMP's threads wait passively: spinning, they kept the log thread from writing the figures
    assert all(st.env.get("OMP_WAIT_POLICY") == "PASSIVE" for st in runs)
    # and none without a proven switch (the test above)
    plain, _ = shell_of(plan)
    assert not any("--no-repack" in c for c in plain)


def test_a_resumed_run_skips_the_measurements_done():
    plan = plan_model(settings(), LISTING)
    shell, _ = shell_of(plan)
    line = next(c for c in shell if "quality kv-q4_0" in c)
    log = f"{plan.staging}/quality-kv-q4_0.log"
    assert line.startswith(f"[ -f {plan.staging}/model.gguf ] || [ -f {log} ] || {{ ")
    assert f"mv -f -- {log}.tmp {log}; }}" in line and "grep -qF -- 'Mean    KLD:'" in line


def test_a_measurement_that_lost_its_figure_runs_again(tmp_path):
    """llama-perplexity may exit 0 having lost its last lines (its log thread is not flushed):
    the run is made again until its output holds the figure, at most MEASURE_TRIES times."""
    import subprocess

    from roles.model.operations import MEASURE_TRIES, _measured

    runs, log = tmp_path / "runs", tmp_path / "quality-kv-f16.log"
    # a stand-in for llama-perplexity: the figure only on its second run
    fake = (f"sh -c 'echo x >> {runs}; [ $(wc -l < {runs}) -ge 2 ] && echo \"Mean    KLD:   0.010000 ±   0.000100\"; "
            "echo done'")
    subprocess.run(["bash", "-c", _measured(fake, str(log), "Mean    KLD:")], check=True)
    assert runs.read_text().count("x") == 2 and "Mean    KLD:" in log.read_text()
    # a run that never gives it is kept after the last try (the record then names it missing)
    runs.unlink()
    log.unlink()
    subprocess.run(["bash", "-c", _measured(f"sh -c 'echo x >> {runs}'", str(log), "Mean    KLD:")], check=True)
    assert runs.read_text().count("x") == MEASURE_TRIES and log.exists()
    # a failed run stops there, its output's tail on stderr
    failed = subprocess.run(["bash", "-c", _measured("sh -c 'echo boom; exit 7'", str(tmp_path / "f.log"), "F")],
                            capture_output=True, text=True)  # fmt: skip
    assert failed.returncode == 7 and "boom" in failed.stderr and not (tmp_path / "f.log").exists()


QUALITY = {"kv": {"f16": {"kld": 0.01}, "q8_0": {"kld": 0.012}, "q4_0": {"kld": 0.25}}}


def in_place(plan, quality):
    record = {**plan.record(), "gguf": {"size": 9}, "quality": quality}
    return on_host(plan, ArtifactState(plan.stamp, 9, 9, record), link="0123456789abcdef", record=True)


def test_an_artifact_above_the_bound_is_refused_and_current_is_not_switched():
    plan = plan_model(settings(model_quality_max_kld=0.1), LISTING)
    cmds, _ = commands(plan, in_place(plan, QUALITY))
    assert len(cmds) == 1 and cmds[0].endswith("exit 1")
    assert "found a mean KL divergence of 0.250000 (q4_0 KV)" in cmds[0]
    assert "model_quality_max_kld = 0.1" in cmds[0] and "ln -sfn" not in cmds[0]


def test_an_artifact_within_the_bound_is_switched_to():
    plan = plan_model(settings(model_quality_max_kld=0.5), LISTING)
    cmds, _ = commands(plan, in_place(plan, QUALITY))
    assert len(cmds) == 1 and cmds[0].startswith(f"ln -sfn {plan.name} ")


def test_a_new_artifact_is_bound_after_its_record_and_before_the_link():
    plan = plan_model(settings(model_quality_max_kld=0.1), LISTING)
    shell, _ = shell_of(plan)
    check = remote.command("model_quality", "check", "--stamp", f"{plan.dir}/stamp.json", "--max-kld", "0.1",
                           "--name", f"gpu01: model {plan.name}")  # fmt: skip
    assert shell[-2] == check and shell[-1].startswith(f"ln -sfn {plan.name} ")


# -- llama-perplexity's output: lines made from the printf formats of tools/perplexity/perplexity.cpp --
# "Final estimate: PPL = %.4lf +/- %.5lf\n", "Mean PPL(Q)                   : %10.6lf ± %10.6lf\n",
# "Mean    KLD: %10.6lf ± %10.6lf\n" (constructed from the source's formats, no captured log)

BASE_LOG = """perplexity: tokenizing the input ..
perplexity: tokenization took 2.1 ms
perplexity: calculating perplexity over 3 chunks, n_ctx=256, batch_size=256, n_seq=1
[1]12.3456,[2]13.0001,[3]12.8765,
Final estimate: PPL = 12.8765 +/- 0.91234
"""
KLD_LOG = """====== Perplexity statistics ======
Mean PPL(Q)                   :  13.104512 ±   0.934120
Mean PPL(base)                :  12.876500 ±   0.912340
Cor(ln(PPL(Q)), ln(PPL(base))):  99.12%
Mean ln(PPL(Q)/PPL(base))     :   0.017550 ±   0.002310

====== KL divergence statistics ======
Mean    KLD:   0.021345 ±   0.001234
Maximum KLD:   0.912345
99.9%   KLD:   0.812345
Median  KLD:   0.010000
"""


def test_the_parsers_read_llama_perplexitys_lines():
    assert model_quality.parse_perplexity(BASE_LOG) == {"ppl": 12.8765, "ppl_error": 0.91234}
    assert model_quality.parse_kld(KLD_LOG) == {"ppl": 13.104512, "ppl_error": 0.93412, "kld": 0.021345,
                                                "kld_error": 0.001234}  # fmt: skip
    # fewer than 100 tokens: llama-perplexity prints no statistics
    assert model_quality.parse_kld("kl_divergence: computing over 0 chunks\n") is None
    assert model_quality.parse_perplexity(KLD_LOG) is None


def run_quality(*args):
    return subprocess.run(remote.command("model_quality", *args, python=sys.executable), shell=True,
                          capture_output=True, text=True)  # fmt: skip


def test_record_and_check_on_the_host(tmp_path):
    (tmp_path / "quality-f16.log").write_text(BASE_LOG)
    for kv in ("f16", "q8_0"):
        (tmp_path / f"quality-kv-{kv}.log").write_text(KLD_LOG)
    stamp = tmp_path / "stamp.plan.json"
    stamp.write_text(json.dumps({"stamp": "s"}))
    done = run_quality("record", "--stamp", str(stamp), "--logs", str(tmp_path), "--text-sha256", "ab", "--ctx", "256")
    assert done.returncode == 0, done.stderr
    quality = json.loads(stamp.read_text())["quality"]
    assert quality["f16"]["ppl"] == 12.8765 and quality["kv"]["q8_0"]["kld"] == 0.021345
    assert quality["missing"] == ["kv q4_0"] and quality["ctx"] == 256
    assert run_quality("check", "--stamp", str(stamp), "--max-kld", "0.05", "--name", "h: model x").returncode == 0
    refused = run_quality("check", "--stamp", str(stamp), "--max-kld", "0.02", "--name", "h: model x")
    assert refused.returncode == 1 and "h: model x: found a mean KL divergence of 0.021345" in refused.stderr


# -- AutoAWQ's calibration, before the model loads --


def test_a_card_too_small_for_one_layer_is_refused_with_the_figures():
    # Llama-3-70B's shape
    config = {"hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
              "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip
    assert awq_apply.layer_bytes(config) == 2 * (8192 * 128 * (2 * 64 + 2 * 8) + 3 * 8192 * 28672)
    problem = awq_apply.memory_problem(config, 65536, 16 * 2**30)
    assert problem.startswith("awq: found a card of 16.00 GiB; needed 26.52 GiB to calibrate one decoder layer")
    assert awq_apply.memory_problem(config, 65536, 141 * 2**30) is None


def test_the_estimate_holds_the_peak_measured_on_an_h200():
    """llama3-8b's shape calibrated on the default text's 1746 tokens peaked at 4,609,472,512
    bytes of GPU memory (bench/results/gpu-awq.json): the estimate is above it, within 10%."""
    config = {"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "head_dim": 128,
              "num_key_value_heads": 8, "vocab_size": 128256}  # fmt: skip
    estimate, peak = awq_apply.calibration_bytes(config, 1746), 4609472512
    assert peak <= estimate <= 1.1 * peak, estimate


def test_calibration_blocks_follow_autoawq():
    assert awq_apply.paragraphs("a  b\nc\n\n\n d \n") == ["a b c", "d"]
    assert awq_apply.blocks([100] * 10) == (10, 125, 1000)
    # a paragraph longer than a block is skipped, as AutoAWQ skips it
    assert awq_apply.blocks([100, 900, 100]) == (2, 137, 200)


# -- what the audit and llamarack plan show --

MEASURED = {"f16": {"ppl": 12.8765, "ppl_error": 0.9}, "kv": {"q4_0": {"ppl": 13.5, "kld": 0.25},
            "f16": {"ppl": 13.1, "kld": 0.021345}}, "missing": ["kv q8_0"]}  # fmt: skip


def test_quality_summary_is_one_line_in_kv_order():
    from roles.model.plan import quality_summary

    assert quality_summary(MEASURED) == ("f16 GGUF PPL 12.8765; f16 KV: PPL 13.1000, KLD 0.021345; "
                                         "q4_0 KV: PPL 13.5000, KLD 0.250000; not measured: kv q8_0")
    assert quality_summary(None) is None and quality_summary({"kv": {}}) is None


def test_the_audit_shows_route_and_quality_and_drifts_above_the_bound():
    from types import SimpleNamespace

    from roles.model import audit
    from roles.model.reads import ModelArtifact

    s = settings(model_quality_max_kld=0.1)
    plan = plan_model(s, LISTING)
    served = ArtifactState(plan.stamp, 9, 9, {**plan.record(), "gguf": {"size": 9}, "quality": MEASURED})

    def fact(cls, **kwargs):
        return served if cls is ModelArtifact else None

    item = audit.items(SimpleNamespace(settings=s, fact=fact, verify=False))["model"]
    assert item.found["route"] == "gguf" and item.found["quality"].startswith("f16 GGUF PPL 12.8765")
    assert item.wanted["quality"] == "mean KLD at most 0.1" and item.drift


def test_plan_shows_the_quality_of_an_artifacts_gguf(tmp_path):
    from click.testing import CliRunner

    from llamarack.cli import main
    from tests.unit.test_plan_cli import TINY

    (tmp_path / "model.gguf").write_bytes(TINY.read_bytes())
    (tmp_path / "stamp.json").write_text(json.dumps({"stamp": "s", "quality": MEASURED}))
    result = CliRunner().invoke(main, ["plan", str(tmp_path / "model.gguf"), "--gpu", "Tesla T4"])
    assert result.exit_code == 0, result.output
    assert "\nquality: f16 GGUF PPL 12.8765; f16 KV: PPL 13.1000, KLD 0.021345" in result.output
    as_json = json.loads(CliRunner().invoke(main, ["plan", str(tmp_path / "model.gguf"), "--gpu", "Tesla T4",
                                                   "--json"]).output)  # fmt: skip
    assert as_json["quality"] == MEASURED


def test_quality_builds_llama_perplexity_and_a_rack_without_it_keeps_its_builds():
    from roles.llamacpp.plan import QUALITY_TARGET, TARGETS, plan_build

    plain, measured = plan_build(settings(model_quality=False)), plan_build(settings())
    assert plain.targets == TARGETS and measured.targets == TARGETS + (QUALITY_TARGET,)
    assert plain.stamp != measured.stamp
    # the stamp of a rack that does not measure is the one it had before quality existed
    assert plain.stamp == plan_build(settings(model_quality=False, model_route="awq")).stamp


def test_the_awq_route_gives_its_env_the_tokenizer_libraries_and_the_gguf_route_leaves_it_as_it_was():
    from roles.python_env.plan import AWQ_TOKENIZER_REQUIREMENTS, awq_plan

    plain, awq = awq_plan(settings(), "/opt/lr/envs/awq"), awq_plan(settings(model_route="awq"), "/opt/lr/envs/awq")
    assert plain.steps[1].requirements + AWQ_TOKENIZER_REQUIREMENTS == awq.steps[1].requirements
    assert not set(AWQ_TOKENIZER_REQUIREMENTS) & set(plain.steps[1].requirements)
