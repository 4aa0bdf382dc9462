"""The served unit's sandbox on a GPU machine without systemd.

The GPU machine has no systemd, so the unit's restrictions
(roles/server/templates/llama-server.service.j2) are applied to llama-server
the way systemd applies them, by hand, and the server must still load a
model onto the card and answer:

    User=                   setgroups/setgid/setuid to an unprivileged user
    CapabilityBoundingSet=  every capability dropped from the bounding set
    NoNewPrivileges=yes     prctl(PR_SET_NO_NEW_PRIVS)
    ProtectSystem=strict    a mount namespace where every mount is read-only
                            but /dev, /proc and /sys
    ProtectHome=yes         /home, /root and /run/user hidden (empty tmpfs)
    PrivateTmp=yes          a new tmpfs on /tmp and /var/tmp
    CacheDirectory=         one writable tmpfs, CUDA_CACHE_PATH pointing there
    SystemCallFilter=@system-service ~@privileged, SystemCallErrorNumber=EPERM,
    SystemCallArchitectures=native, RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX
                            one seccomp filter: the x86-64 numbers of the calls
                            bookworm's systemd 252 puts in those groups
                            (``--make-list``, run where systemd-analyze is),
                            socket() only for those three families
                            (EAFNOSUPPORT, as systemd answers), EPERM otherwise

and, to decide whether the unit could have it (it is left out today):

    MemoryDenyWriteExecute  prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN), where the
                            kernel has it (6.3 and later)

Not reproduced: DevicePolicy/DeviceAllow (a cgroup device filter; the card is
reached through /dev/nvidia*, which the policy allows by major number), the
Protect{Kernel*,ControlGroups,Clock,Hostname,Proc} mounts, RestrictNamespaces,
LockPersonality, RemoveIPC and UMask.

    python3 bench/gpu/sandbox.py --make-list            (here: writes SYSCALLS)
    python3 bench/gpu/sandbox.py run [--mdwe] -- CMD...  (as root: CMD sandboxed)
    python3 bench/gpu/sandbox.py probe                   (what a sandboxed process may do)
    python3 bench/gpu/sandbox.py serve --bin DIR --model GGUF --out DIR --repo DIR [--built TEXT]
                                                         (llama-server on the GPU: plain,
                                                         sandboxed, sandboxed + MDWE)

``bench/gpu/sandbox.sh`` runs the last on the GPU machine (from a copy of this script that
a sandboxed user can read): OUT/gpu-sandbox.json, stamped by the checkout's
``bench/provenance.py`` (``--repo``), ``--built`` saying how the server was built.
"""

from __future__ import annotations

import argparse
import socket
import time
import urllib.request
import ctypes
import json
import os
import pwd
import re
import struct
import subprocess
import sys
from pathlib import Path

SYSCALLS = Path(__file__).resolve().parent / "sandbox-syscalls.json"
WHAT = ("the served unit's sandbox applied by hand (bench/gpu/sandbox.py) to a CUDA llama-server on the GPU machine "
        "(no systemd): plain, sandboxed, sandboxed + MemoryDenyWriteExecute")  # fmt: skip
NOT_REPRODUCED = ("DevicePolicy/DeviceAllow (cgroup device filter), ProtectKernel*/ControlGroups/Clock/Hostname/Proc, "
                  "RestrictNamespaces, LockPersonality, RemoveIPC, UMask")  # fmt: skip
RAN_WITH = ("bench/gpu/sandbox.sh", "bench/gpu/sandbox-syscalls.json")


def stamped(results: dict, repo: Path) -> dict:
    """The result with its stamp, by the checkout's bench/provenance.py (this script may run
    from a copy outside it)."""
    sys.path.insert(0, str(repo / "bench"))
    import provenance

    return {**results, "provenance": provenance.stamp(repo / "bench/gpu/sandbox.py", extra=RAN_WITH, root=repo)}
CACHE_DIR = "/var/cache/llamarack-server"

PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_MDWE = 22, 24, 38, 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
SECCOMP_MODE_FILTER = 2
CLONE_NEWNS = 0x00020000
AUDIT_ARCH_X86_64 = 0xC000003E
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
EPERM, EAFNOSUPPORT = 1, 97
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10


def systemd_group(group: str, seen: set) -> set:
    """The system call names of a systemd filter group, nested groups expanded."""
    out = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    names = set()
    for line in out.splitlines()[1:]:
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        if word.startswith("@"):
            if word not in seen:
                seen.add(word)
                names |= systemd_group(word, seen)
        else:
            names.add(word)
    return names


