"""Facts about llama.cpp on a host: source checkout, builds, the built server's flags."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field, fields
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from llamarack import remote
from llamarack.facts.value import FactValue, json_object
from llamarack.layout import Layout
from roles.llamacpp.files.build_seal import inputs_stamp
from roles.llamacpp.files.llamacpp_proof import ServerFlags, parse_server_help
from llamarack.facts import FactRead

# Options only the served unit uses. They are read here, not in the smoke script's
# parse_server_help: that script's hash is part of every build stamp.
ROPE_FLAGS = ("--rope-scaling", "--rope-scale", "--yarn-orig-ctx")
# Speculative decoding with a draft model, as llama.cpp spells it now (docs/planning.md, "Speculative decoding").
SPEC_DRAFT_FLAGS = ("--spec-type", "draft-simple", "--spec-draft-model", "--spec-draft-n-max",
                    "--spec-draft-n-min", "--spec-draft-ngl", "--spec-draft-type-k", "--spec-draft-type-v")


@dataclass(frozen=True)
class BuildFlags(ServerFlags):
    """``ServerFlags`` of the current build, plus the options only the unit needs."""

    has_rope_scaling: bool = False
    """``--rope-scaling``, ``--rope-scale`` and ``--yarn-orig-ctx`` are all in its --help."""
    has_spec_draft: bool = False
    """Every option of ``SPEC_DRAFT_FLAGS`` (a draft model's speculative decoding) is in its --help."""
    has_backend_sampling: bool = False
    """``--backend-sampling`` (the sampler chain on the GPU) is in its --help."""
    has_sleep_idle: bool = False
    """``--sleep-idle-seconds`` (the server frees the model while idle) is in its --help."""
    has_cache_ram: bool = False
    """``--cache-ram`` (the prompt cache in host RAM, and its limit) is in its --help."""


def parse_build_help(text: str, proven_args: tuple = ()) -> BuildFlags:
    """``parse_server_help`` and the unit-only options."""
    base = parse_server_help(text, proven_args)
    return BuildFlags(**{f.name: getattr(base, f.name) for f in fields(base)},
                      has_rope_scaling=all(flag in text for flag in ROPE_FLAGS),
                      has_spec_draft=all(flag in text for flag in SPEC_DRAFT_FLAGS),
                      has_backend_sampling=_has_option(text, "--backend-sampling"),
                      has_sleep_idle=_has_option(text, "--sleep-idle-seconds"),
                      has_cache_ram=_has_option(text, "--cache-ram"))  # fmt: skip


def _has_option(text: str, option: str) -> bool:
    """Whether --help ``text`` lists ``option`` as an option of its own (not a prefix of another)."""
    return re.search(rf"(^|[\s,]){re.escape(option)}\b", text, re.M) is not None


class GitHead(FactBase[Optional[str]]):
    """Returns the full sha checked out in a git work tree, or None when there is
    no repository there (or no commit checked out)."""

    def command(self, path: str) -> str:
        return f"git -C {shlex.quote(path)} rev-parse --verify --quiet HEAD 2>/dev/null || true"

    def process(self, output) -> Optional[str]:
        text = "\n".join(output).strip()
        if not text:
            return None
        if not re.fullmatch(r"[0-9a-f]{40}", text):
            raise FactProcessError(f"unexpected git rev-parse output: {text!r}")
        return text


class CpuFlags(FactBase[Optional[str]]):
    """Returns the CPU's ``flags`` line of ``/proc/cpuinfo`` (its words, sorted), None where
    there is none (not x86, or no procfs): what a build for the host's own CPU
    (``-march=native``) depends on, so only hosts with the same flags share one."""

    def command(self) -> str:
        return "grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true"

    def process(self, output) -> Optional[str]:
        text = "\n".join(output).strip()
        head, sep, flags = text.partition(":")
        if not sep or head.strip() != "flags":
            return None
        words = flags.split()
        if not all(re.fullmatch(r"[a-z0-9_.]+", w) for w in words):
            raise FactProcessError(f"unexpected /proc/cpuinfo flags: {text[:200]!r}")
        return " ".join(sorted(words))


@dataclass(frozen=True)
class Builds(FactValue):
    current: Optional[str]
    """The stamp ``builds/current`` points to, None when there is none."""
    verified: dict
    """``{stamp: unix time of verification}`` for every build that passed its checks."""
    partial: tuple = ()
    """Build directories without a record: failed or interrupted builds."""

    def newest_first(self) -> list[str]:
        return sorted(self.verified, key=lambda s: (self.verified[s], s), reverse=True)


class LlamacppBuilds(FactBase[Builds]):
    """Returns the verified llama.cpp builds under ``<root>/builds`` and the one
    ``current`` points to. A build counts only once its ``build-info.json``
    exists: the build step writes it last, after verification, so a failed
    or interrupted build is never taken for a good one."""

    def command(self, root: str) -> str:
        builds = shlex.quote(Layout(root).builds)
        return (f"cd {builds} 2>/dev/null || exit 0; "
                'echo "current $(readlink current 2>/dev/null)"; '
                'for d in */; do d=${d%/}; [ "$d" = current ] && continue; '
                'if [ -f "$d/build-info.json" ]; then echo "verified $d $(stat -c %Y "$d/build-info.json")"; '
                'else echo "partial $d"; fi; done; true')

    def default(self) -> Builds:
        return Builds(None, {})

    def process(self, output) -> Builds:
        current, verified, partial = None, {}, []
        for line in output:
            words = line.split()
            if words[:1] == ["current"]:
                current = words[1] if len(words) > 1 else None
            elif words[:1] == ["verified"] and len(words) == 3 and words[2].isdigit():
                verified[words[1]] = int(words[2])
            elif words[:1] == ["partial"] and len(words) == 2:
                partial.append(words[1])
            else:
                raise FactProcessError(f"unexpected builds line: {line!r}")
        return Builds(current, verified, tuple(partial))


class LlamaServerFlags(FactBase[Optional[ServerFlags]]):
    """Returns the flags record of the current build: the ``llama-server --help``
    output saved next to it at build time, and the runtime arguments its smoke
    run needed to compute (``proof.runtime_args`` of ``build-info.json``, e.g.
    ``--no-repack`` on a CPU whose AMX faults). None when there is no current
    build."""

    _SPLIT = "--- llamarack build-info.json ---"

    def command(self, root: str) -> str:
        current = Layout(root).current_build
        return (f"cat {shlex.quote(current + '/server-help.txt')} 2>/dev/null || exit 0; "
                f"echo {shlex.quote(self._SPLIT)}; cat {shlex.quote(current + '/build-info.json')} 2>/dev/null; true")

    def process(self, output) -> Optional[ServerFlags]:
        lines = list(output)
        split = lines.index(self._SPLIT) if self._SPLIT in lines else len(lines)
        text = "\n".join(lines[:split])
        if not text.strip():
            return None
        try:
            record = json.loads("\n".join(lines[split + 1:]) or "{}")
            proven = (record.get("proof") or {}).get("runtime_args") or ()
            if not all(isinstance(a, str) for a in proven):
                raise ValueError(f"proof.runtime_args is not a list of strings: {proven!r}")
            return parse_build_help(text, tuple(proven))
        except ValueError as e:
            raise FactProcessError(str(e)) from e


class BuildRecord(FactBase[Optional[dict]]):
    """Returns the record of the current llama.cpp build (its ``build-info.json``,
    written by the smoke run that proved it), or None when there is no current build."""

    def command(self, root: str) -> str:
        return f"cat {shlex.quote(Layout(root).current_build + '/build-info.json')} 2>/dev/null; true"

    def process(self, output) -> Optional[dict]:
        return json_object(output, "build-info.json")


@dataclass(frozen=True)
class Seals(FactValue):
    changed: dict
    """``{stamp: [what differs, one line each]}`` for every sealed build; [] when intact."""
    unsealed: tuple = ()
    """Proven builds without a manifest (proven before llamarack sealed builds, or cut
    off between the smoke run and the seal): nothing to compare them with."""
    sha256: Optional[dict] = None
    """With a deep read: ``{"name": stamp, "changed": [...]}``, the sha256 of every sealed
    file of that build compared with its seal."""
    stamps: dict = field(default_factory=dict)
    """``{name: stamp of its inputs}`` for every proven build (from its record: a build
    keeps its identity whatever its directory is called)."""
    proofs: dict = field(default_factory=dict)
    """``{name: proof id}``: the proof each build passed (None: before proofs had ids)."""
    failed: dict = field(default_factory=dict)
    """``{name: proof id}`` of a build that failed that proof when re-proved."""
    bytes: dict = field(default_factory=dict)
    """``{name: bytes}``: the size of each sealed build's sealed files, from its seal."""

    def tampered(self, stamp: str) -> bool:
        """A file of the build differs from its seal (size, mtime, inode; gone or added)."""
        return bool(self.changed.get(stamp))


class BuildSeals(FactBase[Seals]):
    """Returns how every proven llama.cpp build under ``<root>/builds`` compares with
    its seal (``manifest.json``, written by ``roles/llamacpp/files/build_seal.py`` once
    the smoke run proved the build): the cheap signature of every sealed file
    (size, mtime_ns, inode). With ``sha256`` (a build directory, or ``current``)
    that build's files are read and hashed as well."""

    requires_command = "python3"

    def host_run(self, root: str, sha256: Optional[str] = None) -> tuple:
        # Read together with other host runs, it shares their python3 (FactsTogether).
        return ("build_seal", "check", Layout(root).builds, *(("--sha256", sha256) if sha256 else ()))

    def command(self, root: str, sha256: Optional[str] = None) -> str:
        return remote.command(*self.host_run(root, sha256))

    def default(self) -> Seals:
        return Seals({})

    def process(self, output) -> Seals:
        try:
            report = json.loads("\n".join(output))
            builds = report["builds"]
            changed = {k: list(v["changed"]) for k, v in builds.items() if v["sealed"]}
            unsealed = tuple(k for k, v in builds.items() if not v["sealed"])
            deep = report.get("sha256")
            return Seals(changed, unsealed, {"name": deep["name"], "changed": list(deep["changed"])} if deep else None,
                         stamps={k: inputs_stamp(v["inputs"]) for k, v in builds.items() if v.get("inputs")},
                         proofs={k: _proof_id(v.get("proof_id")) for k, v in builds.items()},
                         failed={k: _proof_id(v["proof_failed"]) for k, v in builds.items() if v.get("proof_failed")},
                         bytes={k: int(v["bytes"]) for k, v in builds.items() if v.get("sealed") and "bytes" in v})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise FactProcessError(f"unreadable build seal report: {e}") from e


def _proof_id(value) -> Optional[str]:
    if value is not None and not (isinstance(value, str) and re.fullmatch(r"[0-9a-f]{16}", value)):
        raise ValueError(f"a proof id is 16 hex digits, not {str(value)[:40]!r}")
    return value


class BenchRecord(FactBase[Optional[dict]]):
    """Returns the host's llama-bench record (``<root>/state/bench.json``, written by the
    server role's bench after a new build or model), or None when there is none."""

    def command(self, path: str) -> str:
        return f"cat {shlex.quote(path)} 2>/dev/null; true"

    def process(self, output) -> Optional[dict]:
        return json_object(output, "bench.json")


def reads(settings) -> tuple:
    """What the llamacpp role reads on a converged host: its part of preflight's one read."""
    if not settings.general.runs("llamacpp"):
        return ()
    root = settings.general.root
    return (FactRead.of(LlamacppBuilds, root=root), FactRead.of(BuildSeals, root=root),
            FactRead.of(GitHead, path=settings.layout.src), FactRead.of(CpuFlags))  # fmt: skip
