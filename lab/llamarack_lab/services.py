"""The lab's stand-ins for the outside sources a real rack reaches.

Lab hosts cannot reach GitHub, PyPI, Hugging Face or conda channels (only
apt), so the lab serves local copies of real artifacts from the machine at
the bridge address, and the lab inventory points the settings there:

    http://10.77.0.1:8470/llama.cpp.git   llama.cpp, from the PyPI sdist (mirror.py)
    http://10.77.0.1:8470/pypi/simple     PEP 503 index of every wheel the python env
                                          and converter env roles install (wheels.py)
    http://10.77.0.1:8470/nvidia          flat apt repository of the fake NVIDIA driver
                                          (fake_nvidia/deb.py; the GPU hosts' apt source)
    http://10.77.0.1:8471                 Hugging Face-compatible hub serving the tiny
                                          model as lab/tiny-llama (hub_server.py, tiny_model.py)

The file server is a detached ``python3 -m http.server`` (git's "dumb" HTTP
protocol and a static package index need nothing more); the hub a detached
``hub_server.py``. Their PIDs are recorded (rack.json) so ``lab down``
stops them.

What is served is derived from the lab's own settings (``LAB_GROUP_DATA``):
the wheels are those of the AWQ env's plan and of the converter env's plan
(the pinned llama.cpp tree's requirements file, read from the mirror, with
the lab's overrides), downloaded with the machine's pip configuration for
this machine's Python, which must be the hosts' (Debian 12: 3.11). Slow
inputs are cached under ``/var/cache/llamarack`` by their inputs: a second
``lab up`` prepares in well under a second.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import hub_server, mirror, paths, tiny_model, wheels
from .fake_nvidia import deb
from .util import LabError, progress

SERVICES_PORT = 8470
HUB_PORT = 8471
HUB_REPO = "lab/tiny-llama"
PYPI_PATH = "pypi/simple"
DRIVER_REPO_PATH = "nvidia"
# bookworm's python3.11: the converter file's markers are evaluated for it.
HOST_PYTHON = "3.11.2"


def srv_dir() -> Path:
    return paths.cache_dir() / "srv"


def sources_dir() -> Path:
    return paths.cache_dir().parent / "sources"


def cache_root() -> Path:
    """Where wheelhouses, venvs and the tiny model are cached (shared with the tests)."""
    return paths.cache_dir().parent


def prepare() -> mirror.Mirror:
    """Make the llama.cpp mirror the file server serves (cached across racks)."""
    if not (srv_dir() / "llama.cpp.git" / "info" / "llamarack-base").exists():
        progress("making the llama.cpp mirror (first time about 1 min)")
    return mirror.ensure_mirror(sources_dir(), srv_dir())


# --- the package index -----------------------------------------------------------

def lab_settings():
    from roles.settings import load_settings

    from . import LAB_GROUP_DATA

    return load_settings("lab", LAB_GROUP_DATA)


def converter_lines(m: mirror.Mirror, commit: str | None = None) -> tuple:
    """The converter's requirement lines at ``commit`` of the mirror, flattened like the host does."""
    import roles  # noqa: F401 (the roles' host modules, found by name)
    from llamarack import remote

    commit = commit or m.commit
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(m.bare), "archive", commit, "requirements"],
                                 capture_output=True, check=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        out = subprocess.run(
            [sys.executable, str(remote.path("requirements_flatten")),
             str(Path(tmp) / "requirements" / "requirements-convert_hf_to_gguf.txt")],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    return tuple(line.strip() for line in out.splitlines() if line.strip())


def requirement_sets(m: mirror.Mirror) -> list[tuple[tuple, tuple, bool]]:
    """(requirements, constraints, no_deps) of every pip step the lab's python roles run."""
    from roles.python_env.plan import awq_plan, converter_plan

    settings = lab_settings()
    if settings.python_env.python_version != f"{sys.version_info[0]}.{sys.version_info[1]}":
        raise LabError(
            f"the lab hosts' Python is {settings.python_env.python_version} but this machine's "
            f"is {sys.version_info[0]}.{sys.version_info[1]}: pip download would fetch wheels "
            "the hosts cannot install; run llamarack with python"
            f"{settings.python_env.python_version}"
        )
    plans = [
        awq_plan(settings, "/env"),
        converter_plan(settings, "/env", converter_lines(m, settings.llamacpp.commit), HOST_PYTHON),
    ]
    sets = []
    for plan in plans:
        follow = tuple(r for step in plan.steps if not step.no_deps for r in step.requirements)
        sets.append((follow, tuple(plan.constraints), False))
        sets += [(tuple(step.requirements), (), True) for step in plan.steps if step.no_deps]
    return sets


def prepare_index(m: mirror.Mirror) -> Path:
    """Download (once) the wheels of every set and write the static index; return its simple/ dir."""
    houses = [wheels.wheelhouse(reqs, cons, no_deps, cache=cache_root(), log=progress)
              for reqs, cons, no_deps in requirement_sets(m)]  # fmt: skip
    return wheels.write_index(houses, srv_dir() / "pypi")


# --- the hub -------------------------------------------------------------------------

def prepare_hub() -> Path:
    """The tiny model (built once, about 1 min; the first time also its tools' venv)."""
    cache = cache_root()
    if not tiny_model.is_built(cache):
        progress("building the tiny model for the lab hub (first time 1-3 min)")
    model = tiny_model.tiny_model(cache, log=progress)
    revision = hub_server.Repo.scan(HUB_REPO, model).sha
    if revision != tiny_model.TINY_MODEL_REVISION:
        # The lab inventory pins TINY_MODEL_REVISION: a different sha means other bytes.
        raise LabError(f"tiny model {model}: hub revision {revision}, expected "
                       f"{tiny_model.TINY_MODEL_REVISION} (tiny_model.py says what it depends on)")  # fmt: skip
    return model


# --- processes -----------------------------------------------------------------------

def _spawn(argv: list, log_name: str, bind: str, port: int, what: str) -> int:
    log = open(paths.state_dir() / log_name, "ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((bind, port), timeout=0.5):
                return proc.pid
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited: see {log.name}")
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{what} did not answer on {bind}:{port}")


def start(bind: str) -> int:
    """Start the file server on ``bind``:SERVICES_PORT; return its PID once it answers."""
    return _spawn([sys.executable, "-m", "http.server", "--bind", bind, "--directory",
                   str(srv_dir()), str(SERVICES_PORT)],
                  "services.log", bind, SERVICES_PORT, "lab file server")  # fmt: skip


def start_hub(bind: str, model: Path) -> int:
    """Start the hub on ``bind``:HUB_PORT serving ``model`` as HUB_REPO; return its PID."""
    return _spawn([sys.executable, hub_server.__file__, "--bind", bind, "--port", str(HUB_PORT),
                   f"{HUB_REPO}={model}"],
                  "hub.log", bind, HUB_PORT, "lab hub")  # fmt: skip


def stop(pid: int, timeout: float = 5) -> None:
    """SIGTERM ``pid`` and wait for it to go (SIGKILL after ``timeout``); reap it if it is our child."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not ours (`lab down` in another process): poll
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        if time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + timeout
        time.sleep(0.05)


def start_all(bind: str) -> dict:
    """Prepare every source (cached) and start the file server and the hub on ``bind``.

    Returns the record for rack.json (``stop_all`` takes it); on failure
    stops what it started and raises.
    """
    started = time.monotonic()
    m = prepare()
    prepare_index(m)
    deb.write_repo(srv_dir() / DRIVER_REPO_PATH)
    model = prepare_hub()
    record = {"pid": start(bind), "port": SERVICES_PORT}
    try:
        record["hub"] = {"pid": start_hub(bind, model), "port": HUB_PORT, "repo": HUB_REPO,
                         "revision": tiny_model.TINY_MODEL_REVISION}  # fmt: skip
    except BaseException:
        stop(record["pid"])
        raise
    progress(f"serving llama.cpp, pypi and the driver's apt repository on {bind}:{SERVICES_PORT}, {HUB_REPO} on "
             f"{bind}:{HUB_PORT} (prepared in {time.monotonic() - started:.1f} s)")
    return record


def stop_all(record: dict) -> None:
    """Stop (and reap) what ``start_all`` started; takes a record of an older ``lab up`` too."""
    hub = record.get("hub")
    if hub and hub.get("pid"):
        stop(hub["pid"])
    if record.get("pid"):
        stop(record["pid"])


def url(bind: str, path: str) -> str:
    return f"http://{bind}:{SERVICES_PORT}/{path}"


def index_url(bind: str) -> str:
    return url(bind, PYPI_PATH)


def hub_url(bind: str) -> str:
    return f"http://{bind}:{HUB_PORT}"
