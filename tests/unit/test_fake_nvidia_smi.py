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
from roles.driver.reads import NvidiaSmi

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
    from roles.driver.reads import GpuProcesses

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


# -- hosts with several cards ------------------------------------------------------

MULTI = ("v100-sxm2-16gb-x8", "rtx3090-p40-x3", "v100-16gb-x2")


def host_root(tmp_path, profile, host="lab-x", driver="550.127.05", **kw):
    from llamarack_lab import profiles

    return root(tmp_path, profiles.gpus_json(host, profile), lib=driver, module=driver, **kw)


@pytest.mark.parametrize("profile", MULTI)
def test_a_multi_card_host_lists_every_card_as_the_card_table_has_it(tmp_path, profile):
    from llamarack import gpu_table
    from llamarack_lab import profiles

    cards = profiles.gpus_json("lab-x", profile)
    r = host_root(tmp_path, profile)
    fact = fact_on(r)
    assert fact.state == "ok" and [g.uuid for g in fact.gpus] == [c["uuid"] for c in cards]
    assert len({c["uuid"] for c in cards}) == len(cards) == len(profiles.PROFILES[profile].gpus)
    for gpu in fact.gpus:
        board = gpu_table.board(gpu.pci_device_id)
        assert (board.compute_cap, board.memory_gb * 1024) == (gpu.compute_cap, gpu.memory_mib), gpu
    rc, table = smi(r)
    rows = [line for line in table.split("\n")[1:] if line]
    assert rc == 0 and all(len(line) == 91 for line in rows), table
    assert [line[6:36].strip() for line in rows if re.match(r"\|\s+\d+  ", line)] == [c["name"] for c in cards]
    assert smi(r, "-L")[1].count("\n") == len(cards)


def test_the_dgx1_host_has_a_dgx1s_cards_and_bus(tmp_path):
    rc, out = smi(host_root(tmp_path, "v100-sxm2-16gb-x8"), "--query-gpu=index,name,pci.bus_id,pci.device_id",
                  "--format=csv,noheader")  # fmt: skip
    assert rc == 0 and out.splitlines() == [
        f"{i}, Tesla V100-SXM2-16GB, 00000000:{bus}:00.0, 0x1DB110DE"
        for i, bus in enumerate(["06", "07", "0A", "0B", "85", "86", "89", "8A"])]  # fmt: skip


def fixture(name):
    return json.loads((FACTS / "GpuTopology" / f"{name}.json").read_text())


def test_the_dgx1_topology_is_the_real_matrix_in_the_real_layout(tmp_path):
    """The NVLink mesh of the real DGX-1 captures, in the current drivers' layout (tabs, the
    NUMA columns, the legend's words of the real one)."""
    from roles.driver.reads import GpuTopology

    rc, out = smi(host_root(tmp_path, "v100-sxm2-16gb-x8"), "topo", "-m")
    lines = out.split("\n")
    real = fixture("dgx1_v100_driver_570")["output"]  # as published: its tabs as spaces
    assert rc == 0 and out.endswith("\n") and [line.split() for line in lines[:9]] == [line.split() for line in real[:9]]
    assert lines[9:-1] == real[9:]  # the blank line, the legend
    assert lines[1] == "GPU0\t X \tNV1\tNV1\tNV2\tNV2\tSYS\tSYS\tSYS\t0-19,40-59\t0\t\tN/A"
    assert lines[0] == "\t" + "\t".join([f"GPU{i}" for i in range(8)] + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    assert fact_on(host_root(tmp_path / "again", "v100-sxm2-16gb-x8"), GpuTopology) == GpuTopology().process(
        fixture("dgx1_v100_mlx5")["output"])


def test_a_pcie_host_is_phb_node_and_sys_and_the_header_is_underlined_on_a_terminal(tmp_path):
    import os
    import pty

    from roles.driver.reads import GpuTopology, topology_summary

    r = host_root(tmp_path, "rtx3090-p40-x3")
    topology = fact_on(r, GpuTopology)
    assert topology_summary(topology) == ("4 cards; PCIe only between 0-1:NODE 0-2:SYS 0-3:SYS 1-2:SYS 1-3:SYS 2-3:PHB")
    leader, follower = pty.openpty()
    env = {"LLAMARACK_FAKE_NVIDIA_ROOT": str(r), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(FAKE), "topo", "-m"], stdout=follower, env=env, check=True)
    os.close(follower)
    first = os.read(leader, 4096).decode().split("\r\n")[0]
    os.close(leader)
    assert first == "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    assert smi(r, "topo")[0] == 2


