"""The python env role's operations: venvs and pinned installs that resolve first and verify after."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import OperationError

from llamarack import remote
from roles.python_env.reads import PythonEnvPackages, RequirementsFile
from llamarack.facts import read
from llamarack.operations import executing, secret_upload

from .plan import EnvPlan, converter_plan, unmet


@operation()
def venv(env: str, python: str, python_version: str):
    """Create a venv with ``python``; recreate it if it holds another Python version.

    + env: env directory
    + python: interpreter to create it with (``/usr/bin/python3.11``)
    + python_version: the ``major.minor`` it must have"""
    current = read(PythonEnvPackages, env=env)
    if current and current.python_version.startswith(python_version + "."):
        host.noop(f"venv {env} already has Python {current.python_version}")
        return
    if current:
        yield StringCommand(remote.argv("rm", "-rf", "--", env))
    else:
        yield StringCommand(remote.argv("install", "-d", "-m", "755", "--", env.rsplit("/", 1)[0]))
    yield StringCommand(remote.argv(python, "-m", "venv", env))


@operation()
def pip_pins(plan: EnvPlan):
    """Bring an env to its plan: resolve first, install step by step, verify
    (``files/pyenv_check.py``); a converged env (every pin and constraint met) costs no pip call.

    + plan: the env's pins, indexes, order and checks (``plan.EnvPlan``)"""
    env = read(PythonEnvPackages, env=plan.env)
    if env is not None and not unmet(plan, env.packages, env.python_version):
        host.noop(f"{plan.env} already has {', '.join(plan.require)}")
        return
    # The index URLs (a password or a token in one stays out of ps and -vvv) go in
    # a file only root reads; pyenv_check hands them to pip in its environment.
    indexes = f"{plan.env}/llamarack-indexes.json"
    yield from secret_upload(plan.indexes_json(), indexes, mode="600")
    shown = plan.to_json()
    yield StringCommand(remote.command("pyenv_check", "resolve", shown, indexes, python=plan.python))
    for number in range(len(plan.steps)):
        yield StringCommand(remote.command("pyenv_check", "install", shown, indexes, str(number), python=plan.python))
    yield StringCommand(remote.argv("rm", "-f", "--", indexes))
    yield StringCommand(remote.command("pyenv_check", "verify", shown, python=plan.python))


@operation()
def converter_pins(settings, requirements_path: str, env: str):
    """``pip_pins`` for llama.cpp's converter env, planned from its requirements file.

    + settings: the host's settings (indexes, overrides)
    + requirements_path: ``requirements-convert_hf_to_gguf.txt`` in the llama.cpp tree
    + env: the converter env's prefix"""
    lines = read(RequirementsFile, path=requirements_path)
    if lines is None:
        if executing():
            raise OperationError(f"no {requirements_path}: check out the llama.cpp source first")
        yield StringCommand(remote.argv("true", "converter env planned once", requirements_path, "exists"))
        return
    current = read(PythonEnvPackages, env=env)
    version = current.python_version if current else settings.python_env.python_version
    yield from pip_pins._inner(plan=converter_plan(settings, env, lines, version))
