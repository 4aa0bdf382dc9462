"""Where everything llamarack owns lives on a host: the one place host paths are spelled.

Everything under ``llamarack_root`` (docs/ARCHITECTURE.md, "State on a host", draws the
tree); outside it, the units and the API key (``UNIT_PATH``, ``unit_path``,
``API_KEY_PATH``). A host of one unit runs ``llamarack-server.service``; a host of several
runs ``llamarack-server@N.service`` (N = 0, 1, ...: concrete unit files, not a template).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

UNIT_DIR = "/etc/systemd/system"
UNIT_NAME = "llamarack-server.service"
UNIT_PATH = f"{UNIT_DIR}/{UNIT_NAME}"
# A host's llama-server unit files, for a shell's glob (every name the role makes matches).
UNIT_GLOBS = (UNIT_NAME, "llamarack-server@[0-9]*.service")
CONFIG_DIR = "/etc/llamarack"
API_KEY_PATH = f"{CONFIG_DIR}/server-api-key"


def unit_name(index: Optional[int] = None) -> str:
    """The unit of a host's one llama-server (``index`` None), or of its ``index``-th of several."""
    return UNIT_NAME if index is None else f"llamarack-server@{int(index)}.service"


def unit_path(name: str) -> str:
    return f"{UNIT_DIR}/{name}"


def unit_index(name: str) -> Optional[int]:
    """N of ``llamarack-server@N.service``; None for the one unit (or another name)."""
    head, _, tail = name.partition("@")
    number = tail[: -len(".service")] if tail.endswith(".service") else ""
    return int(number) if head == "llamarack-server" and number.isdigit() else None


def _unit_suffix(name: str) -> str:
    index = unit_index(name)
    return "" if index is None else f"@{index}"


# Each fixed path under the root, by its name on ``Layout``.
PATHS = {
    # llama.cpp
    "src": "src/llama.cpp", "builds": "builds", "current_build": "builds/current",
    # python envs and toolkits
    "converter_requirements": "src/llama.cpp/requirements/requirements-convert_hf_to_gguf.txt",
    "envs": "envs", "conda": "conda",
    # models; the draft model's artifact (speculative decoding) is linked as models/draft
    "models": "models", "staging": "models/.staging", "current_model": "models/current", "draft_model": "models/draft",
    # the content-addressed cache of downloaded model files: ``<algo>/<hex>`` under blobs, the
    # names of the artifact records' content ids
    "cache": "cache", "blob_cache": "cache/blobs",
    # records later runs read back (docs/ARCHITECTURE.md, "State on a host", says what each holds)
    "state": "state", "bench_record": "state/bench.json", "gpus_record": "state/gpus.json",
    "previous_unit": "state/previous.service", "units_record": "state/units.json",
    "deployed_by": "state/deployed-by.json",
    # the served units' check after each start (their ExecStartPost=): the server role's wait_healthy
    "unit_check": "libexec/unit_check.py",
}  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """The paths under one host's ``llamarack_root``: ``PATHS`` by name (``layout.builds``),
    and those of a name or a number."""

    root: str

    def __getattr__(self, name: str) -> str:
        if name in PATHS:
            return f"{self.root}/{PATHS[name]}"
        raise AttributeError(name)

    def build(self, stamp: str) -> str:
        return f"{self.builds}/{stamp}"

    def env(self, name: str) -> str:
        return f"{self.envs}/{name}"

    def model(self, name: str) -> str:
        return f"{self.models}/{name}"

    def state_file(self, name: str) -> str:
        return f"{self.state}/{name}"

    def bench_part(self, n: int) -> str:
        """The ``n``-th llama-bench measurement of a run, joined into ``bench_record`` (its log: ``bench.<n>.log``)."""
        return self.state_file(f"bench.{int(n)}.json")

    def previous_unit_of(self, name: str) -> str:
        """``previous_unit`` of the unit ``name`` (``previous@N.service`` for unit N of several)."""
        return self.state_file(f"previous{_unit_suffix(name)}.service")

    def rollback_pin_of(self, name: str) -> str:
        """Written by ``llamarack rollback``: the unit it put back over ``name``, and the one it
        replaced (``rollback.json``; ``rollback@N.json`` for unit N of several)."""
        return self.state_file(f"rollback{_unit_suffix(name)}.json")


def unit_build(root: str, unit_lines) -> Optional[str]:
    """The build stamp a unit's ExecStart runs (``<root>/builds/<stamp>/bin/llama-server``)."""
    prefix = Layout(root).builds + "/"
    commands = (line.split("=", 1)[1].strip().strip('"') for line in unit_lines or () if line.startswith("ExecStart="))
    return next((c[len(prefix):].split("/", 1)[0] for c in commands if c.startswith(prefix)), None)
