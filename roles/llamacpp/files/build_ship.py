# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Pack a sealed llama.cpp build for another host, and take one in against its seal.

    python3 build_ship.py pack BUILD_DIR TAR
    python3 build_ship.py receive TAR SHA256 INCOMING_DIR

``pack`` writes TAR (atomically): the build's ``manifest.json`` (its seal, written by
``build_seal.py``) and every file the seal names, and nothing else: no object files, no
log. It refuses a build with no seal, or one whose files differ from it (sha256 read).
It prints the tar's size and sha256.

``receive`` checks TAR's own sha256 against SHA256 (what the control machine read when
it fetched it), then unpacks it into INCOMING_DIR (made new; a dot-directory beside the
builds, which no reader takes for a build) and checks every file against the seal it
carries: each sealed file present with its sha256 and each link with its target, and
nothing else in the tar. Only regular files and links inside the directory are unpacked.
Anything else is a refusal: INCOMING_DIR is removed and it exits 1 naming the file. The
caller proves the build on this host's cards before it becomes a build (``ship.py``).
"""

import hashlib
import json
import os
import shutil
import sys
import tarfile

MANIFEST = "manifest.json"
CHUNK = 1 << 20


class Refused(Exception):
    pass


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def load_manifest(path: str) -> list:
    try:
        with open(path) as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refused(f"{path}: no readable seal ({e})") from None
    if not isinstance(files, list) or not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in files):
        raise Refused(f"{path}: not a seal's file list")
    return files


def safe_name(rel: str) -> bool:
    parts = rel.split("/")
    return bool(rel) and not rel.startswith("/") and ".." not in parts and "" not in parts and "\n" not in rel


def checked(build_dir: str, files: list) -> None:
    """Every sealed file of ``build_dir`` as its seal says (sha256 read), else Refused."""
    for e in files:
        rel = e["path"]
        path = os.path.join(build_dir, rel)
        if not safe_name(rel):
            raise Refused(f"{rel!r}: not a path inside the build")
        if "link" in e:
            if not os.path.islink(path) or os.readlink(path) != e["link"]:
                raise Refused(f"{rel}: not the link the seal names ({e['link']})")
        elif os.path.islink(path) or not os.path.isfile(path):
            raise Refused(f"{rel}: missing or not a file")
        elif sha256_file(path) != e.get("sha256"):
            raise Refused(f"{rel}: sha256 differs from the seal")


def pack(build_dir: str, tar_path: str) -> dict:
    files = load_manifest(os.path.join(build_dir, MANIFEST))
    checked(build_dir, files)
    tmp = tar_path + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        tar.add(os.path.join(build_dir, MANIFEST), MANIFEST, recursive=False)
        for e in files:
            tar.add(os.path.join(build_dir, e["path"]), e["path"], recursive=False)
    os.replace(tmp, tar_path)
    return {"bytes": os.path.getsize(tar_path), "sha256": sha256_file(tar_path), "files": len(files)}


def unpack(tar_path: str, dest: str) -> list:
    """The tar's members into ``dest``: regular files and links only, each inside it."""
    names = []
    with tarfile.open(tar_path, "r:") as tar:
        for m in tar:
            if not safe_name(m.name) or not (m.isfile() or m.issym()):
                raise Refused(f"{m.name!r}: not a file or link inside the build")
            if m.issym() and (m.linkname.startswith("/") or ".." in m.linkname.split("/")):
                raise Refused(f"{m.name}: links outside the build ({m.linkname})")
            path = os.path.join(dest, m.name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if m.issym():
                os.symlink(m.linkname, path)
            else:
                with tar.extractfile(m) as src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
                os.chmod(path, m.mode & 0o755)
            names.append(m.name)
    return names


def receive(tar_path: str, want_sha256: str, dest: str) -> dict:
    got = sha256_file(tar_path)
    if got != want_sha256:
        raise Refused(f"the build's tar arrived with sha256 {got}, sent as {want_sha256} (damaged in transit)")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest, mode=0o755)
    names = unpack(tar_path, dest)
    files = load_manifest(os.path.join(dest, MANIFEST))
    extra = sorted(set(names) - {MANIFEST} - {e["path"] for e in files})
    if extra:
        raise Refused(f"{extra[0]}: in the tar but not in the seal")
    checked(dest, files)
    return {"files": len(files)}


def main(argv: list) -> int:
    try:
        if argv[1:2] == ["pack"] and len(argv) == 4:
            out = pack(argv[2], argv[3])
        elif argv[1:2] == ["receive"] and len(argv) == 5:
            try:
                out = receive(argv[2], argv[3], argv[4])
            except (Refused, OSError, tarfile.TarError):
                shutil.rmtree(argv[4], ignore_errors=True)
                raise
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except (Refused, OSError, tarfile.TarError) as e:
        print(f"llama.cpp build refused: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
