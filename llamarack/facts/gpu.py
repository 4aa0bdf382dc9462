"""Facts about the NVIDIA driver and the GPUs it sees."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from .value import FactValue

# Drivers before 510 do not know the compute_cap field; the fact then falls
# back to this table (names as nvidia-smi prints them).
COMPUTE_CAP_BY_NAME = {
    "Tesla P100": "6.0",
    "Tesla P40": "6.1",
    "Tesla P4": "6.1",
    "Tesla V100": "7.0",
    "Tesla T4": "7.5",
    "Quadro GV100": "7.0",
    "TITAN V": "7.0",
    "NVIDIA TITAN V": "7.0",
    "NVIDIA A100": "8.0",
    "NVIDIA H100": "9.0",
    "NVIDIA H200": "9.0",
}

_MARK = "llamarack:"


@dataclass(frozen=True)
class Gpu(FactValue):
    index: int
    name: str
    uuid: str
    memory_mib: int
    compute_cap: Optional[str]
    driver_version: str

    @property
    def arch(self) -> Optional[str]:
        """The CUDA architecture number ("7.0" -> "70") used for -arch=sm_XX."""
        return self.compute_cap.replace(".", "") if self.compute_cap else None


@dataclass(frozen=True)
class DriverState(FactValue):
    """What ``nvidia-smi`` says about the driver.

    state is one of:
    - ``ok``: the driver answers; ``gpus`` lists the GPUs;
    - ``missing``: no ``nvidia-smi`` on the host (no driver installed);
    - ``no_module``: the kernel module is not loaded (after a kernel upgrade
      without DKMS, or a blacklisted module);
    - ``mismatch``: user-space library and loaded module differ (a driver
      upgrade without reboot); ``library_version`` is the NVML library's;
    - ``no_devices``: the driver runs but lists no GPU ("No devices were
      found"), e.g. a driver branch that dropped the card;
    - ``error``: anything else; ``message`` holds nvidia-smi's words.
    """

    state: str
    gpus: tuple[Gpu, ...] = ()
    library_version: Optional[str] = None
    message: str = ""

    @property
    def driver_version(self) -> Optional[str]:
        return self.gpus[0].driver_version if self.gpus else None


class NvidiaSmi(FactBase[DriverState]):
    """
    Returns the driver state and GPU list from ``nvidia-smi --query-gpu``.

    .. code:: python

        DriverState(state="ok", gpus=(Gpu(index=0, name="Tesla V100-SXM2-16GB",
            uuid="GPU-...", memory_mib=16384, compute_cap="7.0",
            driver_version="550.127.05"),))

    The command always exits 0 and ends with ``llamarack: exit N`` (nvidia-smi's
    own exit code), so a broken driver is a fact value, not a failed fact.
    """

    FIELDS = "index,name,uuid,memory.total,compute_cap,driver_version"
    FIELDS_PRE_510 = "index,name,uuid,memory.total,driver_version"

    def command(self) -> str:
        query = "nvidia-smi --query-gpu={} --format=csv,noheader,nounits 2>&1"
        return (
            f"if ! command -v nvidia-smi >/dev/null 2>&1; then echo '{_MARK} missing'; exit 0; fi; "
            f"out=$({query.format(self.FIELDS)}); rc=$?; "
            'case "$out" in *"is not a valid field"*) '
            f"out=$({query.format(self.FIELDS_PRE_510)}); rc=$?;; esac; "
            f'printf "%s\\n" "$out"; echo "{_MARK} exit $rc"'
        )

    def process(self, output) -> DriverState:
        lines = [line for line in output if line.strip()]
        if lines == [f"{_MARK} missing"]:
            return DriverState("missing")
        if not lines or not lines[-1].startswith(f"{_MARK} exit "):
            raise FactProcessError(f"unexpected nvidia-smi fact output: {output!r}")

        exit_code = int(lines[-1].split()[-1])
        body = lines[:-1]
        text = "\n".join(body)
        if "couldn't communicate with the NVIDIA driver" in text:
            return DriverState("no_module", message=text)
        if "Driver/library version mismatch" in text:
            match = re.search(r"NVML library version: (\S+)", text)
            return DriverState("mismatch", library_version=match and match.group(1), message=text)
        if "No devices were found" in text:
            return DriverState("no_devices", message=text)
        if exit_code != 0:
            return DriverState("error", message=text)
        return DriverState("ok", gpus=tuple(_parse_gpu_line(line) for line in body))


def _parse_gpu_line(line: str) -> Gpu:
    values = [v.strip() for v in line.split(",")]
    if len(values) == 6:
        index, name, uuid, memory, cap, driver = values
    elif len(values) == 5:
        index, name, uuid, memory, driver = values
        cap = _compute_cap_from_name(name)
    else:
        raise FactProcessError(f"unexpected nvidia-smi GPU line: {line!r}")
    try:
        return Gpu(int(index), name, uuid, int(memory), cap, driver)
    except ValueError as e:
        raise FactProcessError(f"unexpected nvidia-smi GPU line: {line!r}") from e


def _compute_cap_from_name(name: str) -> Optional[str]:
    for prefix, cap in COMPUTE_CAP_BY_NAME.items():
        if name.startswith(prefix):
            return cap
    return None


@dataclass(frozen=True)
class KernelModule(FactValue):
    version: str
    open: bool


class NvidiaKernelModule(FactBase[Optional[KernelModule]]):
    """
    Returns the loaded NVIDIA kernel module's version from ``/proc/driver/nvidia/version``,
    or None when no module is loaded.

    .. code:: python

        KernelModule(version="580.159.04", open=True)
    """

    def command(self) -> str:
        return "cat /proc/driver/nvidia/version 2>/dev/null || true"

    def process(self, output) -> Optional[KernelModule]:
        for line in output:
            if line.startswith("NVRM version:"):
                match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", line)
                if not match:
                    raise FactProcessError(f"unexpected NVRM line: {line!r}")
                return KernelModule(match.group(1), open="Open Kernel Module" in line)
        return None


class RecordedGpus(FactBase[tuple]):
    """
    Returns the GPUs llamarack recorded at the last run where the driver
    answered (a JSON list in the state directory), or ``()``; their
    ``driver_version`` is empty (not recorded).

    A driver that has dropped the card, or an upgrade waiting for a reboot,
    hides the GPU list; the recorded one still says which cards the host has.
    """

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null || true"

    def default(self) -> tuple:
        return ()

    def process(self, output) -> tuple:
        text = "\n".join(output).strip()
        if not text:
            return ()
        try:
            return tuple(Gpu(**item, driver_version="") for item in json.loads(text))
        except (ValueError, TypeError) as e:
            raise FactProcessError(f"unreadable GPU record: {e}") from e


def gpus_record(gpus) -> str:
    """The JSON that ``RecordedGpus`` reads back.

    The cards only, not the driver: a driver upgrade must not rewrite it (a
    converged host changes nothing), and the driver is read live anyway.
    """
    cards = [{k: v for k, v in gpu.__dict__.items() if k != "driver_version"} for gpu in gpus]
    return json.dumps(cards, indent=1, sort_keys=True) + "\n"
