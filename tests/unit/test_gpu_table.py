"""The card table: PCI device ids to compute capability, memory and bandwidth."""

import json
import subprocess
from pathlib import Path

import pytest

from llamarack import gpu_table
from roles.driver.reads import NvidiaSmi

FACTS = Path(__file__).parents[1] / "facts"


@pytest.mark.parametrize(
    "pci, cap",
    [("0x1DB110DE", "7.0"), ("0x1DF010DE", "7.0"), ("0x1EB810DE", "7.5"), ("0x15F810DE", "6.0"),
     ("0x1B3810DE", "6.1"), ("0x233510DE", "9.0"), ("0x20B010DE", "8.0"), ("0x27B810DE", "8.9"),
     ("0x13BD10DE", "5.0"), ("0x17FD10DE", "5.2"), ("0x220410DE", "8.6")],
)
def test_compute_cap_by_pci_id(pci, cap):
    assert gpu_table.compute_cap(pci) == cap


@pytest.mark.parametrize("pci", ["[N/A]", "", None, "0x1DB11002", "0x2BB110DE", "1DB1"])
def test_unknown_or_foreign_ids_give_none(pci):
    assert gpu_table.compute_cap(pci) is None


def test_table_covers_5_0_to_9_0_only():
    caps = {b.compute_cap for b in gpu_table.BOARDS.values()}
    assert caps == {"5.0", "5.2", "6.0", "6.1", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0"}
    assert len(gpu_table.BOARDS) > 230  # the desktop, workstation and data-centre boards: no laptop's
    assert not [b.name for b in gpu_table.BOARDS.values() if "Mobile" in b.name or "Max-Q" in b.name]


@pytest.mark.parametrize("pci, gb, bandwidth", [("0x1DB110DE", 16, 900), ("0x1EB810DE", 16, 320),
                                                ("0x15F810DE", 16, 732), ("0x1B3810DE", 24, 346),
                                                ("0x233510DE", 141, 4800)])
def test_memory_and_bandwidth(pci, gb, bandwidth):
    board = gpu_table.board(pci)
    assert (board.memory_gb, board.bandwidth_gbs) == (gb, bandwidth)


def test_the_real_h200_is_found_by_its_pci_id():
    case = json.loads((FACTS / "NvidiaSmi/h200_with_pci_device_id.json").read_text())
    gpu = NvidiaSmi().process(case["output"]).gpus[0]
    assert gpu_table.board(gpu.pci_device_id).name == "H200"


@pytest.mark.parametrize("reported", [16130, 16160, 16384])
def test_v100_16gb_plans_the_same_memory_under_every_driver(reported):
    assert gpu_table.planning_memory_mib("0x1DB110DE", reported) == 16130


def test_planning_memory_without_a_real_report_is_nominal_less_a_sixteenth():
    assert gpu_table.planning_memory_mib("0x1EB810DE", 15360) == 15360  # T4: 16384 - 1024
    assert gpu_table.planning_memory_mib("0x1EB810DE", 15109) == 15109  # ECC on: less, and that wins


@pytest.mark.parametrize("pci, reported, planned", [
    ("0x1DB510DE", 32768, 32256),  # V100 SXM2 32GB: 32768 - 512, not the GDDR margin's 30720
    ("0x1DB810DE", 32768, 32510),  # V100 SXM3 32GB: its real report
    ("0x15F810DE", 16384, 16280),  # P100 16GB: its smallest real report, not 15360
    ("0x15F810DE", 16280, 16280),
    ("0x233010DE", 81559, 81559),  # H100 80GB: what it reports, not 76800
    ("0x20B010DE", 40536, 40320),  # A100 40GB: 40960 - 640
])
def test_hbm_boards_plan_close_to_what_their_drivers_report(pci, reported, planned):
    assert gpu_table.planning_memory_mib(pci, reported) == planned


def test_planning_memory_of_an_unknown_card_is_what_the_driver_reports():
    assert gpu_table.planning_memory_mib("0x2BB110DE", 24576) == 24576
    assert gpu_table.planning_memory_mib(None, 8000) == 8000


def test_fact_command_forces_the_c_locale(tmp_path):
    """A fake nvidia-smi that prints a decimal comma under a non-English locale."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text('#!/bin/sh\nif [ "$LC_ALL" = C ]; then cap=7.0; else cap=7,0; fi\n'
                    'echo "0, Tesla V100-SXM2-16GB, GPU-1, 16384, $cap, 550.127.05, 0x1DB110DE"\n')
    fake.chmod(0o755)
    command = NvidiaSmi().command()
    assert command.startswith("export LC_ALL=C;")
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "LC_ALL": "de_DE.UTF-8", "LANG": "de_DE.UTF-8"}
    out = subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True).stdout
    gpu = NvidiaSmi().process(out.splitlines()).gpus[0]
    assert gpu.compute_cap == "7.0"
