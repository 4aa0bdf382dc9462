"""Fault injection on lab hosts: what a failed deploy may and may not do.

Used by ``bench/reliability.py`` (every fault, one rack session) and
``tests/lab/test_faults.py`` (the few CI guards). Three things must hold
for each fault:

1. the deployment that served before keeps serving during and after the
   failed run (a ``Poller`` asks its ``/health``, bounded requests to the
   lab host's address only, through the whole run);
2. a re-run converges (it succeeds, and the run after it changes nothing);
3. no file outside the staging areas changed (``snapshot`` before and
   after, ``changed_outside_staging``).

The staging areas, from ``llamarack/layout.py``: ``<root>/models/.staging/``
(a model being made), a ``<root>/builds/<stamp>/`` that is neither current
nor holds ``build-info.json`` (a build that never counted), the llama.cpp
checkout ``<root>/src/llama.cpp/`` (the build's input; the served build is
a copy under ``builds/``), the unit's ``.new`` (staged before a switch), and
the blob cache ``<root>/cache/`` (verified downloads by content hash: a fetch
cut off keeps what it verified, and nothing served reads the cache).
Everything else under the root, the unit, its ``.prev`` and
``/etc/llamarack`` is the running deployment.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from llamarack.layout import CONFIG_DIR, UNIT_PATH, Layout

from .pytest_plugin import parse_pyinfra_totals, pyinfra_command

ROOT = "/opt/llamarack"
SMALL = 1 << 20  # files up to this size are hashed; bigger ones compared by size and mtime

_SNAPSHOT = r"""
import hashlib, json, os, sys
small, unhashed, tops = int(sys.argv[1]), tuple(sys.argv[2].split(":")), sys.argv[3:]
out = {}
def one(p):
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if os.path.islink(p):
        out[p] = ["link", os.readlink(p)]
    elif os.path.isfile(p):
        digest = None
        if st.st_size <= small and not p.startswith(unhashed):
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        out[p] = ["file", st.st_size, st.st_mtime_ns, digest]
for top in tops:
    if os.path.isdir(top) and not os.path.islink(top):
        for d, dirs, files in os.walk(top):
            for n in dirs + files:
                if os.path.islink(os.path.join(d, n)) or n in files:
                    one(os.path.join(d, n))
    else:
        one(top)
