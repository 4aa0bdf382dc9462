"""bench/gpu/residency.py's verdicts, on this machine with the GPU machine's own logs
(tests/fixtures/llama-server/gpu-residency/): the unit is the server role's, and the cause
of a refusal is what the product works out from its own reads (the unit's DeviceAllow
lines, /proc/devices, the nodes' majors, nvidia-smi, the log), never handed in."""

import importlib.util
import sys
from pathlib import Path

from roles.server.files.wait_healthy import App

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_residency", ROOT / "bench/gpu/residency.py")
bench = sys.modules.setdefault("gpu_residency", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bench)

LOGS = ROOT / "tests/fixtures/llama-server/gpu-residency"
DEVICES = "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n238 nvidia-uvm\n\nBlock devices:\n  8 sd\n"
MAJORS = (238, 238, 195, 195)  # /dev/nvidia-uvm, -uvm-tools, nvidia0, nvidiactl
CARD = "GPU-1c315d8b-7c35-20bc-491b-dbfb0494e2cd"


def unit(lacks=()):
    return bench.unit_text(Path("/opt/residency/build"), DEVICES, lacks)


def test_the_unit_is_the_roles_own_and_allows_every_name_of_the_driver():
    text = unit()
    assert "ExecStart=/opt/residency/build/bin/llama-server --cache-type-k f16" in text
    assert [x for x in text.splitlines() if x.startswith("DeviceAllow=")] == [
        "DeviceAllow=char-nvidia rw", "DeviceAllow=char-nvidiactl rw", "DeviceAllow=char-nvidia-uvm rw"]


def test_on_the_card_the_health_check_finds_it_there():
    seen = bench.verdict((App(6754, "llama-server", 690, CARD),), 6754, (CARD,), (LOGS / "card.log").read_text(),
                         unit(), DEVICES, MAJORS)  # fmt: skip
    assert seen == {"unit_allows": ["nvidia", "nvidiactl", "nvidia-uvm"], "unit_denies": [],
                    "residency": "on the card"}  # fmt: skip


def test_nodes_kept_away_by_something_other_than_the_unit_read_as_no_cuda_device():
    seen = bench.verdict((), 6787, (CARD,), (LOGS / "denied.log").read_text(), unit(),
                         DEVICES, MAJORS)  # fmt: skip
    assert seen["unit_denies"] == []
    assert seen["residency"].startswith("no CUDA device: llama-server is on no card (failed to initialize CUDA")


def test_a_unit_without_the_drivers_names_is_named_as_the_denial():
    text = unit(lacks=bench.UNIT_LACKS)
    seen = bench.verdict((), 6787, (CARD,), (LOGS / "denied.log").read_text(), text, DEVICES, MAJORS)
    assert seen["unit_allows"] == ["nvidia-uvm"] and seen["unit_denies"] == ["nvidia", "nvidiactl"]
    assert seen["residency"] == ("device denied: the unit does not allow nvidia, nvidiactl, so llama-server "
                                 "serves from the CPU")  # fmt: skip
