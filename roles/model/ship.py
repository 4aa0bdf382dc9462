"""One model artifact per run (``llamarack/ship``): the first host that needs an artifact makes
it (fetch, AWQ, convert, quantize, quality: ``operations.artifact``), the others that need the
same artifact (its stamp: the same source, pins, tools and quantization) receive it, sealed,
through the control machine, and the hub is asked for the checkpoint once.

A receiver unpacks the tar into ``models/.staging/incoming-<name>`` (the staging's own parent,
which the pipeline user cannot list), checks every file against the manifest it carries and
the GGUF against the seal it carries (``stamp.json``), checks that the seal is of the artifact
it wants, seals it as its own (its own file's signature) and only then moves it into place as
a made artifact is moved. The switch to it proves it on the host's own cards, as for one made
there (the server role's health and residency checks). A refused shipment leaves the host as
it was, serving what it served; the host then makes the artifact itself.
"""

from __future__ import annotations

import shlex
from typing import Optional

from pyinfra import logger
from pyinfra.api import StringCommand

from llamarack import remote, ship
from llamarack.operations import private_upload

from .plan import ModelPlan


def key(plan: ModelPlan) -> str:
    return f"model-{plan.name}"


def incoming(plan: ModelPlan) -> str:
    return f"{plan.models_dir}/.staging/incoming-{plan.name}"


def receive(state, host, shipment: ship.Shipment, plan: ModelPlan, python: str, place: list) -> bool:
    """Take ``shipment`` in on ``host``: checked, its seal the one wanted, sealed here, then
    ``place`` (the commands that move ``incoming(plan)`` into place)."""
    q, into = shlex.quote, incoming(plan)
    tar, sealed_as = f"{into}.tar", '"stamp": "%s"' % plan.stamp  # as model_fetch seal writes it
    reseal = remote.command("model_fetch", "seal", "--stamp", f"{into}/stamp.json", "--gguf", f"{into}/model.gguf",
                            "--out", f"{into}/stamp.json", python=python)  # fmt: skip
    with open(shipment.path, "rb") as f:
        commands = [
            f"install -d -m 755 {q(plan.models_dir)} && install -d -m 711 {q(plan.models_dir + '/.staging')}",
            *private_upload(f, tar),
            StringCommand(ship.receive_command(tar, shipment.sha256, into, "model"), "&&",
                          f"grep -qF -- {q(sealed_as)} {q(into + '/stamp.json')}", "&&",
                          reseal, "&&", f"chown -R root:root {q(into)} && chmod -R a+rX,go-w,ug-s {q(into)}",
                          "&&", f"rm -f {q(tar)}"),  # fmt: skip
            *place,
        ]
        ok, _ = ship.run(state, host, commands, ship.SHIP_TIMEOUT)
    if not ok:
        ship.run(state, host, [f"rm -rf {q(into)} {q(tar)}"])
    return ok


def obtain(state, host, plan: ModelPlan, make: list, python: str, place: list, note: Optional[str] = None) -> bool:
    """The artifact step of ``host`` (a ``FunctionCommand``'s work): receive the artifact where
    the run has it, else make it here (``make``: the pipeline's commands; ``note``: what its
    fetch says first) and hold it."""

    def make_here() -> bool:
        if note:
            logger.info(host.print_prefix + note)
        return ship.run(state, host, make)[0]

    return ship.obtain(state, host, key(plan), "model", f"model {plan.name}", plan.dir, make_here,
                       lambda shipment: receive(state, host, shipment, plan, python, place), verb="making")
