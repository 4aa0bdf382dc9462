"""Driver role operations: facts in, commands out (no host)."""

import json
from pathlib import Path

import pytest

from llamarack.facts import NvidiaDriverPackages
from llamarack.roles.driver.operations import driver_answers, driver_package_holds
from tests.roles.stackhost import run_op

FACTS = Path(__file__).resolve().parents[1] / "facts"


def packages(case):
    return NvidiaDriverPackages().process(json.loads((FACTS / f"NvidiaDriverPackages/{case}.json").read_text())["output"])


def test_unheld_driver_packages_are_held():
    commands, _ = run_op(driver_package_holds, {NvidiaDriverPackages: packages("lab_not_held")}, hold=True)
    assert commands == ["apt-mark hold nvidia-driver"]


def test_only_the_packages_not_yet_held_are_held():
    commands, _ = run_op(
        driver_package_holds, {NvidiaDriverPackages: packages("debian12_toolkit_pulls_driver_libs")}, hold=True
    )
    assert commands == [
        "apt-mark hold libcuda1 libnvidia-cfg1 libnvidia-ml1 libnvidia-nvvm4 libnvidia-pkcs11-openssl3 "
        "libnvidia-ptxjitcompiler1 nvidia-alternative nvidia-persistenced nvidia-smi"
    ]


def test_held_packages_are_a_no_op():
    commands, noops = run_op(driver_package_holds, {NvidiaDriverPackages: packages("lab_held")}, hold=True)
    assert commands == [] and noops == ["NVIDIA driver packages already held: nvidia-driver"]


@pytest.mark.parametrize("case, expected", [("lab_held", ["apt-mark unhold nvidia-driver"]), ("lab_not_held", [])])
def test_hold_off_unholds(case, expected):
    commands, _ = run_op(driver_package_holds, {NvidiaDriverPackages: packages(case)}, hold=False)
    assert commands == expected


def test_no_driver_package_is_a_no_op():
    commands, noops = run_op(driver_package_holds, {NvidiaDriverPackages: ()}, hold=True)
    assert commands == [] and noops == ["no NVIDIA driver package installed"]


def test_check_after_reboot_fails_when_nvidia_smi_still_fails(tmp_path):
    import subprocess

    (command,), _ = run_op(driver_answers, {}, reason="a reboot")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'Failed to initialize NVML: Driver/library version mismatch'\nexit 18\n")
    fake.chmod(0o755)
    result = subprocess.run(["sh", "-c", command], env={"PATH": f"{tmp_path}:/usr/bin:/bin"},
                            capture_output=True, text=True)  # fmt: skip
    assert result.returncode == 1
    assert "gpu01: driver still fails after a reboot:" in result.stderr
    assert "Driver/library version mismatch" in result.stderr
    fake.write_text("#!/bin/sh\necho '0, 550.127.05'\n")
    assert subprocess.run(["sh", "-c", command], env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).returncode == 0