def test_the_audit_shows_the_links_per_card_pair(tmp_path):
    from roles.driver.audit import topology_found
    from roles.driver.reads import GpuTopology

    found = topology_found(fact_on(host_root(tmp_path, "v100-sxm2-16gb-x8"), GpuTopology))
    assert found["summary"].startswith("8 cards; NVLink between 0-1:NV1 0-2:NV1 0-3:NV2 0-4:NV2 1-2:NV2 ")
    assert found["summary"].endswith("; PCIe only between 0-5:SYS 0-6:SYS 0-7:SYS 1-4:SYS 1-6:SYS 1-7:SYS "
                                     "2-4:SYS 2-5:SYS 2-7:SYS 3-4:SYS 3-5:SYS 3-6:SYS")  # fmt: skip
    assert (found["cards"], len(found["nvlink"]), found["nvlink"]["0-3"], found["problem"]) == (8, 16, 2, None)
    garbled = topology_found(GpuTopology().process(fixture("garbled")["output"]))
    assert garbled["summary"].startswith("4 cards; PCIe only between 0-3:SYS 1-2:SYS 1-3:SYS; unread: no row of GPU3")
    assert topology_found(GpuTopology().default())["summary"] == "no cards"


# -- a card off the bus ------------------------------------------------------------

def test_a_card_off_the_bus_is_not_listed_and_the_others_are_numbered_without_it(tmp_path):
    from roles.driver.reads import GpuTopology
    from llamarack_lab import profiles

    cards = profiles.gpus_json("lab-x", "v100-sxm2-16gb-x8")
    r = host_root(tmp_path, "v100-sxm2-16gb-x8")
    (r / "etc/llamarack-lab/cards-off.json").write_text(json.dumps([cards[2]["uuid"]]))
    rc, out = smi(r, "--query-gpu=index,uuid,pci.bus_id", "--format=csv,noheader")
    assert rc == 0 and out.splitlines() == [f"{i}, {c['uuid']}, {c['bus_id']}" for i, c in
                                            enumerate(cards[:2] + cards[3:])]  # fmt: skip
    assert "0A:00.0" not in smi(r)[1] and smi(r, "-L")[1].count("\n") == 7
    topology = fact_on(r, GpuTopology)
    # the old card 3 is now 2: its NV2 to card 0 and NV1 to the old card 7, now 6
    assert (len(topology.cards), topology.problem) == (7, "")
    assert {(x.first, x.second): x.link for x in topology.links}[(0, 2)] == "NV2"
    assert {(x.first, x.second): x.link for x in topology.links}[(2, 6)] == "NV1"
    (r / "etc/llamarack-lab/cards-off.json").write_text(json.dumps([c["uuid"] for c in cards]))
    assert smi(r) == (6, "No devices were found\n") and fact_on(r).state == "no_devices"
    (r / "etc/llamarack-lab/cards-off.json").write_text("[]")
    assert len(fact_on(r).gpus) == 8


# -- running llama-servers on the cards ---------------------------------------------

MODEL_BYTES = 9 * (1 << 30) + 5  # a 9 GiB model file (sparse): 9217 MiB, rounded up


def serve(r, pid, argv, environ, unit="llamarack-server.service", cwd=None):
    """A process in the fake's /proc: its command line, environment, cgroup and working directory."""
    d = r / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in environ.items()))
    (d / "cgroup").write_text(f"0::/system.slice/{unit}\n")
    (d / "cwd").symlink_to(cwd or r)


