"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

import json

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.facts.files import FileContents

from roles.driver.reads import RecordedGpus
from roles.llamacpp.reads import LlamacppBuilds
from llamarack.facts import read
from llamarack.layout import unit_build
from llamarack.operations import report
from roles.preflight.facts import HostFacts
from roles.settings import Settings

from ..llamacpp.operations import prune_builds
from .operations import answers_health, bench, service, system_account
from .plan import serving_lines
from .reads import ServedUnits


@deploy("llama-server")
def llama_server(settings: Settings, facts: HostFacts, templates: tuple = (), rebooted=None):
    """Run llama-server as a system service and check that it answers.

    + settings: the host's settings (``server_*``, ``llamarack_service_user``)
    + facts: what preflight read; where it knew no GPU (a mismatch the driver role reboots
      away), the service reads the record the driver role wrote after the reboot
    + templates: folders whose templates replace the role's own (the project's ``templates/``)
    + rebooted: the driver role's reboot operation, or None; when it rebooted the host and the
      unit was not switched, ``/health`` is checked anyway: the same unit runs on a new driver"""
    user = settings.general.service_user  # no shell; its home, not created, is the llamarack root
    system_account(name=f"Service user {user}", user=user, home=settings.general.root, setting="llamarack_service_user")
    # The build that served before this run (else the one current then): kept for rollback
    # whatever else was built since. A staged host's current build is already the new one.
    root = settings.general.root
    served = [unit_build(root, u.lines) for u in read(ServedUnits, state=settings.layout.state, health=True).values()]
    previous = next(filter(None, served), None) or read(LlamacppBuilds, root=root).current
    listen, reach = settings.server.listen, host.data.get("ssh_hostname") or host.name
    addr = reach if listen in ("0.0.0.0", "::") else listen
    url = f"http://{addr}:{settings.server.port}"
    key = "API key required" if settings.server.api_key_file else "no API key"
    served = service(name=f"llama-server at {url} ({key})", settings=settings, gpus=facts.gpus,
                     templates=tuple(templates))
    if rebooted is not None:
        answers_health(name="llama-server answers /health after the driver reboot", settings=settings,
                       reason="the reboot for the driver upgrade",
                       _if=[rebooted.did_change, lambda: not served.did_change()])
    # After a new build or model: llama-bench with the served flags, recorded beside the
    # card's roofline (state/bench.json); a converged run finds its record and does nothing.
    bench(name=f"llama-bench pp512/tg128 (server_bench = {settings.server.bench!r})", settings=settings,
          gpus=facts.gpus)
    # Old builds go only now, once the unit that serves has answered /health (or was put
    # back): nothing the running server uses is removed before its successor serves. The builds
    # the units name are read when the prune runs.
    prune_builds(name=f"Prune old llama.cpp builds (keep {settings.llamacpp.keep_builds})", root=settings.general.root,
                 keep=settings.llamacpp.keep_builds, previous=previous,
                 serving=lambda: tuple(unit_build(settings.general.root, u.lines)
                                       for u in read(ServedUnits, state=settings.layout.state, health=True).values()))
    report(name="How to reach it", message=lambda: serving(settings, reach, facts.gpus))


def serving(settings: Settings, address: str, gpus: tuple) -> str:
    """The closing lines, read when the run reaches them: every unit the server role recorded
    (``state/units.json``), with its cards (the run's GPUs; after the driver role's reboot,
    its record of them)."""
    lines = read(FileContents, path=settings.layout.units_record)
    try:
        record = json.loads("\n".join(lines)) if lines else None
    except ValueError:
        record = None
    cards = gpus or read(RecordedGpus, path=settings.layout.gpus_record) or ()
    return serving_lines(settings, address, record if isinstance(record, dict) else None, tuple(cards))
