"""Operations of the host stack (driver, toolchain, Python envs), in pyinfra's style.

Each is a generator: it reads facts, compares with what is wanted and yields
only the commands that close the difference, or says why nothing is needed
(``host.noop``). pyinfra runs the generator again when the operation
executes, so facts read here see what earlier operations of the run did.
"""

from __future__ import annotations

import shlex
from io import StringIO
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import OperationError
from pyinfra.context import ctx_state
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from pyinfra.operations import apt, files

from .facts import (
    CudaToolkits,
    GccVersions,
    InstallableGccMajors,
    NvidiaDriverPackages,
    PythonEnvPackages,
    RequirementsFile,
    ToolchainChoice,
    ToolchainRecord,
    toolchain_record,
)
from .pyenv import EnvPlan, converter_plan, unmet
from .rules import choose_host_compiler, find_toolkit

PYENV_CHECK = Path(__file__).with_name("pyenv_check.py")
# pip without any of the host's pip configuration: the settings name every index.
PIP = "PIP_CONFIG_FILE=/dev/null {python} -m pip --isolated"


def _executing() -> bool:
    """True while operations run; False while pyinfra plans (facts may predate earlier ops)."""
    state = ctx_state.get()
    return bool(state and state.is_executing)


@operation()
def apt_install_missing(packages: list, cache_time: int = 86400):
    """
    Install the apt packages that are missing; refresh the lists only then.

    + packages: package names
    + cache_time: apt-get update runs only if the lists are older than this (seconds)

    ``apt.packages(update=True)`` would refresh the lists on every run once
    they are older than ``cache_time``; here a converged host makes no apt call.
    """
    installed = host.get_fact(DebPackages)
    missing = [p for p in packages if p not in installed]
    if not missing:
        host.noop(f"apt packages already installed: {', '.join(packages)}")
        return
    yield from apt.update._inner(cache_time=cache_time)
    yield from apt.packages._inner(packages=missing, no_recommends=True)


@operation()
def driver_package_holds(hold: bool = True):
    """
    apt-mark hold (or unhold) every installed NVIDIA driver package.

    + hold: True holds, False unholds

    A held driver cannot move under an unattended upgrade, which would leave
    the old kernel module loaded ("Driver/library version mismatch") or, past
    the 580 branch, drop Volta and Pascal cards.
    """
    packages = host.get_fact(NvidiaDriverPackages)
    if not packages:
        host.noop("no NVIDIA driver package installed")
        return
    todo = [p.name for p in packages if p.held != hold]
    state = "held" if hold else "not held"
    if not todo:
        host.noop(f"NVIDIA driver packages already {state}: {', '.join(p.name for p in packages)}")
        return
    yield StringCommand("apt-mark", "hold" if hold else "unhold", *todo)


@operation(is_idempotent=False)
def driver_answers(reason: str):
    """
    Fail unless nvidia-smi answers (after a reboot that should have loaded the new module).

    + reason: what should have fixed the driver, for the message
    """
    yield StringCommand(
        "out=$(nvidia-smi --query-gpu=index,driver_version --format=csv,noheader 2>&1) || "
        f"{{ printf '%s\\n' {shlex.quote(f'{host.name}: driver still fails after {reason}:')} "
        '"$out" >&2; exit 1; }'
    )


