"""``llamarack lab``: the lab is its own package (lab/), not in llamarack's wheel; where it
is not installed the command says how to install it."""

import sys

from click.testing import CliRunner

from llamarack.cli import LazyGroup


class NoLab:
    """A finder that answers for llamarack_lab as an interpreter without it does."""

    def find_spec(self, name, path=None, target=None):
        if name == "llamarack_lab":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def without_the_lab(monkeypatch):
    for name in [n for n in sys.modules if n == "llamarack_lab" or n.startswith("llamarack_lab.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NoLab(), *sys.meta_path])


def test_lab_not_installed_says_how_to_install_it(monkeypatch):
    without_the_lab(monkeypatch)
    result = CliRunner().invoke(LazyGroup(), ["lab", "up", "--gpus", "t4"])
    assert result.exit_code == 1, result.output
    assert "python3 -m pip install -e lab" in result.output
    assert "Traceback" not in result.output


def test_help_lists_lab_and_says_how_to_install_it(monkeypatch):
    without_the_lab(monkeypatch)
    listing = CliRunner().invoke(LazyGroup(), ["--help"])
    assert listing.exit_code == 0 and "  lab " in listing.output
    result = CliRunner().invoke(LazyGroup(), ["lab", "--help"])
    assert result.exit_code == 0 and "python3 -m pip install -e lab" in " ".join(result.output.split())


def test_lab_installed_is_the_lab_command():
    import llamarack_lab.cli

    assert LazyGroup().get_command(None, "lab") is llamarack_lab.cli.lab