def model_file(r, name="model.gguf", size=MODEL_BYTES):
    path = r / "opt/llamarack/models" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


SERVER = "/opt/llamarack/builds/0123456789abcdef/bin/llama-server"
APPS = ("--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid", "--format=csv")


def test_a_llama_server_is_listed_on_the_cards_its_environment_names(tmp_path):
    from roles.driver.reads import GpuProcesses
    from llamarack_lab import profiles

    cards = profiles.gpus_json("lab-x", "v100-sxm2-16gb-x8")
    r = host_root(tmp_path, "v100-sxm2-16gb-x8")
    model = model_file(r)
    serve(r, 4242, [SERVER, "-m", str(model), "--port", "8083"], {"CUDA_VISIBLE_DEVICES": cards[3]["uuid"]},
          unit="llamarack-server@3.service")  # fmt: skip
    serve(r, 4300, [SERVER, "--model", "models/model.gguf"], {"CUDA_VISIBLE_DEVICES": "5"}, cwd=r / "opt/llamarack")
    serve(r, 4400, ["/usr/bin/python3", "-m", str(model)], {"CUDA_VISIBLE_DEVICES": "1"})  # not a llama-server
    serve(r, 4500, [SERVER, "-m", str(model)], {"PATH": "/usr/bin"})  # no card named: the lab's CPU builds
    rc, out = smi(r, *APPS)
    assert (rc, out) == (0, "pid, process_name, used_gpu_memory [MiB], gpu_uuid\n"
                            f"4242, {SERVER}, 9217 MiB, {cards[3]['uuid']}\n"
                            f"4300, {SERVER}, 9217 MiB, {cards[5]['uuid']}\n")  # fmt: skip
    assert [(p.pid, p.used_mib, p.gpu_uuid) for p in fact_on(r, GpuProcesses)] == [
        (4242, 9217, cards[3]["uuid"]), (4300, 9217, cards[5]["uuid"])]  # fmt: skip
    assert smi(r, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits")[1].splitlines()[3:6] == [
        "3, 9217", "4, 0", "5, 9217"]  # fmt: skip
    table = smi(r)[1]
    assert "|    3   N/A  N/A            4242      C   ...456789abcdef/bin/llama-server       9217MiB |" in table


