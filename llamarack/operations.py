"""Operations more than one role uses, in pyinfra's style (generators that yield only what differs)."""

from __future__ import annotations

import hashlib
import json
import shlex
import uuid
from io import StringIO
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.context import ctx_state
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, FileContents, Sha1File
from pyinfra.operations import apt
from pyinfra.operations.util.files import generate_color_diff

from . import remote
from .facts import read


@operation()
def report(message):
    """Print a line for this host when the run reaches this point; changes nothing.

    + message: what to tell the user (e.g. where the service answers), or a function that
      returns it when the run reaches this point (of what earlier operations made); each of
      its lines printed with the host's name

    Unlike ``python.call``, which always counts as a change, this keeps a
    converged run at "No changes"."""
    if host.state.is_executing:
        for line in (message() if callable(message) else message).splitlines():
            logger.info(f"{host.print_prefix}{line}")
    return
    yield  # an operation is a generator, even one that runs no command


def durable_rename(src: str, dest: str) -> str:
    """The shell command that puts ``src`` in place as ``dest`` only once its bytes
    are on disk: ``sync FILE`` is fsync(2) of that file, then rename(2). Without
    it, a crash soon after the rename can leave ``dest`` complete by name but
    empty or truncated (ext4, xfs: data and metadata are written separately)."""
    return f"{remote.argv('sync', '--', src)} && {remote.argv('mv', '-f', '--', src, dest)}"


def refusal(reason: str) -> StringCommand:
    """The command that stops a host: ``reason`` on stderr, exit 1."""
    return StringCommand(f"printf '%s\\n' {shlex.quote(reason)} >&2; exit 1")


@operation(is_idempotent=False)
def refuse(reason: str):
    """Stop this host: print why on stderr and fail, before anything is changed.

    + reason: the message, naming the host, what was found, what is needed and the fix

    pyinfra then drops the host from the run; the other hosts go on."""
    yield refusal(reason)


def put_record(path: str, text: str):
    """The commands that write a record (mode 644) beside itself, sync it and rename it
    over the old one: an interrupted run or a crash never leaves half a record."""
    yield f"install -d -m 755 {shlex.quote(str(Path(path).parent))}"
    yield from private_upload(text, f"{path}.new")
    yield f"chmod 644 {shlex.quote(path)}.new && {durable_rename(f'{path}.new', path)}"


@operation()
def record_deployment(path: str, version: str, recorded=None):
    """Record the version of llamarack that deployed the host, once every role of the run
    went through (``llamarack audit`` and ``llamarack plan-upgrade`` show it).

    + path: the record (``Layout.deployed_by``)
    + version: this llamarack's version
    + recorded: the version the record names (preflight read it): no write when equal"""
    if recorded == version:
        host.noop(f"deployed by llamarack {version}")
        return
    yield from put_record(path, json.dumps({"llamarack": version}, sort_keys=True) + "\n")


# Where an upload lies before root copies it into place: a directory of its own under /tmp.
UPLOAD_DIR_PREFIX = "/tmp/llamarack-upload-"


def private_upload(src, dest: str):
    """The commands that upload ``src`` to ``dest`` on the host, for an operation to yield:
    every file llamarack puts on a host goes through here.

    + src: the text, or a file-like object (``StringIO``)
    + dest: the file on the host (written as it is: callers upload ``X.new`` and rename)

    Under sudo the upload lands in ``file`` of a directory of a random name the SSH user makes
    with mode 700 (``mkdir`` fails on a taken name), not at pyinfra's foreseeable
    ``/tmp/pyinfra-<sha1 of dest>`` (docs/deploy.md, "Who may reach the API"); the file is made
    mode 600 before SFTP fills it (sftp-server would make it 644)."""
    private = f"{UPLOAD_DIR_PREFIX}{uuid.uuid4().hex}"
    temp = f"{private}/file"
    # As the SSH user (no sudo): the SSH user's upload lands there, root's cp reads it.
    yield StringCommand(f"umask 077 && mkdir -m 700 {shlex.quote(private)} && "
                        f"install -m 600 /dev/null {shlex.quote(temp)}", _sudo=False)  # fmt: skip
    yield FileUploadCommand(StringIO(src) if isinstance(src, str) else src, dest, remote_temp_filename=temp)
    yield StringCommand(f"rm -rf {shlex.quote(private)}", _sudo=False)


def secret_upload(secret: str, dest: str, mode: str = "600", group=None):
    """The commands that put a secret into ``dest`` on the host, for an operation to yield.

    + secret: the text (never printed, never on a command line)
    + dest: the file on the host; written as ``dest.new``, then renamed over ``dest``
    + mode: its mode, given to the empty ``dest.new`` before the upload fills it
    + group: its group, or None"""
    q_new = shlex.quote(f"{dest}.new")
    group_args = f" -g {shlex.quote(group)}" if group else ""
    yield (f"install -d -m 755 {shlex.quote(str(Path(dest).parent))} && "
           f"install -m {mode}{group_args} /dev/null {q_new}")  # fmt: skip
    yield from private_upload(secret, f"{dest}.new")
    yield f"chmod {mode} {q_new}{f' && chgrp {shlex.quote(group)} {q_new}' if group else ''} && mv -f {q_new} {shlex.quote(dest)}"


