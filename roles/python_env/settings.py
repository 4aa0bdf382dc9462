"""The python_env role's settings section (host-data keys ``python_env_*``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion
from packaging.version import Version as PkgVersion

from llamarack.settings_fields import (Section, conda_channel_name, control_file, dotted_version, remote_url,
                                       setting, sha256_hex)  # fmt: skip


def _pep440_version(value: str) -> Optional[str]:
    try:
        PkgVersion(value)
    except InvalidVersion:
        return "a PEP 440 version such as 2.1.2"
    return None


def _requirement(value: str) -> Optional[str]:
    allowed = "a pip requirement by name and version, such as 'numpy<2' (no URL, no path)"
    try:
        requirement = Requirement(value)
    except InvalidRequirement:
        return allowed
    if requirement.url or set(value) & set("`$|&\\"):  # packages come from the index settings
        return allowed
    return None


@dataclass(frozen=True)
class PythonEnvSettings(Section):
    """The Python environment for AWQ quantization, with the reference pins."""

    prefix = "python_env"

    backend: Literal["conda", "venv"] = setting("conda", "conda (Miniforge under the root) or venv (system python3)")
    python_version: str = setting("3.10", "Python version of the env", dotted_version)
    conda_installer_url: str = setting(
        "https://github.com/conda-forge/miniforge/releases/download/24.11.3-0/Miniforge3-24.11.3-0-Linux-x86_64.sh",
        "Miniforge installer (point at a mirror for air-gapped racks)", remote_url)
    conda_installer_sha256: Optional[str] = setting(None, "sha256 of the installer; required with the conda backend",
                                                    sha256_hex)
    conda_channels: tuple[str, ...] = setting(("conda-forge",), "conda channels, in order", conda_channel_name)
    index_url: str = setting("https://pypi.org/simple", "pip index for everything but torch", remote_url)
    torch_index_url: str = setting("https://download.pytorch.org/whl/cu118", "pip index torch is installed from",
                                   remote_url)
    torch_version: str = setting("2.1.2", "torch pin", _pep440_version)
    transformers_version: str = setting("4.44.2", "transformers pin", _pep440_version)
    accelerate_version: str = setting("0.33.0", "accelerate pin", _pep440_version)
    autoawq_version: str = setting("0.2.7", "autoawq pin", _pep440_version)
    numpy_requirement: str = setting("numpy<2", "numpy constraint (torch < 2.3 fails with numpy 2)", _requirement)
    autoawq_requirements: tuple[str, ...] = setting(
        ("datasets==3.0.1", "pyarrow==17.0.0", "zstandard==0.23.0"),
        "what autoawq really imports, installed beside it (autoawq itself goes in with --no-deps; "
        "pyarrow 18+ needs numpy 2)", _requirement)
    awq_lock_file: Optional[str] = setting(
        None, "file on the control machine: a pip requirements file with a --hash for every package of the "
        "AWQ env (pip-compile --generate-hashes); set, the env is installed from it alone with "
        "--require-hashes --no-deps, and it must meet the pins above", control_file)
    converter_torch_index_url: str = setting(
        "https://download.pytorch.org/whl/cpu",
        "pip index torch comes from in the llama.cpp converter's env (conversion runs on the CPU)", remote_url)
    converter_overrides: tuple[str, ...] = setting(
        (), "requirements that replace the converter file's line of the same package, e.g. torch==2.13.0", _requirement)

    def problems(self) -> list[str]:
        if self.backend == "conda" and not self.conda_installer_sha256:
            return ["python_env_conda_installer_sha256: given None; allowed: the installer's sha256 "
                    "(required with python_env_backend='conda': downloads are pinned)"]
        return []