json.dump(out, sys.stdout)
"""


def snapshot(rack, host: str, root: str = ROOT) -> dict:
    """Every file and link of the deployment: path -> [kind, size, mtime_ns, sha256 of small files]."""
    tops = [root, UNIT_PATH, UNIT_PATH + ".prev", UNIT_PATH + ".new", CONFIG_DIR]
    # The envs and the checkout hold tens of thousands of files: size and mtime say enough.
    unhashed = ":".join(f"{p}/" for p in (Layout(root).envs, Layout(root).src))
    cmd = "python3 - " + " ".join([str(SMALL), unhashed, *tops])
    r = rack.ssh(host, cmd, input=_SNAPSHOT.encode(), timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"snapshot of {host} failed: {r.stderr[-2000:]}")
    return json.loads(r.stdout)


def in_staging(path: str, after: dict, root: str = ROOT) -> bool:
    """True for a path in one of the staging areas (this module's docstring)."""
    layout = Layout(root)
    if any(path.startswith(area + "/") for area in (layout.staging, layout.src, layout.cache)):
        return True
    if path == UNIT_PATH + ".new":
        return True
    if path.startswith(layout.builds + "/"):
        stamp = path[len(layout.builds) + 1:].split("/", 1)[0]
        current = (after.get(layout.current_build) or [None, None])[1]
        return stamp not in ("current", current) and f"{layout.build(stamp)}/build-info.json" not in after
    return False


def changed_outside_staging(before: dict, after: dict, root: str = ROOT) -> list[str]:
    """Paths added, removed or changed between two snapshots, outside the staging areas."""
    paths = set(before) | set(after)
    return sorted(p for p in paths if before.get(p) != after.get(p) and not in_staging(p, after, root))


# --- serving --------------------------------------------------------------------------


def health(ip: str, port: int = 8080, timeout: float = 2.0) -> int:
    """HTTP status of the host's /health, 0 when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{ip}:{port}/health", timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def completion(ip: str, port: int = 8080, tokens: int = 2, timeout: float = 20.0) -> bool:
    """Whether the host's /completion answers with ``tokens`` tokens."""
    body = json.dumps({"prompt": "hello", "n_predict": tokens}).encode()
    try:
        req = urllib.request.Request(f"http://{ip}:{port}/completion", data=body,
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read()).get("tokens_predicted") == tokens
    except (OSError, ValueError):
        return False


# The poller's loop, run as its own process: the tests' process may have gevent's
# monkey-patching (pyinfra's CLI imported), where a thread is a greenlet.
_POLL = r"""
import sys, time, urllib.request, urllib.error
url, interval, timeout = f"http://{sys.argv[1]}:{sys.argv[2]}/health", float(sys.argv[3]), float(sys.argv[4])
start = time.monotonic()
while True:
    t = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    except OSError:
        status = 0
    print(f"{t - start:.2f} {status}", flush=True)
    time.sleep(max(0.0, interval - (time.monotonic() - t)))
"""


class Poller:
    """Asks ``/health`` of one lab host every ``interval`` s (each request bounded by
    ``timeout``) from ``start()`` to ``stop()``; records every answer that was not 200."""

    def __init__(self, ip: str, interval: float = 0.25, timeout: float = 2.0, port: int = 8080):
        self.ip, self.port, self.interval, self.timeout = ip, port, interval, timeout
        self.requests = 0
        self.failures: list[tuple[float, int]] = []  # (seconds since start, status; 0: no answer)

    def start(self) -> "Poller":
        import sys
        import tempfile

        self._log = tempfile.TemporaryFile()
        self._proc = subprocess.Popen([sys.executable, "-c", _POLL, self.ip, str(self.port), str(self.interval),
                                       str(self.timeout)], stdout=self._log)  # fmt: skip
        return self

    def stop(self) -> dict:
        self._proc.terminate()
        self._proc.wait()
        self._log.seek(0)
        self.samples = [(float(t), int(status)) for t, status in
                        (line.split() for line in self._log.read().decode().splitlines())]  # fmt: skip
        self._log.close()
        self.requests = len(self.samples)
        self.failures = [(t, status) for t, status in self.samples if status != 200]
        return self.summary()

    def summary(self) -> dict:
        """Requests, failures, and the longest outage: for each run of failed requests,
        from the last answer before it to the first after it (an upper bound; the
        lower one is the run's own span)."""
        samples = getattr(self, "samples", None) or sorted(self.failures)
        longest, i = 0.0, 0
        while i < len(samples):
            if samples[i][1] == 200:
                i += 1
                continue
            j = i
            while j < len(samples) and samples[j][1] != 200:
                j += 1
            before = samples[i - 1][0] if i > 0 else samples[i][0]
            after = samples[j][0] if j < len(samples) else samples[j - 1][0] + self.interval
            longest = max(longest, after - before)
            i = j
        return {"requests": self.requests, "failures": len(self.failures),
                "longest_outage_s": round(longest, 2), "first_failures": self.failures[:5]}  # fmt: skip


# --- deploys --------------------------------------------------------------------------


@dataclass
class Deploy:
    """``pyinfra -y INVENTORY deploy.py --limit H... --data K=V...`` run in the background."""

    inventory: Path
    deploy_file: Path
    hosts: list
    data: list = field(default_factory=list)
    extra: list = field(default_factory=list)
    log: Path | None = None

    def argv(self) -> list:
        args = [*pyinfra_command(), "-y", str(self.inventory), str(self.deploy_file), *self.extra]
        for h in self.hosts:
            args += ["--limit", h]
        for d in self.data:
            args += ["--data", d]
        return args

    def start(self) -> "Deploy":
        self.started = time.monotonic()
        self._out = open(self.log, "w") if self.log else subprocess.PIPE
        self.proc = subprocess.Popen(self.argv(), stdout=self._out, stderr=subprocess.STDOUT, text=True,
                                     cwd=self.deploy_file.parent)  # fmt: skip
        return self

    def wait(self, timeout: float = 900) -> tuple[int, str, float]:
        """(returncode, output, seconds)."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        seconds = round(time.monotonic() - self.started, 1)
        if self.log:
            self._out.close()
            out = self.log.read_text(errors="replace")
        return self.proc.returncode, out or "", seconds

    def kill(self) -> None:
        """SIGKILL pyinfra (its SSH connections drop with it)."""
        self.proc.send_signal(signal.SIGKILL)


def run(inventory: Path, deploy_file: Path, hosts: list, data: list = (), timeout: float = 1800):
    """A deploy to its end: (returncode, output, seconds)."""
    return Deploy(inventory, deploy_file, list(hosts), list(data)).start().wait(timeout)


def changes(output: str) -> int:
    """Operations that changed something, from pyinfra's grand total (-1 if it has none)."""
    try:
        return parse_pyinfra_totals(output)["success"]
    except AssertionError:
        return -1


# --- injecting -------------------------------------------------------------------------


def wait_on_host(rack, host: str, test: str, timeout: float = 600) -> bool:
    """Block until the shell ``test`` holds on the host (checked every 20 ms)."""
    r = rack.ssh(host, f"timeout {int(timeout)} sh -c {shlex.quote(f'until {test}; do sleep 0.02; done')}",
                 timeout=timeout + 30)  # fmt: skip
    return r.returncode == 0


def staged(step: str, root: str = ROOT) -> str:
    """The test that a model step's log (fetch, convert, quantize) exists in the staging."""
    return f"ls {root}/models/.staging/*/{step}.log >/dev/null 2>&1"


# Kills every SSH session's process on a host (not the listener) but the one that runs it
# ($PPID: its own sshd), then prints how many it killed (``killed=N``).
CUT_SSH = ("s=$(pgrep -f '^sshd: [a-z]+@' | grep -vx \"$PPID\" | tr '\\n' ' '); "
           "[ -z \"$s\" ] || kill -KILL $s; echo killed=$(echo $s | wc -w)")


def cut_ssh(rack, host: str, first: str = "") -> str:
    """Kill every other SSH session on the host: the connection drops mid-command. Runs the
    shell ``first`` before, in the same session; what both printed (``killed=N`` last)."""
    return rack.ssh(host, f"{first}{'; ' if first else ''}{CUT_SSH}", timeout=30).stdout


def reject_ssh(rack, host: str, on: bool) -> None:
    """Refuse (on) or allow again (off) new SSH connections to a host, in its own network
    namespace; its served port stays reachable."""
    ns = rack.host(host)["netns"]
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "REJECT", "--reject-with", "tcp-reset"]
    subprocess.run(["ip", "netns", "exec", ns, "iptables", "-I" if on else "-D", *rule], check=on)


def ssh_rule_listing(rack, host: str) -> str:
    """``iptables -L INPUT -v -n -x`` in the host's network namespace: the refusing rule's
    counters (packets it turned away), while it is in place."""
    ns = rack.host(host)["netns"]
    r = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-L", "INPUT", "-v", "-n", "-x"],
                       capture_output=True, text=True)  # fmt: skip
    return r.stdout


def drop_blob_cache(rack, host: str, root: str = ROOT) -> None:
    """Remove the blob cache (a staging area): the next fetch downloads every file."""
    rack.ssh(host, f"rm -rf -- {shlex.quote(Layout(root).blob_cache)}")


def prune_models(rack, host: str, root: str = ROOT) -> None:
    """Remove every model artifact but the served one and the staging: the next model
    change then has all its work to do."""
    models = Layout(root).models
    rack.ssh(host, f"cd {shlex.quote(models)} && cur=$(readlink current) && for d in */; do d=${{d%/}}; "
                   f"[ \"$d\" = current ] || [ \"$d\" = \"$cur\" ] || rm -rf -- \"$d\"; done; "
                   f"rm -rf .staging/* .staging/.[!.]* 2>/dev/null; true")  # fmt: skip

