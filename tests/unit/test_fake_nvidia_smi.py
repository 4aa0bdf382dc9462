"""The lab's fake nvidia-smi, run as the standalone script it is, against a temp
root (LLAMARACK_FAKE_NVIDIA_ROOT prefixes /etc/llamarack-lab/gpus.json and
gpu-processes.json, the libnvidia-ml marker and /proc/driver/nvidia/version;
LLAMARACK_FAKE_NVIDIA_NOW sets its clock), compared with the real H200 output
(tests/fixtures/nvidia-smi/h200-driver-580.159.04, and -processes beside it
for a card running two processes) and parsed by the NvidiaSmi fact the way a
lab host's would be."""

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
BUSY = Path(__file__).parents[1] / "fixtures/nvidia-smi/h200-driver-580.159.04-processes"
FACTS = Path(__file__).parents[1] / "facts"
H200 = {
    "name": "NVIDIA H200", "memory_mib": 143771, "compute_cap": "9.0",
    "uuid": "GPU-c38ede70-e1d4-185a-88ea-4e30e81ba7c8", "bus_id": "00000000:00:06.0",
    "power_cap_w": 700, "power_usage_w": 124, "pstate": "P0", "mig": "Disabled",
    "memory_reserved_mib": 616,
}
V100 = {"name": "Tesla V100-SXM2-16GB", "memory_mib": 16384, "compute_cap": "7.0",
        "uuid": "GPU-42be0b4d-4cfd-d4b1-51db-1900b18bf14d", "bus_id": "00000000:1E:00.0"}


