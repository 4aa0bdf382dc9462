# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Pack a sealed artifact (a llama.cpp build, a model) for another host, and take one in against its seal.

    python3 artifact_ship.py pack --kind build|model DIR TAR
    python3 artifact_ship.py receive --kind build|model TAR SHA256 INCOMING_DIR

``pack`` writes TAR (atomically): a manifest of the artifact's files with their sha256, and
those files, nothing else. A build's manifest is its seal (``manifest.json``, written by
``build_seal.py``): no object files, no log. A model's is written here (``ship-manifest.json``):
its GGUF with the sha256 its seal (``stamp.json``) recorded, and the other files at the top of
its directory (the seal, the logs, the shape record) with theirs; not the intermediates it
may keep. It refuses an artifact with no seal, or whose files differ from it (sha256 read).
It prints the tar's size and sha256.

``receive`` checks TAR's own sha256 against SHA256 (what the control machine read when
it fetched it), then unpacks it into INCOMING_DIR (made new; a dot-directory beside the
artifacts, which no reader takes for one) and checks every file against the manifest it
carries: each file present with its sha256 and each link with its target, and nothing
else in the tar; a model's GGUF also as its seal records it. Only regular files and links
inside the directory are unpacked. Anything else is a refusal: INCOMING_DIR is removed and
it exits 1 naming the file. The caller proves the artifact on this host before it takes it
(``llamarack/ship``).
"""

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile

CHUNK = 1 << 20
MANIFESTS = {"build": "manifest.json", "model": "ship-manifest.json"}
WHAT = {"build": "llama.cpp build", "model": "model"}


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


def checked(src: str, files: list) -> None:
    """Every sealed file of ``src`` as its seal says (sha256 read), else Refused."""
    for e in files:
        rel = e["path"]
        path = os.path.join(src, rel)
        if not safe_name(rel):
            raise Refused(f"{rel!r}: not a path inside the artifact")
        if "link" in e:
            if not os.path.islink(path) or os.readlink(path) != e["link"]:
                raise Refused(f"{rel}: not the link the seal names ({e['link']})")
        elif os.path.islink(path) or not os.path.isfile(path):
            raise Refused(f"{rel}: missing or not a file")
        elif sha256_file(path) != e.get("sha256"):
            raise Refused(f"{rel}: sha256 differs from the seal")


def gguf_seal(model_dir: str) -> dict:
    """What a model's seal (``stamp.json``) records of its GGUF: size and sha256."""
    try:
        with open(os.path.join(model_dir, "stamp.json")) as f:
            gguf = json.load(f)["gguf"]
        return {"size": int(gguf["size"]), "sha256": str(gguf["sha256"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refused(f"{model_dir}/stamp.json: no readable seal ({e})") from None


def model_manifest(model_dir: str) -> list:
    """A model's files to ship: its GGUF as sealed, and the small files beside it, hashed now."""
    files = [{"path": "model.gguf", "sha256": gguf_seal(model_dir)["sha256"]}]
    for name in sorted(os.listdir(model_dir)):
        path = os.path.join(model_dir, name)
        if name != "model.gguf" and ".tmp." not in name and os.path.isfile(path) and not os.path.islink(path):
            files.append({"path": name, "sha256": sha256_file(path)})
    return files


def pack(kind: str, src: str, tar_path: str) -> dict:
    manifest = os.path.join(src, MANIFESTS[kind])
    files = load_manifest(manifest) if kind == "build" else model_manifest(src)
    checked(src, files)
    tmp = tar_path + ".tmp"
    with tarfile.open(tmp, "w") as tar:
        if kind == "build":
            tar.add(manifest, MANIFESTS[kind], recursive=False)
        else:
            data = json.dumps({"files": files}, indent=1, sort_keys=True).encode()
            info = tarfile.TarInfo(MANIFESTS[kind])
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        for e in files:
            tar.add(os.path.join(src, e["path"]), e["path"], recursive=False)
    os.replace(tmp, tar_path)
    return {"bytes": os.path.getsize(tar_path), "sha256": sha256_file(tar_path), "files": len(files)}


def unpack(tar_path: str, dest: str) -> list:
    """The tar's members into ``dest``: regular files and links only, each inside it."""
    names = []
    with tarfile.open(tar_path, "r:") as tar:
        for m in tar:
            if not safe_name(m.name) or not (m.isfile() or m.issym()):
                raise Refused(f"{m.name!r}: not a file or link inside the artifact")
            if m.issym() and (m.linkname.startswith("/") or ".." in m.linkname.split("/")):
                raise Refused(f"{m.name}: links outside the artifact ({m.linkname})")
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


def receive(kind: str, tar_path: str, want_sha256: str, dest: str) -> dict:
    got = sha256_file(tar_path)
    if got != want_sha256:
        raise Refused(f"the tar arrived with sha256 {got}, sent as {want_sha256} (damaged in transit)")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest, mode=0o755)
    names = unpack(tar_path, dest)
    manifest = os.path.join(dest, MANIFESTS[kind])
    files = load_manifest(manifest)
    extra = sorted(set(names) - {MANIFESTS[kind]} - {e["path"] for e in files})
    if extra:
        raise Refused(f"{extra[0]}: in the tar but not in the seal")
    checked(dest, files)
    if kind == "model":
        sealed = gguf_seal(dest)
        gguf = next((e for e in files if e["path"] == "model.gguf"), {})
        size = os.path.getsize(os.path.join(dest, "model.gguf"))
        if gguf.get("sha256") != sealed["sha256"] or size != sealed["size"]:
            raise Refused("model.gguf: not the GGUF its seal (stamp.json) records")
        os.unlink(manifest)  # the model's own seal is stamp.json
    return {"files": len(files)}


def main(argv: list) -> int:
    command, kind, args = argv[1:2], argv[3] if argv[2:3] == ["--kind"] else None, argv[4:]
    if kind not in MANIFESTS or (command, len(args)) not in ((["pack"], 2), (["receive"], 3)):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        if command == ["pack"]:
            out = pack(kind, *args)
        else:
            try:
                out = receive(kind, *args)
            except (Refused, OSError, tarfile.TarError):
                shutil.rmtree(args[2], ignore_errors=True)
                raise
    except (Refused, OSError, tarfile.TarError) as e:
        print(f"{WHAT[kind]} refused: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
