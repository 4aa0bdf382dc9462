"""The lab's fake nvidia-smi, run as the standalone script it is, against a temp
root (LLAMARACK_FAKE_NVIDIA_ROOT prefixes /etc/llamarack-lab/gpus.json, the
libnvidia-ml marker and /proc/driver/nvidia/version), compared with the real
H200 output (tests/fixtures/nvidia-smi/h200-driver-580.159.04) and parsed by
the NvidiaSmi fact the way a lab host's would be."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import llamarack_lab.fake_nvidia as fake_nvidia
from llamarack.roles.driver.reads import NvidiaSmi

FAKE = Path(fake_nvidia.__file__).parent / "nvidia_smi.py"
REAL = Path(__file__).parents[1] / "fixtures/nvidia-smi/h200-driver-580.159.04"
FACTS = Path(__file__).parents[1] / "facts"
H200 = {
    "name": "NVIDIA H200", "memory_mib": 143771, "compute_cap": "9.0",
    "uuid": "GPU-c38ede70-e1d4-185a-88ea-4e30e81ba7c8", "bus_id": "00000000:00:06.0",
    "power_cap_w": 700, "power_usage_w": 124, "pstate": "P0", "mig": "Disabled",
    "memory_reserved_mib": 616,
}
V100 = {"name": "Tesla V100-SXM2-16GB", "memory_mib": 16384, "compute_cap": "7.0",
        "uuid": "GPU-42be0b4d-4cfd-d4b1-51db-1900b18bf14d", "bus_id": "00000000:1E:00.0"}


def root(tmp_path, gpus, lib="580.159.04", module="580.159.04"):
    (tmp_path / "etc/llamarack-lab").mkdir(parents=True)
    (tmp_path / "etc/llamarack-lab/gpus.json").write_text(json.dumps(gpus))
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    if lib:
        (libdir / f"libnvidia-ml.so.{lib}").write_text("fake")
    if module:
        (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
        (tmp_path / "proc/driver/nvidia/version").write_text(
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {module}  Release Build\n")
    return tmp_path


def smi(root, *args):
    r = subprocess.run([sys.executable, str(FAKE), *args], capture_output=True, text=True,
                       env={"LLAMARACK_FAKE_NVIDIA_ROOT": str(root), "PATH": "/usr/bin:/bin"})
    return r.returncode, r.stdout


def fact_on(root):
    """The NvidiaSmi fact's own command, with the fake as nvidia-smi on PATH."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"LLAMARACK_FAKE_NVIDIA_ROOT": str(root), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", NvidiaSmi().command()], env=env, capture_output=True, text=True)
    return NvidiaSmi().process(out.stdout.splitlines())


@pytest.mark.parametrize("args", [(), ("-L",), ("-q",), ("--query-gpu=index,name", "--format=csv")])
def test_no_gpu_is_no_devices_exit_6_like_the_real_one(tmp_path, args):
    assert smi(root(tmp_path, []), *args) == (6, "No devices were found\n")


def test_the_fact_reads_every_state_the_fake_offers(tmp_path):
    assert fact_on(root(tmp_path / "none", [])).state == "no_devices"
    assert fact_on(root(tmp_path / "nomod", [V100], module=None)).state == "no_module"
    mismatch = fact_on(root(tmp_path / "mm", [V100], lib="590.44.01", module="580.95.05"))
    assert (mismatch.state, mismatch.library_version) == ("mismatch", "590.44")
    ok = fact_on(root(tmp_path / "ok", [H200]))
    assert ok.state == "ok" and ok.gpus[0].pci_device_id == "0x233510DE"
    old = fact_on(root(tmp_path / "470", [V100], lib="470.182.03", module="470.182.03"))
    assert (old.gpus[0].compute_cap, old.gpus[0].pci_device_id) == ("7.0", "0x1DB110DE")


def test_fact_query_matches_the_real_capture(tmp_path):
    """Same line as the real H200 printed for the fact's query (the UUID is the host's)."""
    real = json.loads((FACTS / "NvidiaSmi/h200_with_pci_device_id.json").read_text())["output"][0]
    gpu = {**H200, "uuid": real.split(", ")[2]}
    rc, out = smi(root(tmp_path, [gpu]), f"--query-gpu={NvidiaSmi.FIELDS}", "--format=csv,noheader,nounits")
    assert (rc, out) == (0, real + "\n")


def test_query_csv_still_matches_byte_for_byte(tmp_path):
    fields = "index,name,uuid,driver_version,memory.total,memory.used,compute_cap,pci.bus_id,pstate"
    assert smi(root(tmp_path, [H200]), f"--query-gpu={fields}", "--format=csv") == (
        0, (REAL / "query.csv").read_text())


def q_keys(text):
    """(indent, key) of each line of nvidia-smi -q, and the values by key path."""
    keys, values, path = [], {}, []
    for line in text.split("\n"):
        m = re.match(r"( *)(\S.*?)\s*(?:: (.*))?$", line)
        if not m or line.startswith("="):
            continue
        depth = len(m.group(1)) // 4
        key = "GPU" if m.group(2).startswith("GPU 0000") else m.group(2)
        path = path[:depth] + [key]
        keys.append((depth, key))
        if m.group(3) is not None:
            values["/".join(path)] = m.group(3)
    return keys, values


def test_q_has_the_real_layout_and_values(tmp_path):
    rc, out = smi(root(tmp_path, [H200]), "-q")
    real = (REAL / "q.txt").read_text()
    assert rc == 0
    fake_keys, fake_values = q_keys(out)
    real_keys, real_values = q_keys(real)
    it = iter(real_keys)
    assert all(k in it for k in fake_keys), "the fake's keys must be the real ones, in the real order"
    # key padded to column 55 as the real one pads it
    for line in out.split("\n"):
        if ": " in line:
            assert line.index(": ") == 55, line
    for key, value in fake_values.items():
        # the real driver rounds each figure from bytes: its Free is 1 MiB more than Total - Reserved
        if key not in ("Timestamp", "GPU/FB Memory Usage/Free"):
            assert value == real_values[key], key
    assert out.split("\n")[:3] == real.split("\n")[:3] and out.endswith("\n\n")
    # the timestamp in asctime's shape, as the real one: "Sun Nov 29 18:02:37 2026", "Fri Dec  4 ..."
    shape = r"[A-Z][a-z]{2} [A-Z][a-z]{2} [ 123]\d \d\d:\d\d:\d\d \d{4}"
    assert re.fullmatch(shape, real_values["Timestamp"]) and re.fullmatch(shape, fake_values["Timestamp"])
    day = int(fake_values["Timestamp"][8:10])
    assert fake_values["Timestamp"][8:10] == f"{day:2d}"  # a day below 10 padded with a space, never "04"


def test_compute_apps_query_prints_what_the_real_one_prints_with_no_process(tmp_path):
    """Real output on the lent H200 with no process on the card (driver 580.159.04):
    nothing with noheader, else only the header, whose memory column names its unit."""
    r = root(tmp_path, [H200])
    q = "--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid"
    assert smi(r, q, "--format=csv,noheader,nounits") == (0, "")
    assert smi(r, q, "--format=csv,nounits") == (0, "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n")
