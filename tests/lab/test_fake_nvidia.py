"""The fake driver's nvidia-smi and module loader, run locally against a
temp root (LLAMARACK_FAKE_NVIDIA_ROOT), compared with real captured output
(tests/fixtures/nvidia-smi/h200-driver-580.159.04)."""

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llamarack_lab import profiles
from llamarack_lab.fake_nvidia import deb

FAKE = Path(deb.__file__).parent
FIXTURES = Path(__file__).parent.parent / "fixtures/nvidia-smi/h200-driver-580.159.04"
H200_GPU = {
    "name": "NVIDIA H200", "memory_mib": 143771, "compute_cap": "9.0",
    "uuid": "GPU-c38ede70-e1d4-185a-88ea-4e30e81ba7c8", "bus_id": "00000000:00:06.0",
    "power_cap_w": 700, "power_usage_w": 124, "pstate": "P0", "mig": "Disabled",
}
QUERY = "index,name,uuid,driver_version,memory.total,memory.used,compute_cap,pci.bus_id,pstate"


def make_root(tmp_path, gpus, lib=None, module=None, module_text=None):
    (tmp_path / "etc/llamarack-lab").mkdir(parents=True)
    (tmp_path / "etc/llamarack-lab/gpus.json").write_text(json.dumps(gpus))
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    if lib:
        (libdir / f"libnvidia-ml.so.{lib}").write_text("fake")
    (tmp_path / "proc/driver").mkdir(parents=True)
    if module or module_text:
        (tmp_path / "proc/driver/nvidia").mkdir()
        (tmp_path / "proc/driver/nvidia/version").write_text(
            module_text or fake_module_text(module))
    return tmp_path


def fake_module(name):
    """One of the double's modules, imported as the guest imports it (from its own folder)."""
    sys.path.insert(0, str(FAKE))
    try:
        return importlib.import_module(name)
    finally:
        del sys.path[0]


def fake_module_text(version):
    return fake_module("nvidia_module").proc_version_text(version)


def smi(root, *args):
    r = subprocess.run([sys.executable, str(FAKE / "nvidia_smi.py"), *args],
                       capture_output=True, text=True,
                       env={"LLAMARACK_FAKE_NVIDIA_ROOT": str(root), "PATH": "/usr/bin:/bin"})
    return r.returncode, r.stdout


@pytest.fixture
def h200(tmp_path):
    # the real host's /proc/driver/nvidia/version (open module) as is
    return make_root(tmp_path, [H200_GPU], lib="580.159.04",
                     module_text=(FIXTURES / "procver.txt").read_text())


def test_query_csv_matches_real_output_byte_for_byte(h200):
    rc, out = smi(h200, f"--query-gpu={QUERY}", "--format=csv")
    assert rc == 0
    assert out == (FIXTURES / "query.csv").read_text()


def test_table_matches_real_output_except_timestamp(h200):
    rc, out = smi(h200)
    real = (FIXTURES / "nvidia-smi.txt").read_text()
    assert rc == 0
    # C's asctime, as the real one: "Fri Dec  4 ...", never "Dec 04"
    assert re.fullmatch(r"[A-Z][a-z]{2} [A-Z][a-z]{2} ( [1-9]|[12]\d|3[01]) \d\d:\d\d:\d\d \d{4}       ", out.split("\n")[0])
    assert out.split("\n")[1:] == real.split("\n")[1:]


def test_noheader_nounits_and_aliases(h200):
    rc, out = smi(h200, "--query-gpu=gpu_name,memory.total,memory.used,gpu_bus_id",
                  "--format=csv,noheader,nounits")
    assert (rc, out) == (0, "NVIDIA H200, 143771, 0, 00000000:00:06.0\n")
    rc, out = smi(h200, "--query-gpu=memory.total", "--format=csv,nounits")
    assert out == "memory.total\n143771\n"


