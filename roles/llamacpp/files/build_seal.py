# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Seal a proven llama.cpp build, and check builds against their seals.

    python3 build_seal.py seal BUILD_DIR
    python3 build_seal.py check BUILDS_DIR [--sha256 NAME]

``seal`` writes ``BUILD_DIR/manifest.json``: one entry per file of the
build that is run or read when serving (``SEALED``: the binaries and
libraries under ``build/bin``, and the records the deploy reads), with its
path relative to the build, size, mtime_ns, inode and sha256; a symlink is
recorded by its target. It runs after the smoke run wrote
``build-info.json``, as a step of its own: the smoke script's hash names the
proof (``BuildPlan.proof_id``), and sealing is no part of the proof.

``check`` prints one JSON object about every proven build (one with a
``build-info.json``) under BUILDS_DIR:

    {"builds": {"3f1c0a9e52d7b6e4": {"sealed": true, "changed": [], "inputs": {"commit": ...},
                                     "proof_id": "5a0c9e1f2b3d4c6e", "proof_failed": null, "bytes": 21088256},
                "9d0e4b1c2a3f5e6d": {"sealed": false, "changed": [], ...}},
     "sha256": {"name": "3f1c0a9e52d7b6e4", "changed": ["build/bin/llama-quantize: sha256 ..."]}}

``inputs`` are what went into the build (``BUILD_INPUTS`` of its record):
the control side stamps them (``inputs_stamp``), so the same inputs give the
same stamp whatever the directory is called, and a build made when stamps
also covered its proof is still found. ``proof_id`` names the proof that proved it (None: a build proven
before proofs were versioned); ``proof_failed`` the proof it last failed
when re-proved (``proof-failed.json``); ``bytes`` the sealed files' size in all, from the
seal (what shipping the build to another host carries).

