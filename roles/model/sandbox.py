"""The model pipeline's steps (fetch, convert, quantize, AWQ, the quality runs) as an
unprivileged user, each in a transient systemd unit with the served unit's kind of
restrictions: docs/ARCHITECTURE.md ("The model pipeline's sandbox") says why, and what
each step may reach.

Each step runs as ``systemd-run --quiet --wait --pipe --collect --uid=USER -p ... -- COMMAND``
(bookworm's systemd 252): ``--collect`` unloads the unit even when it failed, ``--quiet``
keeps systemd-run's own lines out of the step's log, and systemd stops every process the
step left behind. Every ``$`` of a word is written ``$$`` (systemd expands it in a transient
unit's command line); property and environment values are fixed words or paths of
``host_path``'s shape (systemd-run splits a property's value on spaces).
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from llamarack import remote
from llamarack.settings_fields import host_path

# The pipeline's account: made by the model role, owns only what its steps write.
PIPELINE_USER = "llamarack-model"
PIPELINE_HOME = "/nonexistent"

# Every step, as the served unit (roles/server/templates/llama-server.service.j2).
CONFINED = (
    ("NoNewPrivileges", "yes"), ("CapabilityBoundingSet", ""), ("RestrictSUIDSGID", "yes"),
    ("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"), ("PrivateDevices", "yes"),
    # PrivateDevices binds the host's /dev/shm into the private /dev: a private one over it.
    ("TemporaryFileSystem", "/dev/shm:mode=1777"), ("PrivateIPC", "yes"), ("ProtectProc", "invisible"),
    ("UMask", "0022"),
    ("ProtectKernelTunables", "yes"), ("ProtectKernelModules", "yes"), ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"), ("ProtectClock", "yes"), ("ProtectHostname", "yes"),
    ("LockPersonality", "yes"), ("RestrictRealtime", "yes"), ("RestrictNamespaces", "yes"), ("RemoveIPC", "yes"),
    ("SystemCallArchitectures", "native"), ("SystemCallFilter", "@system-service"),
    ("SystemCallFilter", "~@privileged"), ("SystemCallErrorNumber", "EPERM"),
)  # fmt: skip
ONLINE = (("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),)
OFFLINE = (("PrivateNetwork", "yes"), ("IPAddressDeny", "any"), ("RestrictAddressFamilies", "AF_UNIX"))

# The user has no home: caches (the hub's dynamic modules among them) go to the private /tmp.
HOME_ENV = (("HOME", "/tmp"), ("PYTHONDONTWRITEBYTECODE", "1"))
OFFLINE_ENV = HOME_ENV + (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
                          ("HF_HUB_DISABLE_TELEMETRY", "1"), ("HF_HOME", "/tmp/hf-home"))  # fmt: skip

_WORD = re.compile(r"[A-Za-z0-9@~_.:/=+ -]*")
_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")


class SandboxValueError(ValueError):
    """A value that cannot go into systemd-run's command line as it is."""


def _checked(key: str, value: str, path: bool) -> str:
    bare = value[1:] if path and value.startswith("-") else value
    if (host_path(bare) if path else not _WORD.fullmatch(value)):
        raise SandboxValueError(f"systemd-run {key}={value!r}: not a value systemd-run reads back as given")
    return f"{key}={value}"


def properties(writable: Sequence[str], readonly: Sequence[str] = (), network: bool = False,
               devices: Sequence[str] = ()) -> tuple:
    """The unit properties of a step that may write ``writable`` and reads ``readonly`` (read-only
    even under a writable path; either may be missing), with or without the network; with
    ``devices`` (the NVIDIA driver's ``/proc/devices`` names: a step on the GPU), those
    character devices and the pseudo-devices only, instead of a private ``/dev``."""
    paths = tuple(("ReadWritePaths", p) for p in writable) + tuple(("ReadOnlyPaths", f"-{p}") for p in readonly)
    confined = CONFINED
    if devices:
        confined = tuple(p for p in CONFINED if p[0] != "PrivateDevices") + (("DevicePolicy", "closed"),) + \
            tuple(("DeviceAllow", f"char-{name} rw") for name in devices)  # fmt: skip
    return confined + paths + (ONLINE if network else OFFLINE)


def command(step: str, words: Iterable[str], user: str, workdir: str, props: Sequence[tuple],
            env: Sequence[tuple]) -> str:
    """The shell command that runs ``words`` as ``user`` in ``workdir``, in a transient unit of
    ``props`` with the environment ``env``; it exits with the command's status."""
    if not _USER.fullmatch(user) or user == "root":
        raise SandboxValueError(f"systemd-run --uid={user!r}: an unprivileged system user's name")
    options = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect", f"--uid={user}",
               f"--description=llamarack model {step}", _checked("--working-directory", workdir, path=True)]
    options += [word for key, value in props for word in ("-p", _checked(key, value, key.endswith("Paths")))]
    options += [_checked("--setenv=" + key, value, path=False) for key, value in env]
    # systemd makes $$ of a unit's command line $ again and expands nothing
    return remote.argv(*options, "--", *(w.replace("$", "$$") for w in words))


def fetch(words: Iterable[str], user: str, root: str, workdir: str) -> str:
    """The fetch: the network, and the llamarack root writable (as far as permissions go)."""
    return command("fetch", words, user, workdir, properties([root], network=True), HOME_ENV)


def offline(step: str, words: Iterable[str], user: str, workdir: str, readonly: Sequence[str] = (),
            devices: Sequence[str] = (), env: Sequence[tuple] = ()) -> str:
    """Convert, quantize, AWQ or a quality run: no network, hub libraries offline, only ``workdir``
    writable; ``devices``: the GPU's character devices it may open (AWQ and quality runs on a
    CUDA host), else none; ``env``: (name, value) the step's environment adds."""
    return command(step, words, user, workdir, properties([workdir], readonly, devices=devices),
                   OFFLINE_ENV + tuple(env))  # fmt: skip