def test_unknown_field(h200):
    rc, out = smi(h200, "--query-gpu=name,bogus", "--format=csv")
    assert (rc, out) == (2, 'Field "bogus" is not a valid field to query.\n\n')


def test_compute_cap_not_a_field_before_510(tmp_path):
    root = make_root(tmp_path, [H200_GPU], lib="470.256.02", module="470.256.02")
    rc, out = smi(root, "--query-gpu=name,compute_cap", "--format=csv")
    assert (rc, out) == (2, 'Field "compute_cap" is not a valid field to query.\n\n')
    rc, out = smi(root, "--query-gpu=driver_version", "--format=csv,noheader")
    assert (rc, out) == (0, "470.256.02\n")


def test_no_module_loaded(tmp_path):
    root = make_root(tmp_path, [H200_GPU], lib="550.127.05")
    assert smi(root) == (9, "NVIDIA-SMI has failed because it couldn't communicate with the "
                            "NVIDIA driver. Make sure that the latest NVIDIA driver is "
                            "installed and running.\n\n")


def test_version_mismatch(tmp_path):
    root = make_root(tmp_path, [H200_GPU], lib="570.124.06", module="550.127.05")
    assert smi(root, "--query-gpu=name", "--format=csv") == (
        18, "Failed to initialize NVML: Driver/library version mismatch\n"
            "NVML library version: 570.124\n")


@pytest.mark.parametrize("driver,cuda", [("550.127.05", "12.4"), ("535.216.01", "12.2"),
                                         ("525.147.05", "12.0"), ("520.61.05", "11.8"),
                                         ("470.256.02", "11.4"), ("580.159.04", "13.0"),
                                         ("590.44.01", "13.1")])
def test_cuda_version_in_table(tmp_path, driver, cuda):
    root = make_root(tmp_path, [H200_GPU], lib=driver, module=driver)
    rc, out = smi(root)
    assert rc == 0
    assert f"Driver Version: {driver:<15}CUDA Version: {cuda:<9}|" in out


@pytest.mark.parametrize("profile", sorted(p for p in profiles.PROFILES if p != "none"))
def test_every_profile_renders_aligned(tmp_path, profile):
    root = make_root(tmp_path, profiles.gpus_json("lab-x", profile), lib="550.127.05",
                     module="550.127.05")
    rc, out = smi(root)
    assert rc == 0
    body = out.split("\n")[1:-1]
    assert all(len(line) == 91 for line in body if line), out
    rc, out = smi(root, "--query-gpu=name,memory.total,compute_cap", "--format=csv,noheader")
    assert out == "".join(f"{g.name}, {g.memory_mib} MiB, {g.compute_cap}\n" for g in profiles.PROFILES[profile].gpus)


def test_module_text_format_of_proprietary_module():
    assert fake_module_text("550.127.05") == (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  "
        "Tue Oct  8 03:22:07 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n")


def test_module_loader_load_unload_and_no_module_flag(tmp_path):
    root = make_root(tmp_path, [H200_GPU], lib="550.127.05")
    (root / "usr/lib/llamarack-lab").mkdir(parents=True)
    (root / "usr/lib/llamarack-lab/nvidia-module-version").write_text("550.127.05\n")
    env = {"LLAMARACK_FAKE_NVIDIA_ROOT": str(root), "PATH": "/usr/bin:/bin"}
    tool = [sys.executable, str(FAKE / "nvidia_module.py")]
    assert subprocess.run([*tool, "load"], env=env).returncode == 0
    assert smi(root, "--query-gpu=driver_version", "--format=csv,noheader") == (0, "550.127.05\n")
    assert subprocess.run([*tool, "unload"], env=env).returncode == 0
    assert smi(root)[0] == 9
    (root / "etc/llamarack-lab/nvidia-no-module").touch()
    assert subprocess.run([*tool, "load"], env=env, capture_output=True).returncode == 1
    assert smi(root)[0] == 9

