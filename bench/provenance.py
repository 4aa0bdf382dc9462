#!/usr/bin/env python3
"""What ran, from which tree, where and when: the stamp every benchmark puts in its result
under ``"provenance"`` (standard library only, so the GPU machine's scripts use it too).

    sys.path.insert(0, str(ROOT / "bench")); import provenance
    result["provenance"] = provenance.stamp(__file__)

The stamp holds:

- ``commit``: ``git rev-parse HEAD``, and ``tree``: ``clean`` or ``dirty`` (``changed``: the
  tracked files that differ from it, ``bench/results/`` left out: a bench writes there).
  Where the tree has no git (a copy of the checkout on the GPU machine), both come from
  ``.carry/source.json``, which ``python3 bench/provenance.py source`` wrote here with
  the commit and every tracked file's git blob id: each file of the copy is hashed the
  same way and compared, so an edit made after the carry is seen (``commit_from``);
- ``scripts``: the sha256 of the script that ran, of each file it imported from ``bench/``
  (a load generator, a report module, this one) and of any other file it names (a shell
  driver);
- ``command``: the command line (a shell driver that runs it names itself through
  ``BENCH_COMMAND``); ``started`` and ``written`` (UTC);
- ``machine``: CPU model, cores, memory, kernel, OS, Python; on a machine with
  ``nvidia-smi``, each GPU's name, driver, memory and compute capability.

A result written by several commands (phases run on a warm machine one command after
another) keeps each command's stamp in ``runs`` (``joined``); ``mixed`` is true when they
ran different commits or scripts.

    python3 bench/provenance.py source > .carry/source.json
    python3 bench/provenance.py check bench/results/*.json
        each stamped result's scripts against its commit (``git show COMMIT:PATH``)
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Optional

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "llamarack-bench-provenance/1"
CARRIED = ".carry/source.json"
NOT_TRACKED = ("bench/results/",)  # what a bench writes: not part of the tree it ran
SHOWN_CHANGES = 20


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


STARTED = now()  # the bench imports this module as it starts


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def blob_id(path: Path) -> str:
    """The file's git blob id (sha1 of ``blob SIZE\\0`` and its bytes), as ``git ls-files -s`` shows it."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(root: Path, *args: str) -> Optional[str]:
    if not (root / ".git").exists() or not shutil.which("git"):
        return None
    r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def _counted(path: str) -> bool:
    return not path.startswith(NOT_TRACKED)


def from_git(root: Path) -> Optional[dict]:
    """The commit and the tracked files that differ from it, by git; None without git."""
    head = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    if head is None or status is None:
        return None
    changed = sorted(p for p in (line[3:].split(" -> ")[-1] for line in status.splitlines()) if _counted(p))
    return {"commit": head.strip(), "commit_from": "git", **_tree(changed)}


def _tree(changed: list) -> dict:
    return {"tree": "dirty" if changed else "clean", "changed": changed[:SHOWN_CHANGES],
            **({"changed_count": len(changed)} if len(changed) > SHOWN_CHANGES else {})}  # fmt: skip


def carried_source(root: Path) -> dict:
    """What ``source`` wrote here for a copy without git: the commit, whether the tree was
    clean, and every tracked file's blob id."""
    files = {}
    for line in (_git(root, "ls-files", "-s") or "").splitlines():
        meta, path = line.split("\t", 1)
        if meta.split()[0] != "160000" and _counted(path):  # not a submodule
            files[path] = meta.split()[1]
    git = from_git(root) or {}
    return {"commit": git.get("commit"), "tree": git.get("tree"), "changed": git.get("changed", []),
            "written": now(), "files": files}  # fmt: skip


def from_carry(root: Path) -> Optional[dict]:
    """The commit ``.carry/source.json`` names, and which of its files this copy changed
    (a blob id that differs, a file missing), together with those changed at the carry."""
    path = root / CARRIED
    if not path.is_file():
        return None
    carried = json.loads(path.read_text())
    changed = set(carried.get("changed") or [])
    for name, blob in carried["files"].items():
        here = root / name
        if not here.is_file() or blob_id(here) != blob:
            changed.add(name)
    return {"commit": carried["commit"], "commit_from": f"{CARRIED} (written {carried.get('written')})",
            **_tree(sorted(changed))}  # fmt: skip


def source(root: Path = ROOT) -> dict:
    """The commit and the state of the tree: by git, else by the carried record, else unknown.
    Where both say and differ (a copy whose git is older than the checkout it came from), the
    one the tree's files agree with more."""
    found = [f for f in (from_git(root), from_carry(root)) if f]
    if not found:
        return {"commit": None, "commit_from": "unknown: no git, no " + CARRIED, "tree": "unknown", "changed": []}
    return min(found, key=lambda f: f.get("changed_count", len(f["changed"])))