def make_list() -> dict:
    """The unit's filter as x86-64 numbers, from this machine's systemd and kernel headers."""
    numbers = {}
    for line in Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h").read_text().splitlines():
        m = re.match(r"#define __NR_(\w+) (\d+)$", line)
        if m:
            numbers[m.group(1)] = int(m.group(2))
    allowed = systemd_group("@system-service", set()) - systemd_group("@privileged", set())
    version = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return {"source": f"{version}: @system-service minus @privileged, x86-64 numbers of "
                      "/usr/include/x86_64-linux-gnu/asm/unistd_64.h",
            "allowed": {n: numbers[n] for n in sorted(allowed) if n in numbers}}  # fmt: skip


def seccomp_program(allowed: dict) -> bytes:
    """A classic BPF program: native arch only; socket() for three families; the list; else EPERM."""
    ins = []

    def op(code, jt, jf, k):
        ins.append(struct.pack("HBBI", code, jt, jf, k))

    op(LD_W_ABS, 0, 0, 4)  # seccomp_data.arch
    op(JEQ_K, 1, 0, AUDIT_ARCH_X86_64)
    op(RET_K, 0, 0, RET_ERRNO | EPERM)
    op(LD_W_ABS, 0, 0, 0)  # seccomp_data.nr
    op(JGE_K, 0, 1, 0x40000000)  # the x32 ABI is another architecture
    op(RET_K, 0, 0, RET_ERRNO | EPERM)
    socket_nr = allowed.get("socket")
    if socket_nr is not None:
        op(JEQ_K, 0, 6, socket_nr)
        op(LD_W_ABS, 0, 0, 16)  # args[0], low half: the family
        op(JEQ_K, 3, 0, AF_UNIX)
        op(JEQ_K, 2, 0, AF_INET)
        op(JEQ_K, 1, 0, AF_INET6)
        op(RET_K, 0, 0, RET_ERRNO | EAFNOSUPPORT)
        op(RET_K, 0, 0, RET_ALLOW)
    for nr in sorted(set(allowed.values())):
        op(JEQ_K, 0, 1, nr)
        op(RET_K, 0, 0, RET_ALLOW)
    op(RET_K, 0, 0, RET_ERRNO | EPERM)
    return b"".join(ins)


def prctl(libc, option: int, *args) -> None:
    full = list(args) + [0] * (4 - len(args))
    if libc.prctl(option, *[ctypes.c_ulong(a) for a in full]) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed: {os.strerror(ctypes.get_errno())}")


def protect_mounts(libc, user) -> None:
    """ProtectSystem=strict, ProtectHome, PrivateTmp and the cache directory, in a new mount namespace."""
    if libc.unshare(CLONE_NEWNS) != 0:  # os.unshare is Python 3.12's
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    keep_writable = ("/dev", "/proc", "/sys")
    for mp in sorted(set(points), key=len):
        mp = mp.replace("\\040", " ")
        if any(mp == w or mp.startswith(w + "/") for w in keep_writable):
            continue
        subprocess.run(["mount", "--bind", mp, mp], check=False)
        subprocess.run(["mount", "-o", "remount,bind,ro", mp], check=False)
    for hidden in ("/home", "/root", "/run/user"):
        if os.path.isdir(hidden):
            subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,mode=0755", "tmpfs", hidden], check=True)
    for tmp in ("/tmp", "/var/tmp"):
        if os.path.isdir(tmp):
            subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", tmp], check=True)
    if os.path.isdir(CACHE_DIR):
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"mode=0700,uid={user.pw_uid},gid={user.pw_gid}", "tmpfs",
                        CACHE_DIR], check=True)  # fmt: skip


def sandboxed_exec(argv: list, user_name: str, mdwe: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    user = pwd.getpwnam(user_name)
    protect_mounts(libc, user)
    for cap in range(64):  # CapabilityBoundingSet= (past the last capability prctl says EINVAL)
        if libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) != 0:
            break
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)  # from root to a user: the permitted and effective sets are emptied
    os.umask(0o077)
    prctl(libc, PR_SET_NO_NEW_PRIVS, 1)
    if mdwe:
        prctl(libc, PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN)
    prog = seccomp_program(json.loads(SYSCALLS.read_text())["allowed"])
    buf = ctypes.create_string_buffer(prog)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "CUDA_CACHE_PATH": CACHE_DIR,
           "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}  # fmt: skip
    os.execve(argv[0], argv, env)


