"""The driver role's operations: hold the driver packages, check the driver answers, record the cards."""

import shlex

from pyinfra import host
from pyinfra.api import StringCommand, operation

from llamarack import remote
from llamarack.facts import read
from llamarack.operations import put_record

from .reads import NvidiaDriverPackages, NvidiaSmi, gpus_record


@operation()
def driver_package_holds(hold: bool = True):
    """apt-mark hold (or unhold) every installed NVIDIA driver package.

    + hold: True holds, False unholds

    A held driver cannot move under an unattended upgrade, which would leave
    the old kernel module loaded ("Driver/library version mismatch") or, past
    the 580 branch, drop Volta and Pascal cards."""
    packages = read(NvidiaDriverPackages)
    if not packages:
        host.noop("no NVIDIA driver package installed")
        return
    todo = [p.name for p in packages if p.held != hold]
    state = "held" if hold else "not held"
    if not todo:
        host.noop(f"NVIDIA driver packages already {state}: {', '.join(p.name for p in packages)}")
        return
    yield StringCommand(remote.argv("apt-mark", "hold" if hold else "unhold", *todo))


@operation(is_idempotent=False)
def driver_answers(reason: str):
    """Fail unless nvidia-smi answers (after a reboot that should have loaded the new module).

    + reason: what should have fixed the driver, for the message"""
    yield StringCommand("out=$(nvidia-smi --query-gpu=index,driver_version --format=csv,noheader 2>&1) || "
                        f"{{ printf '%s\\n' {shlex.quote(f'{host.name}: driver still fails after {reason}:')} "
                        '"$out" >&2; exit 1; }')


@operation()
def record_gpus(path: str, gpus=None, recorded=None):
    """Record the cards of this run, for the rules to fall back on when a later
    driver hides them (a dropped card, an upgrade waiting for a reboot).

    + path: the JSON record (``Layout.gpus_record``)
    + gpus: the cards to record (preflight's ``HostFacts.gpus``); None: those
      nvidia-smi lists when the operation runs (after a reboot earlier in the run)
    + recorded: what the record holds (preflight read it): no write when equal"""
    if gpus is None:
        gpus = read(NvidiaSmi).gpus
    if not gpus:
        host.noop("the driver lists no GPU: the GPU record is left as it is")
        return
    text = gpus_record(gpus)
    if recorded and gpus_record(recorded) == text:
        host.noop(f"GPU record already lists {len(gpus)} card(s)")
        return
    yield from put_record(path, text)
