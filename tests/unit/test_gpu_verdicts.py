"""The build proof's and the residency check's verdicts on llama-server's own logs from a
real H200 (tests/fixtures/llama-server/gpu-residency/README.md): on the card, kept off it
by a device rule, and on a card another process fills."""

from pathlib import Path

import pytest

from roles.driver.reads import GpuProcesses
from roles.llamacpp.files import llamacpp_proof as proof
from roles.server.files.wait_healthy import residency

LOGS = Path(__file__).parents[1] / "fixtures/llama-server/gpu-residency"
UUID = "GPU-1c315d8b-7c35-20bc-491b-dbfb0494e2cd"
# nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid (the machine's line)
ON_CARD = GpuProcesses().process([f"6434, /opt/residency/build/bin/llama-server, 690, {UUID}"])


def offloaded(log: str):
    found = proof.re.search(r"offloaded (\d+)/(\d+) layers to GPU", (LOGS / log).read_text())
    return f"{found.group(1)}/{found.group(2)}" if found else None


def test_a_smoke_run_on_the_card_counts():
    assert offloaded("card.log") == "3/3"
    proof.on_the_card({"offloaded": "3/3", "gpu_mib": 690}, str(LOGS / "card.log"))  # no refusal


def test_a_cuda_build_that_computed_on_the_cpu_is_refused_with_llama_cpps_reason():
    assert offloaded("denied.log") is None  # no GPU: no layer line at all
    with pytest.raises(proof.SmokeFailure) as e:
        proof.on_the_card({"offloaded": None, "gpu_mib": None}, str(LOGS / "denied.log"))
    assert e.value.on_gpu and "computed on the CPU" in e.value.why
    assert "failed to initialize CUDA: no CUDA-capable device is detected" in e.value.why
    with pytest.raises(proof.SmokeFailure, match=r"offloaded 0/3 layers"):
        proof.on_the_card({"offloaded": "0/3", "gpu_mib": None}, str(LOGS / "denied.log"))
    with pytest.raises(proof.SmokeFailure, match=r"offloaded 2/3 layers"):  # some on the card is not all
        proof.on_the_card({"offloaded": "2/3", "gpu_mib": 600}, str(LOGS / "card.log"))


@pytest.mark.parametrize("log, line", [
    ("busy-stream-oom.log", "CUDA error: out of memory"),
    ("busy-load-oom.log", "cudaMalloc failed: out of memory"),
])
def test_a_card_another_process_fills_is_named_out_of_memory_not_a_cpu_fault(log, line):
    tail = proof._tail(str(LOGS / log))
    named = proof.named_gpu_failure(proof.SmokeFailure("llama-server died before it answered /health", tail))
    assert named.on_gpu and named.why.startswith("the GPU ran out of memory") and line in named.why
    plain = proof.SmokeFailure("llama-server predicted 3 of 8 tokens", proof._tail(str(LOGS / "card.log")))
    assert proof.named_gpu_failure(plain) is plain  # nothing to name


OOM = Path(__file__).parents[1] / "fixtures/llama-server/gpu-oom"
ANOTHER = "another process holds the card's memory (nvidia-smi names it)"


def oom(text: str):
    return proof.named_gpu_failure(proof.SmokeFailure("llama-server died before it answered /health", text))


def test_a_compute_buffer_that_fills_the_card_is_named_the_models_own_not_another_process():
    text = (OOM / "own-compute-oom.log").read_text()  # the whole log: the card's memory is in it
    named = oom(text)
    assert named.on_gpu and ANOTHER not in named.why
    assert ("the model's own buffers do not fit the card: model 4403.49 + KV 1024.00 + compute 139264.00 MiB "
            "(the last the allocation that failed) = 144691.49 MiB of its 143155 MiB") in named.why
    assert "allocating 139264.00 MiB on device 0: cudaMalloc failed: out of memory" in named.why
    # the smoke run's 40 lines hold the buffers but not the card's memory: the figures, and how to judge them
    tail = oom(proof._tail(str(OOM / "own-compute-oom.log")))
    assert "VRAM" not in proof._tail(str(OOM / "own-compute-oom.log")) and ANOTHER not in tail.why
    assert ("the model's own buffers asked for model 4403.49 + KV 1024.00 + compute 139264.00 MiB (the last "
            "the allocation that failed) = 144691.49 MiB; where that comes near the card's memory (nvidia-smi's "
            "memory.total) they do not fit it, else another process holds the rest") in tail.why


@pytest.mark.parametrize("log", ["busy-load-oom.log", "busy-stream-oom.log"])
def test_own_buffers_small_beside_the_card_keep_the_other_process_wording(log):
    whole = (LOGS / log).read_text()
    # the card's memory known (its device line; the device list says 0 where cudaMemGetInfo failed)
    assert "VRAM: 143155 MiB" in whole and "(0 MiB, 0 MiB free)" in whole
    for text in (whole, proof._tail(str(LOGS / log))):
        assert ANOTHER in oom(text).why