def _relative(path: Path, root: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def bench_modules(root: Path) -> list:
    """The files of the modules this process imported from ``root/bench``."""
    bench = (root / "bench").resolve()
    found = []
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if name and name.endswith(".py") and Path(name).resolve().is_relative_to(bench):
            found.append(Path(name).resolve())
    return found


def scripts(script, extra: Iterable = (), root: Path = ROOT) -> dict:
    """{path under the root: sha256} of the script, the files it imported from bench/, and ``extra``."""
    paths = [Path(script).resolve(), *bench_modules(root), *(root / p for p in extra)]
    return {_relative(p, root): sha256(p) for p in sorted(set(paths)) if p.is_file()}


def command(script, argv: Optional[list] = None, root: Path = ROOT) -> str:
    """The command line that ran: ``BENCH_COMMAND`` where a shell driver set it, else
    ``python3 SCRIPT ARGS`` (the script under the root)."""
    if os.environ.get("BENCH_COMMAND"):
        return os.environ["BENCH_COMMAND"]
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python3", _relative(Path(script), root), *args])


def _first(path: str, key: str) -> Optional[str]:
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(key)), None)


def gpus() -> list:
    """Each GPU nvidia-smi lists: name, driver, memory, compute capability ([] without nvidia-smi)."""
    if not shutil.which("nvidia-smi"):
        return []
    query = "--query-gpu=name,driver_version,memory.total,compute_cap"
    try:
        out = subprocess.run(["nvidia-smi", query, "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=60).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    keys = ("name", "driver", "memory", "compute_cap")
    return [dict(zip(keys, (f.strip() for f in line.split(",")))) for line in out.splitlines() if line.count(",") == 3]


def machine() -> dict:
    """The machine the bench ran on."""
    mem_kib = _first("/proc/meminfo", "MemTotal")
    try:
        system = platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:
        system = None
    return {"cpu": _first("/proc/cpuinfo", "model name") or platform.processor(), "cores": os.cpu_count(),
            "memory_gib": round(int(mem_kib.split()[0]) / 2**20, 1) if mem_kib else None,
            "kernel": platform.release(), "os": system, "python": platform.python_version(),
            "gpus": gpus()}  # fmt: skip


def stamp(script, extra: Iterable = (), argv: Optional[list] = None, cmd: Optional[str] = None,
          root: Path = ROOT) -> dict:  # fmt: skip
    """The provenance of a result written now by ``script`` (its ``__file__``); ``extra``:
    other files under the root that ran (a shell driver); ``argv``: its arguments (default
    ``sys.argv[1:]``); ``cmd``: the command line, where the script knows it better."""
    return {"schema": SCHEMA, **source(root), "scripts": scripts(script, extra, root),
            "command": cmd or command(script, argv, root), "started": STARTED, "written": now(),
            "machine": machine()}  # fmt: skip


def runs_of(stamp: Optional[dict]) -> list:
    """The commands a stamp speaks for: its ``runs``, or itself alone."""
    if not stamp:
        return []
    return list(stamp.get("runs") or [{k: stamp.get(k) for k in ("commit", "tree", "command", "started", "written",
                                                                  "scripts", "machine")}])  # fmt: skip


def merged(stamps: list) -> dict:
    """One stamp for a result that several commands wrote (``stamps``: theirs, in order; the
    last one's on top): each command's in ``runs``, ``mixed`` where their commits or
    scripts differ."""
    runs = [run for s in stamps for run in runs_of(s)]
    mixed = len({(r.get("commit"), json.dumps(r.get("scripts"), sort_keys=True)) for r in runs}) > 1
    return {**stamps[-1], "runs": runs, "mixed": mixed}


def joined(earlier: Optional[dict], current: dict) -> dict:
    """``current``'s stamp for a result that earlier commands wrote too (``earlier``: the
    stamp they left, or None)."""
    return merged([s for s in (earlier, current) if s])


def check(result: dict, root: Path = ROOT) -> list:
    """What does not hold of a result's stamp: each script's sha256 against the file at the
    stamp's commit, and a tree that was not clean. [] where all holds."""
    p = result.get("provenance")
    if not p:
        return ["no provenance"]
    problems = [] if p.get("tree") == "clean" else [f"tree {p.get('tree')}: {', '.join(p.get('changed') or [])}"]
    problems += ["its commands ran different commits or scripts"] if p.get("mixed") else []
    if not p.get("commit"):
        return problems + ["no commit"]
    for path, digest in p.get("scripts", {}).items():
        r = subprocess.run(["git", "-C", str(root), "show", f"{p['commit']}:{path}"], capture_output=True)
        if r.returncode != 0:
            problems.append(f"{path}: not at {str(p['commit'])[:10]}")
        elif hashlib.sha256(r.stdout).hexdigest() != digest:
            problems.append(f"{path}: differs from the file at {p['commit'][:10]}")
    return problems


def main(argv: Optional[list] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["source"]:
        print(json.dumps(carried_source(ROOT), indent=1, sort_keys=True))
        return 0
    if args[:1] == ["check"] and len(args) > 1:
        bad = 0
        for name in args[1:]:
            problems = check(json.loads(Path(name).read_text()))
            bad += bool(problems)
            print(f"{name}: " + ("; ".join(problems) if problems else "ok"))
        return 1 if bad else 0
    print(__doc__.split("\n\n")[-1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
