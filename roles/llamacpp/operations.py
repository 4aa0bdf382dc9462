"""The llama.cpp role's operations: pinned checkout, build with proof, switch, prune."""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.facts.files import FileContents

from llamarack import remote
from llamarack.facts import read
from roles.llamacpp.reads import BuildSeals, GitHead, LlamacppBuilds
from llamarack import ship as shipping
from llamarack.layout import Layout, unit_build
from llamarack.operations import private_upload

from . import ship
from .plan import PORTABLE_CPU_VARIANTS, BuildPlan, cpu_variant_name, with_cpu_features


@operation()
def checkout(git_url: str, commit: str, dest: str):
    """Check out a pinned commit of a git repository, and verify it.

    + git_url: repository (or mirror) to fetch from
    + commit: the pinned sha (full, or a prefix of at least 7 digits)
    + dest: work tree on the host (created on first use)

    No-op when ``dest`` already has the commit checked out."""
    head = read(GitHead, path=dest)
    if head and head.startswith(commit):
        host.noop(f"{dest} is at {commit[:12]}")
        return

    q_dest, q_url = shlex.quote(dest), shlex.quote(git_url)
    if head is None:
        # --no-local: from a local repository too, every object comes through git's pack
        # protocol and is checked against its id, never hardlinked or copied as found.
        yield f"rm -rf {q_dest} && mkdir -p {q_dest} && git clone --quiet --no-local --no-checkout -- {q_url} {q_dest}"
    else:
        yield f"git -C {q_dest} remote set-url origin {q_url} && git -C {q_dest} fetch --quiet origin"
    yield (f"git -C {q_dest} -c advice.detachedHead=false checkout --quiet --force --detach {shlex.quote(commit)}"
           f" && git -C {q_dest} clean --quiet -fdx")  # fmt: skip
    # The commit asked for is the commit checked out (a prefix could be ambiguous).
    yield (f'test "$(git -C {q_dest} rev-parse HEAD)" = '
           f'"$(git -C {q_dest} rev-parse --verify {shlex.quote(commit + "^{commit}")})"')  # fmt: skip


@operation()
def build(plan: BuildPlan, src: str, root: str, ccache_dir=None, jobs=None, key=None):
    """Build llama.cpp into ``<root>/builds/<stamp>``, verify it, and record it.

    + plan: the BuildPlan (inputs and stamp)
    + src: the checked-out source tree
    + root: the llamarack root
    + ccache_dir: ccache directory (shared by a rack), None for the default
    + jobs: parallel compile jobs, None for nproc
    + key: what hosts must share to share this build (``ship.build_key``); None: built here

    The directory counts only once the smoke run (``files/llamacpp_proof.py``) wrote its
    ``build-info.json``, last (docs/deploy.md, "A build counts only after it computed");
    ``current`` is not touched here. With ``key``, the build is made once in the run and
    received by the other hosts of the same key (``ship.py``, ``llamarack/ship``); a host that holds it sealed
    is a source."""
    builds = read(LlamacppBuilds, root=root)
    seals = read(BuildSeals, root=root) if plan.stamp in builds.verified else None
    if seals is not None and not seals.tampered(plan.stamp):
        if key and plan.stamp in seals.changed:
            shipping.hold(key, Layout(root).build(plan.stamp))
        host.noop(f"llama.cpp build {plan.stamp} exists and was verified")
        return
    commands = build_commands(plan, src, root, ccache_dir, jobs)
    if not key:
        yield from commands
        return
    spec = proof_spec(plan, Layout(root).build(plan.stamp), src, _build_env(plan, root, None), reprove=True)
    yield FunctionCommand(ship.obtain, (key, root, plan.stamp, commands, spec), {})


