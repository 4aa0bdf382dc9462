# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print, byte for byte, what a file-reading fact's shell command prints: its twin in Python.

    python3 -c SOURCE cat PATH                   cat PATH 2>/dev/null (nothing where it cannot be read)
    python3 -c SOURCE contents PATH              pyinfra's FileContents: the file, else __pyinfra_missing_PATH
    python3 -c SOURCE artifact DIR               ModelArtifact's command (llamarack/facts/model.py)
    python3 -c SOURCE server-flags DIR SPLIT     LlamaServerFlags's command (llamarack/facts/llamacpp.py)
    python3 -c SOURCE builds DIR                 LlamacppBuilds's command (llamarack/facts/llamacpp.py)
    python3 -c SOURCE sha1 PATH                  pyinfra's Sha1File: sha1sum's line, nothing where it cannot read
    python3 -c SOURCE stat PATH                  pyinfra's File, Link, Directory: GNU stat's line (LINUX_STAT)
    python3 -c SOURCE free PATH                  FreeDiskBytes's command (llamarack/facts/system.py), PATH absolute

Read together (``FactsTogether``), a fact whose command only reads files (cat, stat, a
listing, sha1sum) is answered by the python3 the host modules already share: each such
shell section forked a subshell and exec'd ``cat``, ``stat`` or ``sha1sum``, 2 to 3 ms of a
host's CPU apiece in every audit and deploy. Where the host has no python3, the shell
commands run as before. The fact's ``process`` reads either output;
tests/facts/test_reading.py runs both on the same files and compares the bytes.
"""

import os
import stat
import sys


def _cat(path: str) -> bool:
    """``cat PATH 2>/dev/null``: the file's bytes, nothing where it cannot be read (absent,
    a directory, no permission). True where it could."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return False
    sys.stdout.buffer.write(data)
    return True


def contents(path: str) -> None:
    # ( test -e P && cat P ) || echo '__pyinfra_missing_P'
    if not (os.path.exists(path) and _cat(path)):
        sys.stdout.buffer.write(b"__pyinfra_missing_" + os.fsencode(path) + b"\n")


def artifact(directory: str) -> None:
    # if [ -f GGUF ] && [ -f STAMP ]; then stat -c 'size %s %.9Y %i' GGUF; cat STAMP;
    # elif [ -e DIR ]; then echo unsealed; fi
    gguf, stamp = os.path.join(directory, "model.gguf"), os.path.join(directory, "stamp.json")
    if os.path.isfile(gguf) and os.path.isfile(stamp):
        st = os.lstat(gguf)  # stat(1) without -L: the path itself
        seconds, fraction = divmod(st.st_mtime_ns, 10**9)
        sys.stdout.buffer.write(f"size {st.st_size} {seconds}.{fraction:09d} {st.st_ino}\n".encode())
        _cat(stamp)
    elif os.path.exists(directory):
        sys.stdout.buffer.write(b"unsealed\n")


def server_flags(directory: str, split: str) -> None:
    # cat DIR/server-help.txt 2>/dev/null || exit 0; echo SPLIT; cat DIR/build-info.json 2>/dev/null; true
    if _cat(os.path.join(directory, "server-help.txt")):
        sys.stdout.buffer.write(split.encode() + b"\n")
        _cat(os.path.join(directory, "build-info.json"))


def builds(directory: str) -> None:
    # cd DIR 2>/dev/null || exit 0; echo "current $(readlink current 2>/dev/null)"; for d in */; do d=${d%/};
    # [ "$d" = current ] && continue; if [ -f "$d/build-info.json" ]; then echo "verified $d $(stat -c %Y ...)";
    # else echo "partial $d"; fi; done; true
    try:
        names = os.listdir(directory)
    except OSError:
        return
    try:
        current = os.readlink(os.path.join(directory, "current")).rstrip("\n")  # $(...) drops trailing newlines
    except OSError:
        current = ""
    lines = [f"current {current}"]
    for name in sorted(names):  # the shell's */: no dot names, directories and links to them, in byte order
        if name.startswith(".") or name == "current" or not os.path.isdir(os.path.join(directory, name)):
            continue
        info = os.path.join(directory, name, "build-info.json")
        if os.path.isfile(info):
            lines.append(f"verified {name} {os.lstat(info).st_mtime_ns // 10**9}")
        else:
            lines.append(f"partial {name}")
    sys.stdout.buffer.write(os.fsencode("\n".join(lines) + "\n"))


def sha1(path: str) -> None:
    # test -e P && ( sha1sum P 2>/dev/null || shasum P 2>/dev/null || sha1 P 2>/dev/null ) || true
    try:
        from _sha1 import sha1 as new  # CPython's own: OpenSSL's load (hashlib) is 2 ms of a host's CPU
    except ImportError:
        from hashlib import sha1 as new
    try:
        with open(path, "rb") as f:
            digest = new(f.read()).hexdigest()
    except OSError:
        return
    name = os.fsencode(path)
    if b"\\" in name or b"\n" in name:  # sha1sum escapes such a name and marks the line with a backslash
        name = name.replace(b"\\", b"\\\\").replace(b"\n", b"\\n")
        digest = "\\" + digest
    sys.stdout.buffer.write(digest.encode() + b"  " + name + b"\n")


# pyinfra's LINUX_STAT_COMMAND format (pyinfra/facts/files.py)
LINUX_STAT = "user=%U group=%G mode=%A atime=%X mtime=%Y ctime=%Z size=%s %N"


def _plain(name: str) -> bool:
    """Whether GNU stat's %N prints ``name`` as 'name' in every locale: printable ASCII with
    no quote or backslash (its shell-escape quoting changes anything else)."""
    return all(" " <= c <= "~" and c not in "'\\" for c in name)


def stat_line(path: str) -> None:
    # ! (test -e P || test -L P) || ( stat -c 'LINUX_STAT' P 2> /dev/null || ... )
    try:
        st = os.lstat(path)
        target = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
    except OSError:
        return
    if os.environ.get("QUOTING_STYLE") or not _plain(path) or not _plain(target or ""):
        import subprocess  # a name stat quotes its own way: stat itself says it

        r = subprocess.run(["stat", "-c", LINUX_STAT, path], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        sys.stdout.buffer.write(r.stdout)
        return
    import grp
    import pwd

    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = "UNKNOWN"
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = "UNKNOWN"
    name = f"'{path}'" + (f" -> '{target}'" if target is not None else "")
    line = (f"user={user} group={group} mode={stat.filemode(st.st_mode)} atime={st.st_atime_ns // 10**9} "
            f"mtime={st.st_mtime_ns // 10**9} ctime={st.st_ctime_ns // 10**9} size={st.st_size} {name}\n")
    sys.stdout.buffer.write(line.encode())


def free(path: str) -> None:
    # p=P; while [ ! -e "$p" ]; do p=$(dirname "$p") || break; done; stat -f -c "%a %S" "$p"
    while not os.path.exists(path):
        path = os.path.dirname(path.rstrip("/")) or "/"  # dirname(1) of an absolute path
    st = os.statvfs(path)
    sys.stdout.buffer.write(f"{st.f_bavail} {st.f_frsize}\n".encode())


READS = {"cat": _cat, "contents": contents, "artifact": artifact, "server-flags": server_flags, "builds": builds,
         "sha1": sha1, "stat": stat_line, "free": free}

if __name__ == "__main__":
    READS[sys.argv[1]](*sys.argv[2:])
    sys.stdout.flush()