def test_only_the_failing_cards_buffers_count():
    """Two cards: the model's buffers on CUDA1 say nothing of CUDA0's failed allocation."""
    text = ("Device 0: Tesla V100-SXM2-16GB, compute capability 7.0, VMM: yes, VRAM: 16144 MiB\n"
            "Device 1: Tesla V100-SXM2-16GB, compute capability 7.0, VMM: yes, VRAM: 16144 MiB\n"
            "load_tensors:        CUDA1 model buffer size = 15500.00 MiB\n"
            "load_tensors:        CUDA0 model buffer size =   120.00 MiB\n"
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 64.00 MiB on device 0: cudaMalloc failed: "
            "out of memory\n")  # fmt: skip
    assert ANOTHER in oom(text).why
    own = oom(text.replace("on device 0", "on device 1"))
    assert "model 15500.00 + compute 64.00 MiB (the last the allocation that failed) = 15564.00 MiB of its 16144" \
        in own.why


def test_residency_on_the_card_and_off_it():
    text = (LOGS / "card.log").read_text()
    assert residency(ON_CARD, 6434, (UUID,), 1, text) is None
    assert "less than the planned weights" in residency(ON_CARD, 6434, (UUID,), 4096, text)
    assert "not on the planned card GPU-other" in residency(ON_CARD, 6434, (UUID, "GPU-other"), 1, text)
    denied = (LOGS / "denied.log").read_text()
    assert residency((), 6467, (UUID,), 1, denied, denied=("nvidia", "nvidiactl")).startswith(
        "device denied: the unit does not allow nvidia, nvidiactl")
    assert residency((), 6467, (UUID,), 1, denied).startswith("no CUDA device")
    assert residency((), 6467, (UUID,), 1, "").startswith("CPU fallback")
    partial = text.replace("offloaded 3/3 layers", "offloaded 2/3 layers")
    assert residency(ON_CARD, 6434, (UUID,), 1, partial) == "fewer layers offloaded than planned: 2/3"


def test_the_audit_residency_item_on_the_card_off_it_and_on_a_cpu_build():
    from roles.driver.reads import Gpu
    from roles.server.audit import residency_item
    from roles.settings import load_settings

    h200 = Gpu(0, "NVIDIA H200", UUID, 143771, "9.0", "580.159.04", "0x233510DE")
    cuda = load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cuda"})
    on = residency_item(cuda, (h200.uuid,), ON_CARD, 6434, 1)
    assert not on.drift and on.found == {"pid": 6434, "cards": [UUID], "used_mib": 690}
    off = residency_item(cuda, (h200.uuid,), ON_CARD, 6467, 1)  # the unit's PID is not the one on the card
    assert off.drift and off.found["why"].startswith("CPU fallback")
    heavy = residency_item(cuda, (h200.uuid,), ON_CARD, 6434, 4400)
    assert heavy.drift and "less than the planned weights (4400 MiB)" in heavy.found["why"]
    assert not residency_item(cuda, (h200.uuid,), (), 0, 1).drift  # not running: the service item says so
    # ... unless its check after its last start refused it (the journal's line, ServedUnits' "refused")
    why = "llamarack-server.service answers /health but does not serve from its cards: CPU fallback: ..."
    refused = residency_item(cuda, (h200.uuid,), (), 0, 1, refused=why)
    assert refused.drift and refused.found["why"] == f"refused at its last start: {why}"
    cpu = load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cpu"})
    assert residency_item(cpu, (h200.uuid,), (), 6434, None).found == {"backend": "cpu", "server_residency": "auto"}
    # server_residency: on checks a CPU build's units too (a lab's fake driver lists them); off never
    forced = load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cpu", "server_residency": "on"})
    assert residency_item(forced, (h200.uuid,), ON_CARD, 6467, 1).found["why"].startswith("CPU fallback")
    never = load_settings("gpu01", {"python_env_backend": "venv", "llamacpp_backend": "cuda", "server_residency": "off"})
    assert residency_item(never, (h200.uuid,), ON_CARD, 6467, 1).found == {"backend": "cuda", "server_residency": "off"}


def test_the_residency_check_reads_the_layers_only_from_the_units_log_verbosity():
    """A real CUDA llama-server serving 1 of 3 layers (bench/gpu/layers.sh on an H100):
    at llama.cpp's default verbosity its log names no layer count, and the check cannot
    tell; at the unit's LLAMA_ARG_LOG_VERBOSITY=4 it refuses it."""
    held = GpuProcesses().process([f"6434, /opt/layers/build/bin/llama-server, 528, {UUID}"])
    default = (LOGS / "fewer-layers-default.log").read_text()
    assert "offloaded" not in default and residency(held, 6434, (UUID,), 1, default) is None
    trace = (LOGS / "fewer-layers-v4.log").read_text()
    assert residency(held, 6434, (UUID,), 1, trace) == "fewer layers offloaded than planned: 1/3"