def build_commands(plan: BuildPlan, src: str, root: str, ccache_dir=None, jobs=None) -> list:
    """The commands that compile, check and prove the build ``plan`` here."""
    d = Layout(root).build(plan.stamp)
    q_d = shlex.quote(d)
    env = _build_env(plan, root, ccache_dir)

    commands = [f"rm -rf {q_d} && mkdir -p {q_d}", configure_command(d, src, env, plan.cmake_args),
                # Progress: one line per finished percent step goes to build.log as it
                # happens (`tail -f` it, or run pyinfra with -vvv to see it live).
                build_command(d, env, plan.targets, ccache_dir, jobs),
                f"ln -sfn build/bin {q_d}/bin",
                (f"{q_d}/bin/llama-server --version > {q_d}/version.txt 2>&1"
                 f" && grep -q {shlex.quote(plan.commit[:9])} {q_d}/version.txt"
                 f" || {{ echo 'llama-server --version failed or names another commit:' >&2;"
                 f" cat {q_d}/version.txt >&2; exit 1; }}")]  # fmt: skip
    if plan.backend == "cuda":
        cuobjdump = shlex.quote(f"{plan.cuda_home}/bin/cuobjdump")
        commands.append(f"{cuobjdump} --list-elf {q_d}/build/bin/libggml-cuda.so > {q_d}/cubins.txt")
        for arch in (a.split("-")[0] for a in plan.cuda_archs):
            commands.append(f"grep -q 'sm_{arch}\\.cubin' {q_d}/cubins.txt || {{ echo 'the build holds no sm_{arch}"
                            f" code (no kernel image for this GPU); refusing it' >&2; exit 1; }}")  # fmt: skip
    commands.append(f"{q_d}/bin/llama-server --help > {q_d}/server-help.txt 2>&1"
                    f" && grep -q -e '--load-mode' -e '--no-mmap' {q_d}/server-help.txt")  # fmt: skip
    commands += private_upload(json.dumps(proof_spec(plan, d, src, env, ccache_dir, jobs), indent=1, sort_keys=True),
                               f"{d}/proof-spec.json")  # fmt: skip
    commands.append(StringCommand(remote.command("llamacpp_proof", f"{d}/proof-spec.json")))
    return commands


def configure_command(d: str, src: str, env: str, cmake_args: tuple, append: bool = False) -> str:
    args = " ".join(shlex.quote(a) for a in cmake_args)
    return (
        f"cd {shlex.quote(d)} && {env} cmake -S {shlex.quote(src)} -B build {args} {'>>' if append else '>'} configure.log 2>&1"
        " || { tail -n 40 configure.log >&2; exit 1; }"
    )


def build_command(d: str, env: str, targets: tuple, ccache_dir=None, jobs=None, append: bool = False) -> str:
    jobs_arg = str(jobs) if jobs else "$(nproc)"
    # Hosts sharing a ccache compile one at a time: the first fills the cache and
    # the others then hit it, instead of all compiling the same files at once.
    lock = f"flock {shlex.quote(ccache_dir + '/llamarack-build.lock')} " if ccache_dir else ""
    # (The host's sh may be dash: no pipefail, so the exit code goes through a file.)
    return (
        f"cd {shlex.quote(d)} && {{ {lock}{env} cmake --build build --config Release -j {jobs_arg} --target {' '.join(targets)}"
        f" 2>&1; echo $? > build.rc; }} | tee {'-a ' if append else ''}build.log | grep --line-buffered -E '^\\[ *[0-9]+%\\]';"
        ' test "$(cat build.rc)" = 0 || { tail -n 60 build.log >&2; exit 1; }'
    )


def proof_spec(plan: BuildPlan, d: str, src: str, env: str, ccache_dir=None, jobs=None, reprove=False) -> dict:
    """What ``llamacpp_proof.py`` proves the build with: the serving flags and the ladder.

    Rung 1 is the build as asked. With ``llamacpp_cpu_fallback``: the same
    binary without weight repacking (no AMX or repacked CPU kernels; no
    rebuild), then rebuilds with fewer x86 extensions. Each rebuild reuses the
    build directory, so only ggml's CPU code compiles again. ``reprove``: the
    build exists (maybe in service) and is never rebuilt in place: no rebuild rungs."""
    serving = plan.proof["serving"]
    rungs = [{"name": cpu_variant_name(plan.proof["cpu_features"]), "why": "the build as asked", "serving": {}}]
    if plan.proof["cpu_fallback"]:
        if serving["repack"]:
            rungs.append({"name": f"{rungs[0]['name']}, no repack", "serving": {"repack": False},
                          "why": "the build as asked failed; AMX and repacked CPU kernels off (--no-repack)"})
        for name, portable in () if reprove else PORTABLE_CPU_VARIANTS:
            args = with_cpu_features(plan.cmake_args, portable)
            if args == plan.cmake_args:
                continue
            rungs.append({"name": name, "serving": {}, "x86_only": True, "cmake_args": list(args),
                          "why": f"the rungs before failed; rebuilt for {name} ({', '.join(portable)})",
                          "configure": configure_command(d, src, env, args, append=True),
                          "build": build_command(d, env, plan.targets, ccache_dir, jobs, append=True)})
    return {"build_dir": d, "record": json.loads(plan.record()), "quant": plan.proof["quant"], "serving": serving,
            "rungs": rungs, "timeout": PROOF_TIMEOUT, "reprove": reprove}


# Seconds the smoke run's llama-server may take to load and to answer.
PROOF_TIMEOUT = 300