def probe() -> dict:
    """What this process may do: run inside the sandbox, each answer should be a refusal."""
    r = {}
    try:
        open("/usr/llamarack-sandbox-probe", "w").close()
        r["write_usr"] = "allowed"
    except OSError as e:
        r["write_usr"] = e.strerror
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()
        r["socket_netlink"] = "allowed"
    except OSError as e:
        r["socket_netlink"] = e.strerror
    socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    r["socket_inet"] = "allowed"
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)
    r["mount"] = "allowed" if rc == 0 else os.strerror(ctypes.get_errno())
    r["root_listing"] = os.listdir("/root") if os.path.isdir("/root") else None
    with open("/tmp/llamarack-sandbox-probe", "w") as f:
        f.write("x")
    r["write_tmp"] = "allowed"
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    r.update({k: status[k].strip() for k in ("Uid", "NoNewPrivs", "Seccomp", "CapBnd", "CapEff")})
    return r


def serve(bin_dir: str, model: str, out: Path) -> dict:
    """llama-server with every layer on the card, plain, sandboxed, sandboxed + MDWE: does it load,
    answer /completion, and hold memory on the card?"""
    me = str(Path(__file__).resolve())
    results = {"probe": json.loads(subprocess.run([sys.executable, me, "run", "--", sys.executable, me, "probe"],
                                                  capture_output=True, text=True).stdout or "{}")}  # fmt: skip
    server = [f"{bin_dir}/llama-server", "--model", model, "--host", "127.0.0.1", "--ctx-size", "2048",
              "--parallel", "1", "--n-gpu-layers", "99", "--flash-attn", "off", "--load-mode", "none"]  # fmt: skip
    variants = {"plain": [], "sandbox": [sys.executable, me, "run", "--"],
                "sandbox_mdwe": [sys.executable, me, "run", "--mdwe", "--"]}  # fmt: skip
    for i, (name, wrap) in enumerate(variants.items()):
        port = 18300 + i
        log = out / f"sandbox-{name}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(wrap + server + ["--port", str(port)], stdout=f, stderr=subprocess.STDOUT)
        row = {"command": wrap + server + ["--port", str(port)]}
        url = f"http://127.0.0.1:{port}"
        start = time.time()
        while time.time() - start < 120 and proc.poll() is None:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        row["health_after_s"] = round(time.time() - start, 1)
                        break
            except Exception:
                time.sleep(0.3)
        if "health_after_s" in row:
            req = urllib.request.Request(url + "/completion", data=json.dumps({"prompt": "hello", "n_predict": 16,
                                         "ignore_eos": True}).encode(), headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=60) as resp:
                row["predicted_n"] = json.loads(resp.read())["timings"]["predicted_n"]
            apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                                  capture_output=True, text=True).stdout  # fmt: skip
            row["gpu_mib"] = next((int(b) for a, b in (line.split(", ") for line in apps.splitlines() if ", " in line)
                                   if int(a) == proc.pid), None)  # fmt: skip
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        text = log.read_text(errors="replace")
        row["exit"] = proc.returncode
        row["log_lines"] = [line for line in text.splitlines() if re.search(
            r"CUDA0 (model|KV|compute) buffer|offloaded|error|failed|denied|not permitted|MDWE|prctl", line, re.I)][:20]
        row["ok"] = row.get("predicted_n") == 16 and bool(row.get("gpu_mib"))
        results[name] = row
    return results


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--make-list", action="store_true", help=f"write {SYSCALLS.name} from this machine's systemd")
    sub = ap.add_subparsers(dest="what")
    run = sub.add_parser("run", help="run a command inside the sandbox (as root)")
    run.add_argument("--user", default="nobody")
    run.add_argument("--mdwe", action="store_true", help="also MemoryDenyWriteExecute")
    run.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("probe", help="print what this process may do (run it inside the sandbox)")
    srv = sub.add_parser("serve", help="llama-server on the GPU: plain, sandboxed, sandboxed + MDWE")
    srv.add_argument("--bin", required=True)
    srv.add_argument("--model", required=True)
    srv.add_argument("--out", type=Path, required=True)
    srv.add_argument("--repo", type=Path, required=True, help="the checkout this script comes from")
    srv.add_argument("--built", help="how the llama-server was built (recorded)")
    a = ap.parse_args(argv)
    if a.make_list:
        SYSCALLS.write_text(json.dumps(make_list(), indent=1) + "\n")
        return
    if a.what == "run":
        cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
        sandboxed_exec(cmd, a.user, a.mdwe)
    if a.what == "probe":
        print(json.dumps(probe()))
        return
    if a.what == "serve":
        results = {"what": WHAT, "built": a.built, "not_reproduced": NOT_REPRODUCED, **serve(a.bin, a.model, a.out)}
        results = stamped(results, a.repo.resolve())
        (a.out / "gpu-sandbox.json").write_text(json.dumps(results, indent=1) + "\n")
        print(json.dumps({k: v.get("ok", v) if isinstance(v, dict) else v for k, v in results.items()}))
        return
    ap.print_help()
    sys.exit(2)


if __name__ == "__main__":
    main()
