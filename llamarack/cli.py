"""The ``llamarack`` command's shell: the group its subcommands join. The subcommands are
the roles' (``roles/cli.py``), declared in pyproject.toml as entry points
``llamarack.commands``: the core names none of them."""

from __future__ import annotations

import pkgutil
from importlib.metadata import entry_points

import click

from . import __version__


class LazyGroup(click.Group):
    """Subcommands imported only when run: those declared as entry points ``llamarack.commands``
    (the roles'), and the lab's. ``llamarack settings`` imports no planner or pyinfra connector,
    and every command works without the lab, its own package."""

    LAZY = {"lab": "llamarack_lab.cli:lab"}
    DECLARED = "llamarack.commands"
    LAB_MISSING = "the lab is its own package, not installed: python3 -m pip install -e lab (in llamarack's checkout)"

    def lazy(self) -> dict:
        """{subcommand: ``module:attribute``} of every subcommand not imported yet."""
        return {**{ep.name: ep.value for ep in entry_points(group=self.DECLARED)}, **self.LAZY}

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy()})

    def get_command(self, ctx, name):
        lazy = self.lazy()
        if name in lazy and name not in self.commands:
            try:
                self.add_command(pkgutil.resolve_name(lazy[name]), name)
            except ModuleNotFoundError as e:  # the lab (lab/ in the checkout) is not in the wheel
                if e.name != "llamarack_lab":
                    raise
                return click.Command(name, help=self.LAB_MISSING, context_settings={"ignore_unknown_options": True},
                                     params=[click.Argument(["args"], nargs=-1)], callback=self._lab_missing)
        return super().get_command(ctx, name)

    def _lab_missing(self, args):
        raise click.ClickException(self.LAB_MISSING)


@click.group(cls=LazyGroup)
@click.version_option(__version__)
def main():
    """Serve quantized LLMs with llama.cpp on racks of old NVIDIA GPUs.

    The deploy itself is plain pyinfra: `pyinfra INVENTORY roles.deploy.main`
    (in a checkout: `pyinfra inventory/lab.py deploy.py`)."""