def _build_env(plan: BuildPlan, root: str, ccache_dir) -> str:
    env = [
        # Paths relative to the root, so hosts and build directories share cache hits.
        f"CCACHE_BASEDIR={shlex.quote(root)}",
        "CCACHE_NOHASHDIR=true",
        # -march=native differs per CPU: keep a shared cache's entries per CPU flag set.
        "CCACHE_NAMESPACE=$(grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12)",
    ]
    if ccache_dir:
        env.append(f"CCACHE_DIR={shlex.quote(ccache_dir)}")
    if plan.backend == "cuda":
        # The chosen toolkit first: another nvcc/ptxas earlier in PATH (CUDA 13 in
        # /usr/local/bin) cannot build for sm_70.
        env.append(f"PATH={shlex.quote(plan.cuda_home)}/bin:$PATH")
    return "env " + " ".join(env)


@operation()
def reprove(plan: BuildPlan, src: str, root: str):
    """Prove an existing build again, in place, when the proof changed (a new llamarack's
    smoke script, or new serving flags) but what went into the build did not.

    + plan: the BuildPlan; ``plan.stamp`` the build directory, ``plan.proof_id`` the proof
    + src: the checked-out source tree
    + root: the llamarack root

    No-op when the build's record names this proof. A build that passes gets the new
    proof's result in its record and is sealed again; nothing is rebuilt, and the unit
    changes only if the new proof needs other runtime flags. A build that fails it stays
    as it was, ``builds/current`` and the unit are not touched, the run stops for this
    host, and the next deploy builds it again beside it (``build_dir_for``)."""
    seals = read(BuildSeals, root=root)
    if seals.proofs.get(plan.stamp) == plan.proof_id:
        host.noop(f"llama.cpp build {plan.stamp} is proven by proof {plan.proof_id}")
        return
    d = Layout(root).build(plan.stamp)
    spec = proof_spec(plan, d, src, _build_env(plan, root, None), reprove=True)
    yield from private_upload(json.dumps(spec, indent=1, sort_keys=True), f"{d}/proof-spec.json")
    yield StringCommand(remote.command("llamacpp_proof", f"{d}/proof-spec.json"), "&&",
                        remote.command("build_seal", "seal", d))


@operation()
def seal_build(root: str, stamp: str):
    """Seal a proven build: its ``manifest.json`` (``files/build_seal.py`` says what it holds).

    + root: the llamarack root
    + stamp: the build directory under ``builds/``

    A step of its own after the smoke run: a build proven before llamarack sealed
    builds, or one cut off between its proof and its seal, is sealed by the next run."""
    seals = read(BuildSeals, root=root)
    if stamp in seals.changed:
        host.noop(f"llama.cpp build {stamp} is sealed")
        return
    yield StringCommand(remote.command("build_seal", "seal", Layout(root).build(stamp)))


@operation()
def switch_current(root: str, stamp: str):
    """Point ``<root>/builds/current`` at a verified build, atomically (rename of a new link).

    + root: the llamarack root
    + stamp: the build to make current"""
    builds = read(LlamacppBuilds, root=root)
    if builds.current == stamp:
        host.noop(f"llama.cpp build {stamp} is current")
        return
    b = shlex.quote(Layout(root).builds)
    yield (f"test -f {shlex.quote(Layout(root).build(stamp))}/build-info.json"
           f" && ln -sfn {shlex.quote(stamp)} {b}/current.new && mv -T {b}/current.new {b}/current")  # fmt: skip


@operation()
def prune_builds(root: str, keep: int, previous=None, unit_path=None, serving=None):
    """Remove old builds, keeping ``current``, the ones the units serve with, the one that
    served before this run (rollback) and the newest; failed or interrupted build
    directories go too.

    + root: the llamarack root
    + keep: how many builds to keep in all; the current build and the ones the units
      name are kept even past it (with ``keep = 1`` and a new build whose unit was
      put back, both stay)
    + previous: the build ``current`` named before this run (read when the run was
      planned: by the time this runs, ``current`` may already point elsewhere)
    + unit_path: the llama-server unit; the build its ``ExecStart`` names is in use
    + serving: or a function, called when this runs, that gives the builds the host's units name"""
    builds, seals = read(LlamacppBuilds, root=root), read(BuildSeals, root=root)
    in_use = tuple(serving()) if serving else (unit_build(root, read(FileContents, path=unit_path)),) if unit_path else ()
    must = list(dict.fromkeys(s for s in (builds.current, *in_use) if s))
    # A build whose files differ from its seal is no rollback target: it goes once nothing runs it.
    ordered = [s for s in (previous, *builds.newest_first()) if not seals.tampered(s)]
    kept = list(dict.fromkeys([*must, *(s for s in ordered if s)]))[:max(keep, len(set(must)))]
    doomed = [s for s in builds.verified if s not in kept]
    doomed += [s for s in builds.partial if s not in must]
    if not doomed:
        host.noop(f"no llama.cpp build to prune (keeping {len(kept)})")
        return
    yield "rm -rf " + " ".join(shlex.quote(Layout(root).build(s)) for s in doomed)
