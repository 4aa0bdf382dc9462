"""`llamarack lab ...`: the click group attached to the main CLI."""

from __future__ import annotations

import os
import sys

import click

from . import rack as rackmod
from .fake_nvidia import deb
from .util import LabError


def _fail(e: Exception) -> None:
    raise click.ClickException(str(e))


@click.group(name="lab")
def lab() -> None:
    """A rack of real Debian hosts (systemd-nspawn + SSH) on this machine."""


@lab.command()
@click.argument("n", type=int, required=False)
@click.option("--gpus", "gpus", metavar="SPEC",
              help="profiles, e.g. v100-16gb,v100-16gb,v100-32gb,t4 or v100-16gb*2")
@click.option("--driver-version", default=deb.DEFAULT_VERSION, show_default=True,
              help="fake NVIDIA driver installed on GPU hosts")
@click.option("--gateway/--no-gateway", default=True, show_default=True,
              help="boot the gateway host lab-gw (HAProxy, group gateways) after the serving hosts")
@click.option("--memory-mib", type=click.IntRange(64), metavar="MIB",
              help="cap each serving host's memory (its MemTotal, and the OOM killer's limit); default: the machine's")
def up(n, gpus, driver_version, gateway, memory_mib):
    """Start a rack of N serving hosts (default: the 4-host default rack) and its gateway."""
    try:
        rack = rackmod.up(n, gpus, driver_version, gateway=gateway, memory_mib=memory_mib)
    except (LabError, ValueError) as e:
        _fail(e)
    for h in rack.hosts:
        click.echo(f"{h.name:16} {h.ip:12} {'gateway' if h.gateway else h.profile}")
    click.echo(f"inventory: {rack.inventory_path}")


@lab.command()
def down():
    """Stop the rack and remove everything it created."""
    errors = rackmod.down()
    for e in errors:
        click.echo(f"warning: {e}", err=True)
    if errors:
        sys.exit(1)


@lab.command()
def status():
    """Show the hosts of the running rack."""
    st = rackmod.status()
    if not st:
        click.echo("no rack is up")
        sys.exit(3)
    for h in st:
        state = "up" if h["alive"] and h["ssh"] else ("booting" if h["alive"] else "down")
        click.echo(f"{h['name']:16} {h['ip']:12} {h['profile']:10} {state}")


@lab.command()
@click.argument("host")
@click.option("--version", "version", help="install this driver version (module stays until reboot)")
@click.option("--state", "state", type=click.Choice(["ok", "missing", "no-module"]),
              help="ok: module of the installed version loaded now; missing: package "
                   "removed; no-module: module will not load (now and at boot)")
@click.option("--card-off", "card_off", type=int, metavar="N",
              help="card N (0-based, of the host's cards) falls off the bus: the driver no longer lists it")
@click.option("--card-on", "card_on", type=int, metavar="N", help="card N is back on the bus")
@click.option("--cards", "cards", metavar="PROFILE", help="swap the host's cards for GPU profile PROFILE's")
@click.option("--dkms-fails", "dkms_fails", metavar="VERSION",
              help="the module build of driver VERSION fails from now on (DKMS's error; dpkg and apt fail)")
@click.option("--dkms-ok", "dkms_ok", is_flag=True, help="module builds succeed again")
def driver(host, version, state, card_off, card_on, cards, dkms_fails, dkms_ok):
    """Simulate a driver package upgrade, a broken driver or module build, or a card lost or back, on HOST."""
    from . import driver as drivermod
    if not (version or state or cards or card_off is not None or card_on is not None or dkms_fails or dkms_ok):
        raise click.UsageError("give --version, --state, --cards, --card-off, --card-on, --dkms-fails or --dkms-ok")
    if dkms_fails and dkms_ok:
        raise click.UsageError("--dkms-fails and --dkms-ok contradict each other")
    try:
        rack = rackmod.require_running()
        if cards:
            click.echo(drivermod.reseat(rack, host, cards))
        if dkms_fails or dkms_ok:  # before --version: a build of that version fails at once
            click.echo(drivermod.set_dkms_fault(rack, host, dkms_fails))
        if version or state:
            click.echo(drivermod.set_driver(rack, host, version=version, state=state))
        for card, on in ((card_off, False), (card_on, True)):
            if card is not None:
                click.echo(drivermod.set_card(rack, host, card, on))
    except LabError as e:
        _fail(e)


@lab.command()
@click.argument("host")
@click.argument("mib", type=click.IntRange(0))
def memory(host, mib):
    """Cap HOST's memory at MIB MiB (0: the machine's again): its MemTotal, and the OOM killer's limit."""
    try:
        click.echo(rackmod.set_memory(rackmod.require_running(), host, mib))
    except LabError as e:
        _fail(e)


@lab.command(context_settings={"ignore_unknown_options": True})
@click.argument("host")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def ssh(host, cmd):
    """SSH to HOST as root (or run CMD there)."""
    try:
        rack = rackmod.require_running()
        args = rack.ssh_command(host, " ".join(cmd) if cmd else None, tty=not cmd)
    except LabError as e:
        _fail(e)
    os.execvp(args[0], args)


def main() -> None:  # python -m llamarack_lab.cli
    lab()


if __name__ == "__main__":
    main()
