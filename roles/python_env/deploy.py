"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

from typing import Optional

from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError

from llamarack.operations import apt_install_missing, miniforge_env
from roles.preflight.facts import HostFacts
from roles.llamacpp.rules import build_archs
from roles.settings import Settings

from .operations import converter_pins, pip_pins, venv
from .plan import LockError, awq_lock, awq_plan


def _make_env(settings: Settings, name: str) -> str:
    """Create the env's interpreter with the configured backend; return the env prefix."""
    s, layout = settings.python_env, settings.layout
    env = layout.env(name)
    if s.backend == "venv":
        apt_install_missing(name=f"python{s.python_version} and its venv module",
                            packages=[f"python{s.python_version}-venv"], cache_time=settings.toolchain.apt_cache_time)
        venv(name=f"venv {env}", env=env, python=f"/usr/bin/python{s.python_version}",
             python_version=s.python_version)  # fmt: skip
    else:
        miniforge_env(s, layout.conda, env, [f"python={s.python_version}", "pip"], list(s.conda_channels),
                      marker=f"{env}/bin/python", name=f"conda env {env}")
    return env


@deploy("llamarack python env")
def python_env(settings: Settings, facts: Optional[HostFacts] = None):
    """The AWQ env (``<root>/envs/awq``): torch, transformers, accelerate, autoawq at their pins.

    + settings: the host's settings (``python_env_*``; on CUDA builds the toolkit
      version and the GPUs' archs are verified against torch)
    + facts: what preflight read (the GPUs); needed on CUDA builds only"""
    try:
        locked = awq_lock(settings)  # python_env_awq_lock_file, read on the control machine
    except LockError as e:
        raise DeployError(f"{host.name}: {e}") from None
    env = _make_env(settings, "awq")
    archs = build_archs(settings, facts) if settings.llamacpp.backend == "cuda" else ()
    pip_pins(name="AWQ env pins (resolve, install, verify)" + (" from the hash-checked lock" if locked else ""),
             plan=awq_plan(settings, env, archs, locked=locked))


@deploy("llamarack converter env")
def converter_env(settings: Settings, requirements_path: str = None):
    """The env for llama.cpp's ``convert_hf_to_gguf.py`` (``<root>/envs/convert``).

    + settings: the host's settings (``python_env_*``)
    + requirements_path: the converter's requirements file; default: in the
      llama.cpp checkout under ``<root>/src/llama.cpp``, which may be made
      earlier in the same run (the file is read when the operation runs)"""
    env = _make_env(settings, "convert")
    converter_pins(name="Converter env pins (resolve, install, verify)", settings=settings,
                   requirements_path=requirements_path or settings.layout.converter_requirements, env=env)
