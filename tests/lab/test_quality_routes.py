"""The two quantization routes and the quality record, on one lab host, on the CPU.

lab-v100-b makes the tiny model through the AWQ route (AutoAWQ in the AWQ env, the lab's
CPU torch, its scales applied into the fp16 weights), then through the plain route, each
measured by llama-perplexity against its f16 GGUF; then a KL divergence bound no artifact
meets refuses a new one while the old one keeps serving. No claim is made about which
route is better: the model is tiny and random.

The tests run in order, each from the state the one before left.
"""

import json

import pytest

from llamarack_lab import mirror, services
from tests.lab import deploying

pytestmark = pytest.mark.lab

HOST = "lab-v100-b"
ROOT = "/opt/llamarack"
# Measured, at a quant of its own: an artifact is measured when it is made, and the rack's
# Q4_K_M artifact was made unmeasured before these tests.
MEASURED = ("model_quality=True", "model_quant=Q4_K_S")
SEEN = {}


def deploy(lab_rack, *data: str) -> tuple:
    return deploying.deploy(lab_rack, HOST, *data)


def record(lab_rack) -> dict:
    return json.loads(deploying.sh(lab_rack, HOST, f"cat {ROOT}/models/current/stamp.json"))


def measured(quality: dict) -> None:
    """Real figures: the f16 GGUF's perplexity, and per KV type the quant's and its KLD."""
    assert quality["f16"]["ppl"] > 1, quality
    assert sorted(quality["kv"]) == ["f16", "q4_0", "q8_0"], quality
    for kv, v in quality["kv"].items():
        assert v["ppl"] > 1 and v["kld"] >= 0, (kv, quality)


@pytest.fixture(scope="module", autouse=True)
def route_restored_afterwards(lab_rack):
    yield
    deploying.deploy(lab_rack, HOST)


def test_the_awq_route_serves_a_measured_artifact_whose_scales_were_applied(lab_rack):
    rc, out = deploy(lab_rack, "model_route=awq", *MEASURED)
    assert rc == 0, out[-6000:]
    stamp = record(lab_rack)
    assert stamp["route"] == "awq", stamp
    measured(stamp["quality"])
    log = deploying.sh(lab_rack, HOST, f"cat {ROOT}/models/current/awq.log")
    assert "awq-report" in log, log[-2000:]
    SEEN["awq"] = stamp["gguf"]["sha256"]
    deploying.completes(lab_rack, HOST)


def test_a_second_awq_deploy_changes_nothing(lab_rack):
    deploying.converges(lab_rack, HOST, "model_route=awq", *MEASURED)


def test_the_plain_route_makes_another_artifact_from_the_same_checkpoint(lab_rack):
    rc, out = deploy(lab_rack, *MEASURED)
    assert rc == 0, out[-6000:]
    stamp = record(lab_rack)
    assert stamp.get("route", "gguf") == "gguf"
    measured(stamp["quality"])
    # the AWQ route's scales changed the weights the quantizer saw: another GGUF
    assert stamp["gguf"]["sha256"] != SEEN["awq"]
    SEEN["plain"] = deploying.sh(lab_rack, HOST, f"readlink {ROOT}/models/current")
    report = deploying.audit_json(HOST, *[w for d in MEASURED for w in ("--data", d)])
    assert "KLD" in (report["items"]["model"]["found"].get("quality") or ""), report["items"]["model"]


def test_an_artifact_past_the_kld_bound_is_refused_and_the_old_one_serves(lab_rack):
    rc, out = deploy(lab_rack, "model_quality=True", "model_quant=Q4_0", "model_quality_max_kld=0.0000001")
    assert rc != 0, out[-6000:]
    assert "found a mean KL divergence of" in out and "at most model_quality_max_kld = 1e-07" in out, out[-6000:]
    assert deploying.sh(lab_rack, HOST, f"readlink {ROOT}/models/current") == SEEN["plain"]
    deploying.completes(lab_rack, HOST)


# ggml's repacked CPU kernels (repack.cpp), in the pinned llama.cpp: the fault goes first in them.
REPACKED = "    bool compute_forward(struct ggml_compute_params * params, struct ggml_tensor * op) override {\n"
# A CPU whose repacked kernels fault only on a large batch (as AMX on a virtual CPU may): the
# smoke run's few tokens pass, llama-bench's and the quality runs' batches die.
DIES_ON_A_REPACKED_BATCH = {"ggml/src/ggml-cpu/repack.cpp": (REPACKED, REPACKED + (
    "        if (op->src[1]->ne[1] > 64) {\n"
    "            fputs(\"llamarack lab test: a repacked kernel faults on a batch\\n\", stderr);\n"
    "            abort();\n        }\n"))}  # fmt: skip


def test_a_build_proven_only_without_repacking_measures_its_quality_without_it(lab_rack):
    """The build's proof computes a batch as large as the tools' that run after it, so a build
    whose repacked kernels die on one climbs the ladder to ``--no-repack`` there, and every
    quality run of the new artifact takes that switch from the build's record."""
    faulty = mirror.add_named_commit(services.prepare(), "lab-test-repacked-batch-faults",
                                     "lab test: repacked kernels abort on a batch", DIES_ON_A_REPACKED_BATCH)
    rc, out = deploy(lab_rack, f"llamacpp_commit={faulty}", *MEASURED)
    assert rc == 0, out[-6000:]
    proof = json.loads(deploying.sh(lab_rack, HOST, f"cat {ROOT}/builds/current/build-info.json"))["proof"]
    assert proof["runtime_args"] == ["--no-repack"] and proof["attempts"][0]["ok"] is False, proof
    assert proof["tools"] == ["llama-perplexity", "llama-bench"], proof
    # The new artifact, made with this build (its converter's commit), measured: every quality
    # run computed batches of 256, which die in this build unless repacking is off.
    stamp = record(lab_rack)
    assert stamp["llamacpp_commit"] == faulty, stamp
    measured(stamp["quality"])
    deploying.completes(lab_rack, HOST)
