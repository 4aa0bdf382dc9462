"""The subcommands of ``llamarack`` that run the roles: settings, audit, plan-upgrade,
rollback, rollout (and plan, ``server/plan_cli.py``). Each is declared in pyproject.toml
(entry points ``llamarack.commands``), where the core's command group
(``llamarack/cli.py``) finds it, and is imported only when run."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import click

TEMPLATES = click.option("--templates", type=click.Path(file_okay=False), default=None,
                         help="operator templates the deploy uses (default: ./templates when it exists)")


@click.command()
@click.option("--group-data", "form", flag_value="group-data", help="as inventory/group_data/all.py")
@click.option("--markdown", "form", flag_value="markdown", default=True, help="as docs/settings.md")
def settings(form):
    """Print every setting with its default."""
    from llamarack.settings_docs import group_data_file, markdown_table

    from .settings import Settings

    click.echo(group_data_file(Settings) if form == "group-data" else markdown_table(Settings), nl=False)


@click.command()
@click.argument("inventory")
@click.option("--limit", multiple=True, metavar="HOST", help="audit only this host (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (schema llamarack-audit/1)")
@TEMPLATES
@click.option("--verify", is_flag=True,
              help="recompute the sha256 of the served model.gguf and of every sealed file of the current build")
@click.option("--debug", is_flag=True, help="the debug log on stderr (each remote command)")
@click.option("--data", multiple=True, metavar="KEY=VALUE",
              help="host data, as the deploy's pyinfra --data gave it (the settings to compare with)")
def audit(inventory, limit, as_json, templates, verify, debug, data):
    """Compare what each host runs with what its settings would deploy.

    One remote command per host, all hosts in parallel; nothing is changed.
    Without --verify the files are compared by the signature recorded at their seal
    (size, mtime, inode); with it, by their sha256.
    Exit status: 0 no drift, 1 drift, 2 a host unreachable or unreadable."""
    if debug:
        logging.basicConfig(level=logging.DEBUG, format="%(message)s")
    else:
        logging.getLogger("pyinfra").setLevel(logging.CRITICAL)  # connection chatter; failures are in the report
    audits = _audits(inventory, limit, templates, verify, data)
    from llamarack import audit as auditmod

    if as_json:
        click.echo(json.dumps(auditmod.as_json(audits), indent=1, default=str))
    else:
        click.echo(auditmod.as_table(audits, colour=sys.stdout.isatty() and not os.environ.get("NO_COLOR")), nl=False)
    sys.exit(auditmod.exit_status(audits))


def _audits(inventory, limit, templates, verify=False, data=()) -> list:
    """The audit of each host of ``inventory`` (``--limit``: those only; ``data``: --data items)."""
    from llamarack import hosts  # first: pyinfra's gevent patching, before anything imports ssl

    from . import audit as auditmod

    if templates is None and Path("templates").is_dir():
        templates = "templates"
    try:
        chosen = hosts.load(inventory, tuple(limit), hosts.parse_data(tuple(data)) or None)
    except ValueError as e:
        raise click.UsageError(str(e))
    return auditmod.run(chosen, (Path(templates).resolve(),) if templates else (), verify)


@click.command("plan-upgrade")
@click.argument("inventory")
@click.option("--limit", multiple=True, metavar="HOST", help="only this host (repeatable)")
@click.option("--json", "as_json", is_flag=True, help="one JSON object (schema llamarack-plan-upgrade/1)")
@TEMPLATES
def plan_upgrade(inventory, limit, as_json, templates):
    """What a deploy with this llamarack would do to each host, and why.

    Run it after upgrading llamarack, before deploying: per host, what would be
    rebuilt, re-proved, remade, installed or restarted. Reads like `llamarack
    audit` (one remote command per host); nothing is changed. Exit status: 0 nothing
    would change, 1 something would, 2 a host could not be read."""
    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
    audits = _audits(inventory, limit, templates)
    from llamarack import audit as auditmod
    from llamarack import upgrade

    click.echo(json.dumps(upgrade.as_json(audits), indent=1) if as_json else upgrade.as_text(audits), nl=not as_json)
    failed = auditmod.exit_status(audits) == 2
    sys.exit(2 if failed else 1 if any(upgrade.host_steps(a) for a in audits) else 0)


@click.command()
@click.argument("inventory")
@click.option("--limit", multiple=True, metavar="HOST", help="roll back only this host (repeatable)")
@click.option("--unit", type=click.IntRange(0, 1023), default=None, metavar="N",
              help="only unit N of a host of several (llamarack-server@N.service; 0: a host's one unit)")
def rollback(inventory, limit, unit):
    """Put back, on each host, the unit that served before the last switch.

    On a host of several units, each unit that has a previous one (or only
    --unit N). Its build and model are switched in as any unit is (restart,
    /health, the unit in place restored if it does not answer), then pinned: a
    deploy with unchanged settings keeps it; changed settings, or a second
    rollback (forward again), release it. Runs `pyinfra -y INVENTORY roles.deploy.rollback`,
    the rollback that ships with llamarack."""
    from .deploy import ROLLBACK_UNIT_ENV
    from .rollout import package_env, pyinfra_argv

    args = pyinfra_argv(inventory, "roles.deploy.rollback", *[w for name in limit for w in ("--limit", name)])
    env = package_env()
    env.pop(ROLLBACK_UNIT_ENV, None)
    if unit is not None:
        env[ROLLBACK_UNIT_ENV] = str(unit)
    sys.exit(subprocess.run(args, env=env).returncode)


@click.command()
@click.argument("inventory")
@click.argument("deploy_file", metavar="[DEPLOY]", required=False)
@click.option("--canary", metavar="HOST", help="the host rolled first, alone (default: the first serving host)")
@click.option("--batch", type=click.IntRange(1), default=1, show_default=True,
              help="hosts rolled side by side after the canary, in inventory order")
@click.option("--max-fail", type=click.IntRange(1), default=1, show_default=True,
              help="stop at this many failed hosts (a failed canary always stops)")
@click.option("--resume", is_flag=True, help="go on from the rollout on file (.llamarack/rollout-<inventory>.json)")
@click.option("--dry", is_flag=True, help="print the order and what each host would get; touch nothing")
@click.option("--idle-timeout", type=click.FloatRange(0), default=600, show_default=True, metavar="S",
              help="seconds a drained host's streams and units may take to go idle")
@click.option("--bench-fraction", type=click.FloatRange(0, 1), default=0.25, show_default=True, metavar="F",
              help="a new build or model's llama-bench may fall this fraction below the record before it")
@click.option("--stage/--no-stage", default=True, show_default=True,
              help="llamarack's deploy: make every host's build and model first, all at once, none drained")
@click.option("--data", multiple=True, metavar="KEY=VALUE", help="host data for the deploy, as pyinfra's --data")
def rollout(inventory, deploy_file, canary, batch, max_fail, resume, dry, idle_timeout, bench_fraction, stage, data):
    """Roll the deploy through the serving hosts, one batch at a time, behind the gateway.

    llamarack's own deploy is staged first: every host runs roles.deploy.stage (its build
    and model made beside what it serves, and proven), all at once, none drained; a host
    whose stage fails is never drained. Then the canary, then batches in inventory order.
    Each host is drained on every
    gateway (HAProxy's runtime API) and waited idle, deployed alone
    (`pyinfra -y INVENTORY DEPLOY --limit HOST`), gated (/health, residency, a
    completion, llama-bench against its record after a new build or model) and
    undrained. The first failure stops the rollout, the failed host drained; --resume
    goes on from there. DEPLOY: a deploy file, or a deploy that ships with llamarack by its
    name (roles.driver.upgrade.driver_upgrade); roles.deploy.main, the main job, by default.
    Exit status: 0 every host done, 1 a host failed, 2 refused (nothing touched)."""
    from . import rollout as rolloutmod

    logging.getLogger("pyinfra").setLevel(logging.CRITICAL)  # connection chatter; failures are in the states
    options = rolloutmod.Options(canary, batch, max_fail, idle_timeout, bench_fraction, stage=stage)
    templates = (Path("templates").resolve(),) if Path("templates").is_dir() else ()
    request = rolloutmod.Request(inventory, deploy_file, tuple(data), options, resume, dry, templates)
    sys.exit(rolloutmod.main(request, echo=click.echo))