def test_a_split_server_holds_its_tensor_split_share_on_each_card(tmp_path):
    from llamarack_lab import profiles

    cards = profiles.gpus_json("lab-x", "v100-16gb-x2")
    r = host_root(tmp_path, "v100-16gb-x2")
    model = model_file(r, size=16 * (1 << 30))
    both = f"{cards[0]['uuid']},{cards[1]['uuid']}"
    serve(r, 7001, [SERVER, "-m", str(model), "--split-mode", "layer", "--tensor-split", "3,1", "--main-gpu", "0"],
          {"CUDA_VISIBLE_DEVICES": both})  # fmt: skip
    assert smi(r, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits") == (
        0, f"7001, 12288, {cards[0]['uuid']}\n7001, 4096, {cards[1]['uuid']}\n")
    # no --tensor-split: by the cards' memory, as llama.cpp's default split
    (r / "proc/7001/cmdline").write_bytes(f"{SERVER}\0-m\0{model}\0".encode())
    assert smi(r, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits") == (0, "7001, 8192\n7001, 8192\n")
    # a UUID's unique start names the card, as CUDA reads it; an entry naming none ends the list
    (r / "proc/7001/environ").write_bytes(f"CUDA_VISIBLE_DEVICES={cards[1]['uuid'][:12]},7,0\0".encode())
    assert smi(r, "--query-compute-apps=pid,used_memory,gpu_uuid", "--format=csv,noheader,nounits") == (
        0, f"7001, 16384, {cards[1]['uuid']}\n")


def test_the_lab_hides_running_servers_and_an_explicit_list_replaces_them(tmp_path):
    from llamarack_lab import profiles

    cards = profiles.gpus_json("lab-x", "v100-16gb-x2")
    r = host_root(tmp_path, "v100-16gb-x2")
    model = model_file(r)
    serve(r, 81, [SERVER, "-m", str(model)], {"CUDA_VISIBLE_DEVICES": "0"}, unit="llamarack-server@0.service")
    serve(r, 82, [SERVER, "-m", str(model)], {"CUDA_VISIBLE_DEVICES": "1"}, unit="llamarack-server@1.service")
    pids = ("--query-compute-apps=pid", "--format=csv,noheader")
    assert smi(r, *pids) == (0, "81\n82\n")
    hidden = r / "etc/llamarack-lab/gpu-processes-hidden.json"
    for value, listed in (({"all": True}, ""), ({"units": ["llamarack-server@1.service"]}, "81\n"), ({"pids": [81]}, "82\n")):
        hidden.write_text(json.dumps(value))
        assert smi(r, *pids) == (0, listed), value
    hidden.unlink()
    (r / "etc/llamarack-lab/gpu-processes.json").write_text(json.dumps(
        [{"pid": 9, "name": "python3", "used_mib": 10, "gpu_uuid": cards[1]["uuid"]}]))
    assert smi(r, *pids) == (0, "9\n")


class FakeRack:
    """llamarack_lab.rack.Rack's calls the helpers make: a host's record, and SSH commands answered in order."""

    def __init__(self, *answers):
        self.sent, self.answers = [], list(answers)

    def host(self, name):
        return {"name": name, "profile": "v100-sxm2-16gb-x8"}

    def ssh(self, host, cmd, input=None):
        self.sent.append((host, cmd, input))
        return subprocess.CompletedProcess(cmd, 0, self.answers.pop(0) if self.answers else "", "")


def test_the_lab_helpers_take_a_card_off_and_hide_processes(tmp_path):
    from llamarack_lab import driver, profiles
    from llamarack_lab.util import LabError

    cards = profiles.gpus_json("lab-v100x8", "v100-sxm2-16gb-x8")
    rack = FakeRack(json.dumps([cards[5]["uuid"]]))
    said = driver.set_card(rack, "lab-v100x8", 2, on=False)
    assert said == "lab-v100x8: card 2 (00000000:0A:00.0) off the bus; cards listed: [0, 1, 3, 4, 6, 7]"
    assert rack.sent[0][1] == "cat /etc/llamarack-lab/cards-off.json 2>/dev/null || echo '[]'"
    assert json.loads(rack.sent[1][2]) == [cards[5]["uuid"], cards[2]["uuid"]]
    rack = FakeRack(json.dumps([cards[5]["uuid"], cards[2]["uuid"]]))
    assert driver.set_card(rack, "lab-v100x8", 5, on=True).endswith("back on the bus; cards listed: [0, 1, 3, 4, 5, 6, 7]")
    assert json.loads(rack.sent[1][2]) == [cards[2]["uuid"]]
    with pytest.raises(LabError, match="has 8 card"):
        driver.set_card(FakeRack(), "lab-v100x8", 8, on=False)
    rack = FakeRack()
    assert driver.hide_gpu_processes(rack, "lab-v100x8", units=("llamarack-server@1.service",)) == (
        "lab-v100x8: llamarack-server@1.service hidden from the driver's lists")
    assert json.loads(rack.sent[0][2]) == {"all": False, "pids": [], "units": ["llamarack-server@1.service"]}
    driver.hide_gpu_processes(rack, "lab-v100x8")
    assert json.loads(rack.sent[1][2]) == {"all": True, "pids": [], "units": []}
    assert driver.hide_gpu_processes(rack, "lab-v100x8", False) == "lab-v100x8: no process hidden"
    assert rack.sent[2][1] == "rm -f /etc/llamarack-lab/gpu-processes-hidden.json"
    assert driver.set_gpu_processes(rack, "lab-v100x8") == "lab-v100x8: the running GPU processes listed"
    assert rack.sent[3][1] == "rm -f /etc/llamarack-lab/gpu-processes.json"