@operation()
def toolchain_choice(
    record_path: str,
    backend: str,
    cuda_version: Optional[str] = None,
    cuda_source: Optional[str] = None,
    cuda_home: Optional[str] = None,
    install_gcc: bool = True,
    extra_homes: tuple = (),
):
    """
    Choose nvcc's host compiler, install gcc-N/g++-N if need be, record the choice.

    + record_path: the JSON file the llama.cpp build reads (``ToolchainRecord``)
    + backend: ``cuda`` or ``cpu``; on cpu only the backend is recorded
    + cuda_version: the wanted toolkit's ``major.minor``
    + cuda_source: where it came from (recorded)
    + cuda_home: only a toolkit in this directory counts
    + install_gcc: may install a versioned gcc the toolkit accepts
    + extra_homes: more directories to look for a toolkit in (a conda env)

    The default gcc is never changed: a toolkit that refuses it gets a
    versioned ``gcc-N`` at or below its ceiling (read from its own
    ``crt/host_config.h``). With a toolkit installed earlier in the same run
    (debian, conda), the choice is made when the operation executes.
    """
    choice = ToolchainChoice(backend=backend)
    if backend == "cuda":
        toolkits = host.get_fact(CudaToolkits, extra_homes=tuple(extra_homes))
        toolkit = find_toolkit(toolkits, cuda_version, cuda_home)
        if toolkit is None:
            if _executing():
                found = ", ".join(f"{t.version} in {t.home}" for t in toolkits) or "none"
                raise OperationError(f"no CUDA {cuda_version} toolkit on the host (found: {found})")
            # Planning: the toolkit is installed by an earlier operation of this run.
            yield StringCommand("true", "# host compiler chosen once CUDA", cuda_version, "is installed")
            return
        installable = host.get_fact(InstallableGccMajors) if install_gcc else ()
        try:
            major, install = choose_host_compiler(toolkit.max_gcc, host.get_fact(GccVersions), installable)
        except LookupError:
            if _executing():
                raise OperationError(
                    f"CUDA {toolkit.version} needs gcc {toolkit.max_gcc} or older and none is "
                    f"installed or installable; install gcc-{toolkit.max_gcc} and g++-{toolkit.max_gcc}"
                )
            yield StringCommand("true", "# host compiler chosen once apt's lists are fresh")
            return
        if install:
            yield from apt.packages._inner(packages=[f"gcc-{major}", f"g++-{major}"], no_recommends=True)
        suffix = f"-{major}" if major else ""
        choice = ToolchainChoice(
            backend=backend,
            cuda_source=cuda_source,
            cuda_home=toolkit.home,
            nvcc=toolkit.nvcc,
            cuda_version=toolkit.version,
            cuda_full_version=toolkit.full_version,
            max_gcc=toolkit.max_gcc,
            host_compiler=f"/usr/bin/g++{suffix}",
            host_c_compiler=f"/usr/bin/gcc{suffix}",
        )
    if host.get_fact(ToolchainRecord, path=record_path) == choice:
        host.noop(f"toolchain already recorded: {choice.host_compiler or backend}")
        return
    yield from files.put._inner(src=StringIO(toolchain_record(choice)), dest=record_path, mode="644")


@operation()
def miniforge(installer_url: str, installer_sha256: str, prefix: str):
    """
    Install Miniforge under ``prefix`` once, from a sha256-pinned installer.

    + installer_url: the Miniforge installer (or a mirror of it)
    + installer_sha256: its sha256; a mismatch stops before the installer runs
    + prefix: install directory (``<root>/conda``)
    """
    if host.get_fact(File, path=f"{prefix}/bin/conda"):
        host.noop(f"conda already installed in {prefix}")
        return
    part = f"{prefix}.installer.part"
    yield StringCommand("curl", "-fsSL", "--retry", "3", "-o", part, installer_url)
    # Checked before it runs: a wrong or truncated download never executes.
    yield StringCommand(
        f"echo {shlex.quote(f'{installer_sha256}  {part}')} | sha256sum -c --quiet - "
        f"|| {{ rm -f {shlex.quote(part)}; echo 'Miniforge installer: sha256 mismatch' >&2; exit 1; }}"
    )
    yield StringCommand("bash", part, "-b", "-p", prefix)
    yield StringCommand("rm", "-f", part)


@operation()
def conda_env(conda: str, env: str, specs: list, channels: list, marker: str):
    """
    Create a conda env with ``specs`` from ``channels`` only, if ``marker`` is missing.

    + conda: the conda binary
    + env: env prefix
    + specs: package specs (``python=3.10``, ``cuda-nvcc``)
    + channels: channels, in order; nothing else is searched (--override-channels)
    + marker: a file the env has once complete (``<env>/bin/python``, ``<env>/bin/nvcc``)
    """
    if host.get_fact(File, path=marker):
        host.noop(f"conda env {env} already has {Path(marker).name}")
        return
    channel_args = [arg for ch in channels for arg in ("-c", ch)]
    yield StringCommand(conda, "create", "--yes", "--quiet", "--prefix", env,
                        "--override-channels", *channel_args, *specs)  # fmt: skip


