"""The ``llamarack`` command: helpers around the pyinfra deploy."""

from __future__ import annotations

import click

from . import __version__
from .plan_cli import plan_command
from .settings_docs import group_data_file, markdown_table


@click.group()
@click.version_option(__version__)
def main():
    """Serve quantized LLMs with llama.cpp on racks of old NVIDIA GPUs.

    The deploy itself is plain pyinfra: `pyinfra inventory/lab.py deploy.py`.
    """


@main.command()
@click.option("--group-data", "form", flag_value="group-data", help="as inventory/group_data/all.py")
@click.option("--markdown", "form", flag_value="markdown", default=True, help="as the README's table")
def settings(form):
    """Print every setting with its default."""
    click.echo(group_data_file() if form == "group-data" else markdown_table(), nl=False)


main.add_command(plan_command)


def _add_lab():
    # The lab needs root-only tools; import it lazily so `llamarack settings` works anywhere.
    from .lab.cli import lab

    main.add_command(lab)


try:
    _add_lab()
except ImportError:  # pragma: no cover - only while the lab package is absent
    pass