``changed`` compares the cheap signature (size, mtime_ns, inode; a
symlink's target) and names files gone or added. ``--sha256 NAME`` (NAME a
build directory or ``current``) also reads every sealed file of that build
and compares its sha256: an edit in place that kept size and mtime shows
only there.
"""

import os
import sys

from json import dumps, loads

# What a build's seal covers, relative to the build directory.
SEALED = ("build/bin", "version.txt", "server-help.txt", "build-info.json")
MANIFEST = "manifest.json"
# The record's keys that shape the binaries (roles/llamacpp/plan.py: what a stamp is made of).
BUILD_INPUTS = ("recipe", "commit", "backend", "cuda_archs", "cuda_home", "cuda_version", "host_compiler",
                "cmake_args", "targets")
PROOF_FAILED = "proof-failed.json"


def inputs_stamp(inputs: dict) -> str:
    """The stamp of a build's inputs: sha256 over their ``BUILD_INPUTS`` (16 hex digits).
    Computed where the build is planned, and from ``check``'s report of a built one."""
    import hashlib  # on the control side only: the host's check reports the inputs themselves

    text = dumps({k: inputs.get(k) for k in BUILD_INPUTS}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _json_file(path: str):
    try:
        with open(path) as f:
            value = loads(f.read())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def identity(build_dir: str) -> dict:
    """What the build is and how it was proven: its inputs, proof id, last failed proof."""
    record = _json_file(os.path.join(build_dir, "build-info.json")) or {}
    failed = _json_file(os.path.join(build_dir, PROOF_FAILED)) or {}
    return {"inputs": {k: record.get(k) for k in BUILD_INPUTS} if record else None,
            "proof_id": record.get("proof_id"), "proof_failed": failed.get("proof_id")}


def sealed_files(build_dir: str) -> dict:
    """``{relative path: os.stat_result}`` of every file the seal covers (symlinks not followed)."""
    found = {}
    for top in SEALED:
        start = os.path.join(build_dir, top)
        if os.path.isdir(start) and not os.path.islink(start):
            for d, dirs, files in os.walk(start):
                dirs.sort()
                for name in sorted(files + [x for x in dirs if os.path.islink(os.path.join(d, x))]):
                    path = os.path.join(d, name)
                    found[os.path.relpath(path, build_dir)] = os.lstat(path)
        elif os.path.lexists(start):
            found[top] = os.lstat(start)
    return found


def sha256(path: str) -> str:
    import hashlib  # only where a file is hashed: OpenSSL's load is 2 ms of every audit's check

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def entry(build_dir: str, rel: str, st: os.stat_result) -> dict:
    path = os.path.join(build_dir, rel)
    if os.path.islink(path):
        return {"path": rel, "link": os.readlink(path)}
    return {"path": rel, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "sha256": sha256(path)}


def seal(build_dir: str) -> dict:
    """Write the manifest beside the build (atomically) and return it."""
    if not os.path.isfile(os.path.join(build_dir, "build-info.json")):
        raise SystemExit(f"{build_dir} has no build-info.json: only a proven build is sealed")
    files = [entry(build_dir, rel, st) for rel, st in sorted(sealed_files(build_dir).items())]
    manifest = {"files": files}
    new = os.path.join(build_dir, MANIFEST + ".new")
    with open(new, "w") as f:
        f.write(dumps(manifest, sort_keys=True) + "\n")
    os.replace(new, os.path.join(build_dir, MANIFEST))
    return manifest


def changes(build_dir: str, manifest: dict, deep: bool = False) -> list:
    """What differs between the build's files and its manifest, one line each."""
    now = sealed_files(build_dir)
    out = []
    for e in manifest.get("files", []):
        rel = e["path"]
        st = now.pop(rel, None)
        path = os.path.join(build_dir, rel)
        if st is None:
            out.append(f"{rel}: gone")
        elif "link" in e:
            target = os.readlink(path) if os.path.islink(path) else None
            if target != e["link"]:
                out.append(f"{rel}: links to {target} (sealed: {e['link']})")
        elif os.path.islink(path):
            out.append(f"{rel}: now a link to {os.readlink(path)}")
        else:
            for key, value in (("size", st.st_size), ("mtime_ns", st.st_mtime_ns), ("inode", st.st_ino)):
                if value != e[key]:
                    out.append(f"{rel}: {key} {value} (sealed: {e[key]})")
                    break
            else:
                if deep and sha256(path) != e["sha256"]:
                    out.append(f"{rel}: sha256 differs from its seal (size and mtime kept)")
    out += [f"{rel}: not in the seal" for rel in sorted(now)]
    return out


def check(builds_dir: str, deep_name=None) -> dict:
    report = {"builds": {}}
    try:
        names = sorted(os.listdir(builds_dir))
    except FileNotFoundError:
        names = []
    for name in names:
        d = os.path.join(builds_dir, name)
        if name == "current" or os.path.islink(d) or not os.path.isfile(os.path.join(d, "build-info.json")):
            continue
        try:
            with open(os.path.join(d, MANIFEST)) as f:
                manifest = loads(f.read())
        except FileNotFoundError:
            report["builds"][name] = {"sealed": False, "changed": [], **identity(d)}
            continue
        except ValueError:
            report["builds"][name] = {"sealed": True, "changed": [f"{MANIFEST}: unreadable"], **identity(d)}
            continue
        report["builds"][name] = {"sealed": True, "changed": changes(d, manifest), **identity(d),
                                  "bytes": sum(e.get("size") or 0 for e in manifest.get("files", []))}
        if deep_name is not None:
            target = os.path.basename(os.path.realpath(os.path.join(builds_dir, deep_name)))
            if target == name:
                report["sha256"] = {"name": name, "changed": changes(d, manifest, deep=True)}
    return report


def main(argv: list) -> int:
    if argv[1:2] == ["seal"] and len(argv) == 3:
        manifest = seal(argv[2])
        print(f"sealed {argv[2]}: {len(manifest['files'])} files")
        return 0
    if argv[1:2] == ["check"] and len(argv) in (3, 5) and (len(argv) == 3 or argv[3] == "--sha256"):
        print(dumps(check(argv[2], argv[4] if len(argv) == 5 else None), sort_keys=True))
        return 0
    print("usage: build_seal.py seal BUILD_DIR | check BUILDS_DIR [--sha256 NAME]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