@operation()
def venv(env: str, python: str, python_version: str):
    """
    Create a venv with ``python``; recreate it if it holds another Python version.

    + env: env directory
    + python: interpreter to create it with (``/usr/bin/python3.11``)
    + python_version: the ``major.minor`` it must have
    """
    current = host.get_fact(PythonEnvPackages, env=env)
    if current and current.python_version.startswith(python_version + "."):
        host.noop(f"venv {env} already has Python {current.python_version}")
        return
    if current:
        yield StringCommand("rm", "-rf", env)
    yield StringCommand(python, "-m", "venv", env)


@operation()
def pip_pins(plan: EnvPlan, check_script: str):
    """
    Bring an env to its plan: resolve first, install step by step, verify.

    + plan: the env's pins, indexes, order and checks (``llamarack.pyenv``)
    + check_script: where ``pyenv_check.py`` is put on the host

    A converged env (every pin and constraint met, read with the env's own
    interpreter) costs no pip call. Otherwise: the whole set is resolved
    (dry run) before anything is installed, each conflict named; then each
    step is installed with the constraints file; then imports and versions
    are verified.
    """
    yield from _pins(plan, check_script)


@operation()
def converter_pins(settings, requirements_path: str, env: str, check_script: str):
    """
    ``pip_pins`` for llama.cpp's converter env, planned from its requirements file.

    + settings: the host's settings (indexes, overrides)
    + requirements_path: ``requirements-convert_hf_to_gguf.txt`` in the llama.cpp tree
    + env: the converter env's prefix
    + check_script: where ``pyenv_check.py`` is put on the host

    The file is read when the operation runs: the llama.cpp checkout may be
    made earlier in the same run.
    """
    lines = host.get_fact(RequirementsFile, path=requirements_path)
    if lines is None:
        if _executing():
            raise OperationError(f"no {requirements_path}: check out the llama.cpp source first")
        yield StringCommand("true", "# converter env planned once", requirements_path, "exists")
        return
    current = host.get_fact(PythonEnvPackages, env=env)
    version = current.python_version if current else settings.python_env.python_version
    yield from _pins(converter_plan(settings, env, lines, version), check_script)


def _pins(plan: EnvPlan, check_script: str):
    env = host.get_fact(PythonEnvPackages, env=plan.env)
    if env is not None:
        problems = unmet(plan, env.packages, env.python_version)
        if not problems:
            host.noop(f"{plan.env} already has {', '.join(plan.require)}")
            return
    python = shlex.quote(plan.python)
    pip = PIP.format(python=python)
    data = shlex.quote(plan.to_json())
    constraints = f"{plan.env}/llamarack-constraints.txt"
    yield from files.put._inner(src=str(PYENV_CHECK), dest=check_script, mode="644")
    yield from files.put._inner(
        src=StringIO("".join(c + "\n" for c in plan.constraints)), dest=constraints, mode="644"
    )
    yield StringCommand(f"{python} {shlex.quote(check_script)} resolve {data}")
    for step in plan.steps:
        args = [pip, "install --no-input --index-url", shlex.quote(step.index_url)]
        # pip ignores a plain-HTTP index unless trusted; one in the settings is the
        # operator's own choice (a LAN mirror, the lab's index).
        if step.index_url.startswith("http://"):
            args.append(f"--trusted-host {shlex.quote(urlsplit(step.index_url).hostname)}")
        args.append("--no-deps" if step.no_deps else f"-c {shlex.quote(constraints)}")
        args += [shlex.quote(r) for r in step.requirements]
        yield StringCommand(" ".join(args))
    yield StringCommand(f"{python} {shlex.quote(check_script)} verify {data}")