@operation()
def put_file(text: str, dest: str, mode: str = "644"):
    """Put ``text`` into ``dest`` with ``mode`` (owned by root), through ``private_upload``.

    + text: the file's content
    + dest: the file on the host; written as ``dest.new``, then renamed over ``dest``
    + mode: its mode (octal digits, e.g. ``644``)

    A file with this content and mode already is left as it is; pyinfra's
    ``files.put`` would upload through a temporary name anyone can foresee."""
    yield from put_text(text, dest, mode)


def put_text(text: str, dest: str, mode: str = "644"):
    """The commands that put ``text`` into ``dest`` (``put_file``), for an operation whose
    text is made when it runs; none, with a no-op message, when the file is already so."""
    digest = hashlib.sha1(text.encode()).hexdigest()
    found = read(File, path=dest)
    if found and read(Sha1File, path=dest) == digest and f"{found.get('mode')}" == mode.lstrip("0"):
        host.noop(f"{dest} is up to date")
        return
    show_diff(dest, text)
    yield remote.argv("install", "-d", "-m", "755", "--", str(Path(dest).parent))
    yield from private_upload(text, f"{dest}.new")
    yield f"{remote.argv('chmod', mode, '--', f'{dest}.new')} && {durable_rename(f'{dest}.new', dest)}"


def show_diff(path: str, text: str, mask=None, current=None) -> None:
    """With ``--diff``, print how the file at ``path`` becomes ``text``, as pyinfra's files.put
    does (the file is read only then, unless its lines are given: ``current``); ``mask`` hides
    a secret in both."""
    if not getattr(getattr(host.state, "config", None), "DIFF", False):
        return
    mask = mask or (lambda t: t)
    if current is None:
        current = read(FileContents, path=path)
        old = [line + "\n" for line in mask("\n".join(current or [])).splitlines()]
    else:
        old = [line + "\n" for line in current]
    host.log(f"Will {'modify' if current else 'create'} {path}", logger.info)
    for line in generate_color_diff(old, mask(text).splitlines(keepends=True)):
        logger.info("  %s", line)
    logger.info("")


def executing() -> bool:
    """True while operations run; False while pyinfra plans (facts may predate earlier ops)."""
    state = ctx_state.get()
    return bool(state and state.is_executing)


@operation()
def apt_install_missing(packages: list, cache_time: int = 86400):
    """Install the apt packages that are missing; refresh the lists only then.

    + packages: package names
    + cache_time: apt-get update runs only if the lists are older than this (seconds)

    ``apt.packages(update=True)`` would refresh the lists on every run once
    they are older than ``cache_time``; here a converged host makes no apt call."""
    installed = read(DebPackages)
    missing = [p for p in packages if p not in installed]
    if not missing:
        host.noop(f"apt packages already installed: {', '.join(packages)}")
        return
    yield from apt.update._inner(cache_time=cache_time)
    yield from apt.packages._inner(packages=missing, no_recommends=True)


@operation()
def miniforge(installer_url: str, installer_sha256: str, prefix: str):
    """Install Miniforge under ``prefix`` once, from a sha256-pinned installer.

    + installer_url: the Miniforge installer (or a mirror of it)
    + installer_sha256: its sha256; a mismatch stops before the installer runs
    + prefix: install directory (``<root>/conda``)"""
    if read(File, path=f"{prefix}/bin/conda"):
        host.noop(f"conda already installed in {prefix}")
        return
    part = f"{prefix}.installer.part"
    yield StringCommand(remote.argv("curl", "-fsSL", "--retry", "3", "-o", part, "--", installer_url))
    # Checked before it runs: a wrong or truncated download never executes.
    yield StringCommand(f"echo {shlex.quote(f'{installer_sha256}  {part}')} | sha256sum -c --quiet - "
                        f"|| {{ rm -f {shlex.quote(part)}; echo 'Miniforge installer: sha256 mismatch' >&2; exit 1; }}")
    yield StringCommand(remote.argv("bash", part, "-b", "-p", prefix))
    yield StringCommand(remote.argv("rm", "-f", "--", part))


@operation()
def conda_env(conda: str, env: str, specs: list, channels: list, marker: str):
    """Create a conda env with ``specs`` from ``channels`` only, if ``marker`` is missing.

    + conda: the conda binary
    + env: env prefix
    + specs: package specs (``python=3.10``, ``cuda-nvcc``)
    + channels: channels, in order; nothing else is searched (--override-channels)
    + marker: a file the env has once complete (``<env>/bin/python``, ``<env>/bin/nvcc``)"""
    if read(File, path=marker):
        host.noop(f"conda env {env} already has {Path(marker).name}")
        return
    yield StringCommand(remote.argv(conda, "create", "--yes", "--quiet", "--prefix", env, "--override-channels",
                                    *(arg for ch in channels for arg in ("-c", ch)), *specs))  # fmt: skip


def miniforge_env(python_env, conda_root: str, env: str, specs: list, channels: list, marker: str, name: str):
    """Miniforge under ``conda_root`` (the installer of the ``python_env_conda_installer_*``
    settings), then the conda env ``env`` (``conda_env``): the operations, for a deploy."""
    miniforge(name="Miniforge", installer_url=python_env.conda_installer_url,
              installer_sha256=python_env.conda_installer_sha256, prefix=conda_root)  # fmt: skip
    conda_env(name=name, conda=f"{conda_root}/bin/conda", env=env, specs=specs, channels=channels, marker=marker)
