"""Where everything llamarack owns lives on a host: the one place host paths are spelled.

    <root>/src/llama.cpp/             the llama.cpp source at the pinned commit
    <root>/builds/<stamp>/            one build per input set (counts once build-info.json exists)
    <root>/builds/current -> <stamp>  the build in service
    <root>/envs/<name>/               python envs (awq, convert) and a conda CUDA toolkit
    <root>/conda/                     Miniforge (python_env_backend or toolchain_cuda_source conda)
    <root>/models/<stamp16>/          one sealed model artifact
    <root>/models/.staging/<stamp16>/ a model being made (root's, mode 710; its work/ is the
                                      model pipeline user's: roles/model/sandbox.py)
    <root>/models/current -> <stamp16>
    <root>/cache/blobs/<algo>/<hex>   downloaded model files by content hash (sha256, git-sha1;
                                      mode 700, the model pipeline user's), hardlinked into each
                                      fetch (roles/model/files/model_fetch.py)
    <root>/state/<name>.json          records later runs read back (gpus.json; units.json: the
                                      host's llama-server units; rollback.json, and
                                      previous.service: the unit before the last switch;
                                      rollback@N.json and previous@N.service: unit N's)

Outside the root: the units and the API key (``UNIT_PATH``, ``unit_path``, ``API_KEY_PATH``).
A host of one unit runs ``llamarack-server.service``; a host of several runs
``llamarack-server@N.service`` (N = 0, 1, ...: concrete unit files, not a template).
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


@dataclass(frozen=True)
class Layout:
    """The paths under one host's ``llamarack_root``."""

    root: str

    # llama.cpp
    @property
    def src(self) -> str:
        return f"{self.root}/src/llama.cpp"

    @property
    def builds(self) -> str:
        return f"{self.root}/builds"

    def build(self, stamp: str) -> str:
        return f"{self.builds}/{stamp}"

    @property
    def current_build(self) -> str:
        return f"{self.builds}/current"

    # python envs and toolkits
    @property
    def converter_requirements(self) -> str:
        return f"{self.src}/requirements/requirements-convert_hf_to_gguf.txt"

    @property
    def envs(self) -> str:
        return f"{self.root}/envs"

    def env(self, name: str) -> str:
        return f"{self.envs}/{name}"

    @property
    def conda(self) -> str:
        return f"{self.root}/conda"

    # models
    @property
    def models(self) -> str:
        return f"{self.root}/models"

    def model(self, name: str) -> str:
        return f"{self.models}/{name}"

    @property
    def staging(self) -> str:
        return f"{self.models}/.staging"

    @property
    def current_model(self) -> str:
        return f"{self.models}/current"

    # the content-addressed cache of downloaded model files
    @property
    def cache(self) -> str:
        return f"{self.root}/cache"

    @property
    def blob_cache(self) -> str:
        """``<algo>/<hex>`` under it: the names of the artifact records' content ids."""
        return f"{self.cache}/blobs"

    @property
    def draft_model(self) -> str:
        """The link to the draft model's artifact (speculative decoding)."""
        return f"{self.models}/draft"

    # records
    @property
    def state(self) -> str:
        return f"{self.root}/state"

    def state_file(self, name: str) -> str:
        return f"{self.state}/{name}"

    @property
    def bench_record(self) -> str:
        """llama-bench's figures for the build and model served (the server role's bench)."""
        return self.state_file("bench.json")

    def bench_part(self, n: int) -> str:
        """The ``n``-th llama-bench measurement of a run, joined into ``bench_record`` (its log: ``bench.<n>.log``)."""
        return self.state_file(f"bench.{int(n)}.json")

    @property
    def gpus_record(self) -> str:
        return self.state_file("gpus.json")

    @property
    def previous_unit(self) -> str:
        """The unit that served before the last switch (what ``llamarack rollback`` puts back)."""
        return self.state_file("previous.service")

    def previous_unit_of(self, name: str) -> str:
        """``previous_unit`` of the unit ``name`` (``previous@N.service`` for unit N of several)."""
        return self.state_file(f"previous{_unit_suffix(name)}.service")

    def rollback_pin_of(self, name: str) -> str:
        """Written by ``llamarack rollback``: the unit it put back over ``name``, and the one it
        replaced (``rollback.json``; ``rollback@N.json`` for unit N of several)."""
        return self.state_file(f"rollback{_unit_suffix(name)}.json")

    @property
    def units_record(self) -> str:
        """The host's llama-server units: name, port, listen address, slots, cards (the gateway reads it)."""
        return self.state_file("units.json")

    @property
    def deployed_by(self) -> str:
        """The version of llamarack that last deployed the host (``{"llamarack": "0.1.0"}``)."""
        return self.state_file("deployed-by.json")


def unit_build(root: str, unit_lines) -> Optional[str]:
    """The build stamp a unit's ExecStart runs (``<root>/builds/<stamp>/bin/llama-server``)."""
    prefix = Layout(root).builds + "/"
    commands = (line.split("=", 1)[1].strip().strip('"') for line in unit_lines or () if line.startswith("ExecStart="))
    return next((c[len(prefix):].split("/", 1)[0] for c in commands if c.startswith(prefix)), None)
