"""One compile per build in a run (``llamarack/ship``): the first host that needs a build
compiles it, the others that need the same build receive it, sealed, through the control
machine.

The compiling host proves and seals the build as before (``operations.build``). A receiver
unpacks it beside its builds (``builds/.incoming-<stamp>``), checks every file against the
seal it carries, proves it on its own cards (the smoke run, as a re-proof: no rebuild rung),
seals it as its own and only then moves it into ``builds/``.

A build is shared only between hosts that share its ``key``: its stamp, and for a build whose
CPU code is the building host's own (``llamacpp_cpu_features`` unset: ``-march=native``)
also that CPU's flags, so native code never reaches a CPU it was not made for.

A refused shipment (damaged, or failing the receiver's proof) leaves the host as it was,
still serving its current build; the host then builds for itself. docs/deploy.md
("One compile per build") says where builds are made and why.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from typing import Optional

from pyinfra.api import StringCommand

from llamarack import remote, ship
from llamarack.layout import Layout
from llamarack.operations import private_upload


def build_key(stamp: str, cmake_args: tuple, cpu_flags: Optional[str]) -> Optional[str]:
    """What hosts must share to share a build: the stamp, and the CPU where the code is native.
    None: not shared (a native build on a host whose CPU flags were not read)."""
    native = not any(a.startswith("-DGGML_NATIVE=OFF") for a in cmake_args)
    if not native:
        return stamp
    if not cpu_flags:
        return None
    return f"{stamp}-{hashlib.sha256(cpu_flags.encode()).hexdigest()[:12]}"


def receive(state, host, shipment: ship.Shipment, root: str, name: str, spec: dict) -> bool:
    """Take ``shipment`` in on ``host`` as ``builds/<name>``: checked, proven here, sealed."""
    layout = Layout(root)
    incoming = f"{layout.builds}/.incoming-{name}"
    tar = f"{incoming}.tar"
    q_in, q_tar, q_final = shlex.quote(incoming), shlex.quote(tar), shlex.quote(layout.build(name))
    spec = dict(spec, build_dir=incoming)
    with open(shipment.path, "rb") as f:
        commands = [
            f"mkdir -p {shlex.quote(layout.builds)}",
            *private_upload(f, tar),
            StringCommand(ship.receive_command(tar, shipment.sha256, incoming, "build"), "&&",
                          f"ln -sfn build/bin {q_in}/bin"),  # fmt: skip
            *private_upload(json.dumps(spec, indent=1, sort_keys=True), f"{incoming}/proof-spec.json"),
            StringCommand(remote.command("llamacpp_proof", f"{incoming}/proof-spec.json"), "&&",
                          remote.command("build_seal", "seal", incoming), "&&",
                          f"rm -rf {q_final} && mv -T {q_in} {q_final} && rm -f {q_tar}"),  # fmt: skip
        ]
        ok, _ = ship.run(state, host, commands, ship.SHIP_TIMEOUT)
    if not ok:
        ship.run(state, host, [f"rm -rf {q_in} {q_tar}"])
    return ok


def obtain(state, host, key: str, root: str, name: str, build_commands: list, spec: dict) -> bool:
    """The build step of ``host`` for build ``key``, run when the deploy reaches it (a
    ``FunctionCommand``): receive the build where the run has it, else compile it here
    (``build_commands``), seal it and hold it for the next host."""
    d = Layout(root).build(name)

    def compile_here() -> bool:
        if not ship.run(state, host, build_commands)[0]:
            return False
        ship.run(state, host, [remote.command("build_seal", "seal", d)])  # unsealed: packing it is refused
        return True

    return ship.obtain(state, host, key, "build", f"llama.cpp build {name}", d, compile_here,
                       lambda shipment: receive(state, host, shipment, root, name, spec), verb="compiling")
