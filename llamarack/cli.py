"""The ``llamarack`` command's shell: the group its subcommands join. The subcommands that
need the roles are the roles' own (``roles/cli.py``, the console script ``llamarack``)."""

from __future__ import annotations

import pkgutil

import click

from . import __version__


class LazyGroup(click.Group):
    """Subcommands imported only when run (``lazy``): ``llamarack settings`` imports no
    planner or pyinfra connector, and every command works without the lab, its own package."""

    LAZY = {"lab": "llamarack_lab.cli:lab"}
    LAB_MISSING = "the lab is its own package, not installed: python3 -m pip install -e lab (in llamarack's checkout)"

    def lazy(self, name: str, where: str) -> None:
        """Add subcommand ``name``, imported from ``where`` (``module:attribute``) when run."""
        self.LAZY = {**self.LAZY, name: where}

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            try:
                self.add_command(pkgutil.resolve_name(self.LAZY[name]), name)
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

    The deploy itself is plain pyinfra: `pyinfra inventory/lab.py deploy.py`.
    """
