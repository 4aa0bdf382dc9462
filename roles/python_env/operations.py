"""The python env role's operations: venvs and pinned installs that resolve first and verify after."""

from __future__ import annotations

import shlex
from io import StringIO
from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import files

from llamarack import remote
from llamarack.roles.python_env.reads import PythonEnvPackages, RequirementsFile
from llamarack.facts import read
from llamarack.operations import executing

from .plan import EnvPlan, converter_plan, unmet

# pip without any of the host's pip configuration: the settings name every index.
PIP = "PIP_CONFIG_FILE=/dev/null {python} -m pip --isolated"


@operation()
def venv(env: str, python: str, python_version: str):
    """
    Create a venv with ``python``; recreate it if it holds another Python version.

    + env: env directory
    + python: interpreter to create it with (``/usr/bin/python3.11``)
    + python_version: the ``major.minor`` it must have
    """
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
    """
    Bring an env to its plan: resolve first, install step by step, verify.

    + plan: the env's pins, indexes, order and checks (``llamarack.pyenv``)

    A converged env (every pin and constraint met, read with the env's own
    interpreter) costs no pip call. Otherwise: the whole set is resolved
    (dry run) before anything is installed, each conflict named; then each
    step is installed with the constraints file; then imports and versions
    are verified.
    """
    yield from _pins(plan)


@operation()
def converter_pins(settings, requirements_path: str, env: str):
    """
    ``pip_pins`` for llama.cpp's converter env, planned from its requirements file.

    + settings: the host's settings (indexes, overrides)
    + requirements_path: ``requirements-convert_hf_to_gguf.txt`` in the llama.cpp tree
    + env: the converter env's prefix

    The file is read when the operation runs: the llama.cpp checkout may be
    made earlier in the same run.
    """
    lines = read(RequirementsFile, path=requirements_path)
    if lines is None:
        if executing():
            raise OperationError(f"no {requirements_path}: check out the llama.cpp source first")
        yield StringCommand(remote.argv("true", "converter env planned once", requirements_path, "exists"))
        return
    current = read(PythonEnvPackages, env=env)
    version = current.python_version if current else settings.python_env.python_version
    yield from _pins(converter_plan(settings, env, lines, version))


def _pins(plan: EnvPlan):
    env = read(PythonEnvPackages, env=plan.env)
    if env is not None:
        problems = unmet(plan, env.packages, env.python_version)
        if not problems:
            host.noop(f"{plan.env} already has {', '.join(plan.require)}")
            return
    python = shlex.quote(plan.python)
    pip = PIP.format(python=python)
    constraints = f"{plan.env}/llamarack-constraints.txt"
    yield from files.put._inner(
        src=StringIO("".join(c + "\n" for c in plan.constraints)), dest=constraints, mode="644"
    )
    yield StringCommand(remote.command("pyenv_check", "resolve", plan.to_json(), python=plan.python))
    for step in plan.steps:
        args = [pip, "install --no-input --index-url", shlex.quote(step.index_url)]
        # pip ignores a plain-HTTP index unless trusted; one in the settings is the
        # operator's own choice (a LAN mirror, the lab's index).
        if step.index_url.startswith("http://"):
            args.append(f"--trusted-host {shlex.quote(urlsplit(step.index_url).hostname)}")
        args.append("--no-deps" if step.no_deps else f"-c {shlex.quote(constraints)}")
        args += [shlex.quote(r) for r in step.requirements]
        yield StringCommand(" ".join(args))
    yield StringCommand(remote.command("pyenv_check", "verify", plan.to_json(), python=plan.python))


