"""Code that runs on the hosts, not on the control machine.

Every module here uses the standard library only and imports nothing from
llamarack: it is shipped to a host as a single file (``ship(name)`` gives
its path for an upload) and run there with the host's ``python3``. The
control machine may import these modules to share their definitions (the
llama-server flag record, for one), never the other way round.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent


def ship(name: str) -> Path:
    """The file of host module ``name`` (e.g. ``"llamacpp_proof"``), for an upload."""
    path = HERE / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no host module {name!r} under {HERE}")
    return path