def root(tmp_path, gpus, lib="580.159.04", module="580.159.04", processes=None):
    (tmp_path / "etc/llamarack-lab").mkdir(parents=True)
    (tmp_path / "etc/llamarack-lab/gpus.json").write_text(json.dumps(gpus))
    if processes is not None:  # as llamarack_lab.driver.set_gpu_processes writes it
        (tmp_path / "etc/llamarack-lab/gpu-processes.json").write_text(json.dumps(processes))
    libdir = tmp_path / "usr/lib/x86_64-linux-gnu"
    libdir.mkdir(parents=True)
    if lib:
        (libdir / f"libnvidia-ml.so.{lib}").write_text("fake")
    if module:
        (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
        (tmp_path / "proc/driver/nvidia/version").write_text(
            f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {module}  Release Build\n")
    return tmp_path


def smi(root, *args, now=None):
    """(exit status, output) of the fake; ``now``: the Unix time its clock reads (in UTC)."""
    env = {"LLAMARACK_FAKE_NVIDIA_ROOT": str(root), "PATH": "/usr/bin:/bin", "TZ": "UTC"}
    r = subprocess.run([sys.executable, str(FAKE), *args], capture_output=True, text=True,
                       env={**env, "LLAMARACK_FAKE_NVIDIA_NOW": str(now)} if now else env)  # fmt: skip
    return r.returncode, r.stdout


def fact_on(root, fact=NvidiaSmi):
    """The fact's own command (NvidiaSmi's, or another's), with the fake as nvidia-smi on PATH."""
    bin_dir = root / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE} "$@"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {"LLAMARACK_FAKE_NVIDIA_ROOT": str(root), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", fact().command()], env=env, capture_output=True, text=True)
    return fact().process(out.stdout.splitlines())


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


def test_compute_apps_query_prints_what_the_real_one_prints_with_no_process(tmp_path):
    """Real output on the lent H200 with no process on the card (driver 580.159.04):
    nothing with noheader, else only the header, whose memory column names its unit."""
    r = root(tmp_path, [H200])
    q = "--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid"
    assert smi(r, q, "--format=csv,noheader,nounits") == (0, "")
    assert smi(r, q, "--format=csv,nounits") == (0, "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n")


# -- the date line: C's asctime, the day padded with a space ----------------------

IDLE_AT = 1795975357  # Sun Nov 29 18:02:37 2026 UTC: when the idle capture was printed
BUSY_AT = 1796403282  # Fri Dec  4 16:54:42 2026 UTC: when the busy capture was printed


def test_the_date_line_is_asctimes_with_a_space_before_a_single_digit_day(tmp_path):
    r = root(tmp_path, [H200])
    assert smi(r, now=BUSY_AT)[1].split("\n")[0] == "Fri Dec  4 16:54:42 2026       "
    assert smi(r, now=BUSY_AT + 6 * 86400)[1].split("\n")[0] == "Thu Dec 10 16:54:42 2026       "
    _, values = q_keys(smi(r, "-q", now=BUSY_AT)[1])
    assert values["Timestamp"] == "Fri Dec  4 16:54:42 2026"


def test_the_idle_table_is_the_real_one_byte_for_byte(tmp_path):
    """No process registered: "No running processes found", as the real idle card."""
    assert smi(root(tmp_path, [H200], processes=[]), now=IDLE_AT) == (0, (REAL / "nvidia-smi.txt").read_text())


# -- compute processes a lab test registers --------------------------------------

BUSY_UUID = "GPU-3de66f73-556f-89d1-83cd-2140eca66de4"
# the lent H200 of the busy capture: its UUID, temperature and power then, 15 MiB kept by the driver
BUSY_H200 = {**H200, "uuid": BUSY_UUID, "temperature_c": 40, "power_usage_w": 121, "memory_used_mib": 15}


def busy_processes() -> list:
    """The two processes of the capture, as ``LabRack.gpu_processes`` writes them."""
    from dataclasses import asdict

    from llamarack_lab.driver import GpuProcess

    return [asdict(GpuProcess(604, "/opt/llamarack/builds/0123456789abcdef/bin/llama-server", 3518, BUSY_UUID)),
            asdict(GpuProcess(605, "python3", 1542, BUSY_UUID))]  # fmt: skip


def test_registered_processes_are_in_the_table_as_the_real_one_prints_them(tmp_path):
    """Byte for byte: the rows (a long name cut to "..." and its end) and the card's memory
    in use (the processes' and the driver's 15 MiB)."""
    r = root(tmp_path, [BUSY_H200], processes=busy_processes())
    assert smi(r, now=BUSY_AT) == (0, (BUSY / "nvidia-smi.txt").read_text())


@pytest.mark.parametrize("fields, fmt, capture", [
    ("pid,process_name,used_memory,gpu_uuid", "csv", "compute-apps.csv"),
    ("pid,process_name,used_memory,gpu_uuid", "csv,nounits", "compute-apps-nounits.csv"),
    ("pid,process_name,used_memory,gpu_uuid", "csv,noheader,nounits", "compute-apps-noheader-nounits.csv"),
    ("pid,process_name,used_gpu_memory,gpu_uuid", "csv,nounits", "compute-apps-used_gpu_memory-nounits.csv"),
])  # fmt: skip
def test_registered_processes_are_queried_as_the_real_one_prints_them(tmp_path, fields, fmt, capture):
    r = root(tmp_path, [BUSY_H200], processes=busy_processes())
    assert smi(r, f"--query-compute-apps={fields}", f"--format={fmt}") == (0, (BUSY / capture).read_text())


def test_registered_processes_are_in_q_and_count_in_the_cards_memory(tmp_path):
    r = root(tmp_path, [BUSY_H200], processes=busy_processes())
    out = smi(r, "-q")[1].split("\n")
    real = (BUSY / "q.txt").read_text().split("\n")
    block = real[real.index("    Processes"):real.index("    Capabilities")]
    assert out[out.index("    Processes"):out.index("    Processes") + len(block)] == block
    used = "        Used                                           : 5075 MiB"  # FB Memory Usage, as the real one
    assert used in real and used in out
    assert smi(r, "--query-gpu=memory.used", "--format=csv,noheader,nounits") == (0, "5075\n")


def test_no_process_registered_prints_nothing_and_the_residency_check_reads_them(tmp_path):
    """The GpuProcesses fact (what the switch's and the audit's residency checks read)."""
    from llamarack.roles.driver.reads import GpuProcesses

    apps = "--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid"
    for processes in (None, []):  # no file, or set to none
        r = root(tmp_path / str(processes), [BUSY_H200], processes=processes)
        assert smi(r, apps, "--format=csv,noheader,nounits") == (0, "")
        assert "|  No running processes found  " in smi(r)[1]
        assert "    Processes                                          : None" in smi(r, "-q")[1].split("\n")
        assert fact_on(r, GpuProcesses) == ()
    r = root(tmp_path / "busy", [BUSY_H200], processes=busy_processes())
    assert [(p.pid, p.name, p.used_mib, p.gpu_uuid) for p in fact_on(r, GpuProcesses)] == [
        (604, "/opt/llamarack/builds/0123456789abcdef/bin/llama-server", 3518, BUSY_UUID),
        (605, "python3", 1542, BUSY_UUID)]  # fmt: skip


def test_the_lab_helper_writes_the_file_the_fake_reads(tmp_path):
    from llamarack_lab import driver
    from llamarack_lab.util import LabError

    class Rack:  # llamarack_lab.rack.Rack's two calls the helper makes
        def host(self, name):
            self.name = name

        def ssh(self, host, cmd, input=None):
            self.sent = (host, cmd, input)
            return subprocess.CompletedProcess(cmd, 0, "", "")

    rack = Rack()
    process = driver.GpuProcess(604, "/opt/llamarack/builds/0123456789abcdef/bin/llama-server", 3518, BUSY_UUID)
    assert driver.set_gpu_processes(rack, "lab-h200", (process,)) == "lab-h200: 1 GPU process(es) listed"
    host, cmd, sent = rack.sent
    assert (host, cmd) == ("lab-h200", "cat > /etc/llamarack-lab/gpu-processes.json.new && "
                                       "mv -f /etc/llamarack-lab/gpu-processes.json.new /etc/llamarack-lab/gpu-processes.json")
    assert json.loads(sent) == busy_processes()[:1]
    with pytest.raises(LabError, match="not a GPU process"):
        driver.GpuProcess(604, "llama-server", 3518, "3de66f73")


def test_a_process_on_a_card_the_driver_does_not_list_is_not_shown(tmp_path):
    elsewhere = {"pid": 7, "name": "python3", "used_mib": 10, "gpu_uuid": "GPU-00000000-0000-0000-0000-000000000000"}
    r = root(tmp_path, [BUSY_H200], processes=[elsewhere])
    assert smi(r, "--query-compute-apps=pid,gpu_uuid", "--format=csv,noheader") == (0, "")
    assert smi(r, "--query-compute-apps=pid,bogus", "--format=csv") == (
        2, 'Field "bogus" is not a valid field to query.\n\n')


# -- a driver past the 580 branch drives no card below compute capability 7.5 -----

T4 = {"name": "Tesla T4", "memory_mib": 15360, "compute_cap": "7.5",
      "uuid": "GPU-7a1b2c3d-4e5f-4061-8273-9a8b7c6d5e4f", "bus_id": "00000000:3B:00.0"}


def test_a_590_driver_lists_the_t4_beside_a_v100_and_not_the_v100(tmp_path):
    on_v100 = {"pid": 9, "name": "python3", "used_mib": 100, "gpu_uuid": V100["uuid"]}
    r = root(tmp_path, [V100, T4], lib="590.44.01", module="590.44.01", processes=[on_v100])
    query = ("--query-gpu=index,name,uuid,compute_cap,count", "--format=csv,noheader")
    assert smi(r, *query) == (0, f"0, Tesla T4, {T4['uuid']}, 7.5, 1\n")
    assert smi(r, "-L") == (0, f"GPU 0: Tesla T4 (UUID: {T4['uuid']})\n")
    rc, table = smi(r)
    assert rc == 0 and "V100" not in table and "|   0  Tesla T4" in table and "No running processes found" in table
    assert smi(r, "--query-compute-apps=pid", "--format=csv,noheader") == (0, "")
    # the same host under 580 drives both
    r580 = root(tmp_path / "580", [V100, T4])
    assert smi(r580, "--query-gpu=index,name", "--format=csv,noheader") == (0, "0, Tesla V100-SXM2-16GB\n1, Tesla T4\n")
    fact = fact_on(r)
    assert fact.state == "ok" and [g.name for g in fact.gpus] == ["Tesla T4"]


def test_a_590_driver_on_a_v100_alone_loads_no_module(tmp_path):
    """The real 590 module's probe ignores the V100 and finds "No NVIDIA GPU": modprobe fails,
    and nvidia-smi cannot reach a driver (llamarack's rules then name driver-ceiling)."""
    r = root(tmp_path, [V100], lib="590.44.01", module=None)
    (r / "usr/lib/llamarack-lab").mkdir(parents=True)
    (r / "usr/lib/llamarack-lab/nvidia-module-version").write_text("590.44.01\n")
    (r / "proc/driver").mkdir(parents=True)
    env = {"LLAMARACK_FAKE_NVIDIA_ROOT": str(r), "PATH": "/usr/bin:/bin"}
    load = subprocess.run([sys.executable, str(FAKE.parent / "nvidia_module.py"), "load"], env=env,
                          capture_output=True, text=True)  # fmt: skip
    assert (load.returncode, load.stderr) == (1, "modprobe: ERROR: could not insert 'nvidia': No such device\n")
    assert not (r / "proc/driver/nvidia/version").exists()
    assert smi(r) == (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                         "Make sure that the latest NVIDIA driver is installed and running.\n\n")
    assert fact_on(r).state == "no_module"
    # a module of that branch loaded anyway (a root written by hand) lists no card either
    loaded = root(tmp_path / "loaded", [V100], lib="590.44.01", module="590.44.01")
    assert smi(loaded, "-L")[0] == 9
    # beside a T4 it loads
    (r / "etc/llamarack-lab/gpus.json").write_text(json.dumps([V100, T4]))
    assert subprocess.run([sys.executable, str(FAKE.parent / "nvidia_module.py"), "load"], env=env).returncode == 0
    assert smi(r, "--query-gpu=name,driver_version", "--format=csv,noheader") == (0, "Tesla T4, 590.44.01\n")
