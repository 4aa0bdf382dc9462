"""GPU proof with real-size models: served speed against llama-bench and
the bandwidth limit, and the memory plan against what the GPU allocates.

Runs on the GPU machine (an H100 or H200, CUDA 13, no systemd, no network) from
a copy of the repo carrying .whl and .carry (``bench/gpu/proof_prepare.sh``
makes them), through ``bench/gpu/proof.sh``; writes ``$OUT/gpu-proof.json``
(copied to ``bench/results/gpu-proof.json``).

Phases, in order; each records its results and is skipped by a later command on
the same machine once done (state under ``--work``), so commands of at most
600 seconds each (the machine's limit) can share the work:

    machine    GPU, driver, toolkit, CPU (every figure is recorded against these)
    build      the llama.cpp role through pyinfra @local (bench/gpu/build_deploy.py)
    model8b    an 8B Llama-3-shaped random checkpoint (generated while the build
               runs), through the model role @local: the lab's hub server on
               localhost serves it, the role fetches, converts, quantizes to Q4_K_M.
               Where the machine has no systemd, the role's steps run through
               tests/support/fake_systemd_run.py (no sandbox, no user change), and the
               phase says so (``systemd_run``). Where the role fails, the phase is not
               ok; the model is then made by a fallback (random_model.py's f16 GGUF and
               llama-quantize) so the later phases still run, and the summary says
               which route made it (``model_8b``)
    roofline   device-to-device copy bandwidth (torch), bytes read + written
    bench8b    llama-bench pp512/tg128 with the served flags, and variants
    serve8b    llama-server with the unit's exact ExecStart (the server role's
               planner.plan + server_args + render_unit): /completion decode,
               single-request pp512, aggregate prefill over server_parallel slots
    pinning    served decode under taskset (one CPU, two) with --threads 1, and with
               CUDA graphs off, against llama-bench unpinned and pinned
    memory8b   3 contexts x 2 KV types, then one row per planner knob (q8_0, auto,
               4 slots, YaRN x4, partial offload) and YaRN contexts to 131072 (x2 to
               x16): the planner's ledger, item by item,
               against llama.cpp's load log and nvidia-smi's per-process memory
    smi        the CPU each nvidia-smi query of the audit costs, and whether
               one run answers both
    modload    the 8B plan with CUDA_MODULE_LOADING=EAGER and =LAZY
    cublas_build  llama-server again with GGML_CUDA_FORCE_CUBLAS (the V100's prompt path)
    cublas     the 8B plan served by both builds after 128- and 512-token prompts: the
               prefill pool against planner.prefill_pool_bytes
    v100       a Gemma-3-27B-shaped Q4_K_M (``--v100-shape``) planned for a V100 16 GB
               with the card table, started with that plan, then one layer and one
               context step past it; then planned again with the reserve this run
               measured (the edge) and started, and one context step past that
    v100_cublas  the same served by the cublas_build's llama-server, each start sent a
               1024-token prompt: the cuBLAS path a V100 takes for prompts, so the
               prefill pool the planner counts for a V100 is really allocated

``--cpu-check BUILD`` runs the same code on a CPU machine with a tiny shape
(``--scale-down``) and a CPU build's bin/ folder, to prove the scripts before
they run on the GPU machine.

The result is stamped by ``bench/provenance.py``: each command that ran phases into it
is one of the stamp's ``runs`` (each phase's ``run`` names it). ``--merge A.json
B.json ...`` merges results of commands on different machines of one kind phase by
phase into ``OUT/gpu-proof.json``, their runs kept, the summary made again.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import random
import resource
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import provenance  # noqa: E402  (bench/provenance.py)

from roles.model.reads import GgufShape
from roles.llamacpp.reads import LlamaServerFlags
from roles.driver.reads import NvidiaSmi
from llamarack.gpu_table import compute_cap as compute_cap_of, planning_memory_mib  # noqa: E402
from llamarack.layout import Layout  # noqa: E402
from roles.settings import load_settings
from roles.server.planner import CTX_STEP, Card, Knobs, cublas_prefill, ledger as planner_ledger, plan  # noqa: E402
from roles.server.plan import MIB, PlanError, knobs, render_unit, server_args  # noqa: E402

V100_PCI_ID = "0x1DB410DE"  # Tesla V100 PCIe 16GB: the card table plans it at 16130 MiB
HUB_REPO = "bench/llama3-8b-random"
T0 = time.time()
# What ran beside this script (its stamp's scripts): the driver, the deploys it runs @local, the
# checkpoint writer, and the stand-in for systemd-run where the machine has no systemd.
RAN_WITH = ("bench/gpu/proof.sh", "bench/gpu/build_deploy.py", "bench/gpu/model_deploy.py", "bench/gpu/random_model.py",
            "tests/support/fake_systemd_run.py")  # fmt: skip
FAKE_SYSTEMD_RUN = ("tests/support/fake_systemd_run.py, the unit tests' stand-in for systemd-run (the machine has no "
                    "systemd): it runs each step's command as systemd would hand it over, with its environment and "
                    "working directory, but neither as the pipeline user nor in the sandbox")  # fmt: skip
WHAT = ("on the GPU machine: the llama.cpp role builds, an 8B Llama-3-shaped random checkpoint goes through "
        "the model role @local; llama-bench vs the served unit's command line vs the copy-bandwidth roofline; "
        "the planner's ledger item by item against llama.cpp's load log and nvidia-smi for 3 contexts x 2 KV "
        "types and each planner knob; a Gemma-3-27B-shaped Q4_K_M planned for a V100 16 GB and served with that "
        "plan; what an older card's CUDA path holds that this card's hides: CUDA_MODULE_LOADING EAGER against "
        "LAZY (modload), and the cuBLAS prefill path (a GGML_CUDA_FORCE_CUBLAS build) against MMQ (cublas); the "
        "audit's nvidia-smi queries on a real driver (smi)")  # fmt: skip


# --------------------------------------------------------------------------
# parsers of what the tools print (pure: proven on CPU output first)
# --------------------------------------------------------------------------

_BUF = re.compile(r"(?P<func>\w+): +(?P<buf>\S+) +(?P<what>model|KV|compute|output|RS) buffer size = +"
                  r"(?P<mib>[\d.]+) MiB")  # fmt: skip
# llama-server prints llama.cpp's own load lines from verbosity 4 (the default is 3). Set
# through the environment, so the command line stays the unit's.
LOAD_LOG_ENV = {"LLAMA_ARG_LOG_VERBOSITY": "4"}


def parse_load_log(text: str) -> dict:
    """llama.cpp's buffer lines: {"model": {"CUDA0": MiB, "CPU_Mapped": MiB}, "KV": {...}, ...}.

    A memory-fitting dry run (``-fit``, at higher verbosity) prints the same
    lines with what it would allocate, before the real ones. So the model
    buffers: the last line of each buffer wins (one per buffer in a load);
    the context's buffers (KV, compute, output): only those after the last
    ``llama_context: n_ctx`` line, the KV lines of one buffer added up (a
    sliding-window model has two caches, each with its own line).
    """
    out: dict = {}
    cut = text.rfind("llama_context: n_ctx ")
    for m in _BUF.finditer(text):
        what, buf, mib = m["what"], m["buf"], float(m["mib"])
        if what == "model":
            out.setdefault(what, {})[buf] = mib
        elif m.start() > cut >= 0:
            d = out.setdefault(what, {})
            d[buf] = round(d.get(buf, 0.0) + mib, 2) if what == "KV" else mib
    return out


def parse_compute_apps(text: str) -> list:
    """``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits`` rows."""
    rows = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            rows.append({"pid": int(parts[0]), "used_mib": int(parts[1]) if parts[1].isdigit() else None})
    return rows


def parse_bench_json(text: str) -> list:
    """llama-bench -o json: one record per test, the fields the proof reports."""
    start = text.find("[")
    # stdout (the JSON) comes first, then llama.cpp's stderr
    data = json.JSONDecoder().raw_decode(text[start:])[0] if start >= 0 else []
    keep = ("n_prompt", "n_gen", "avg_ts", "stddev_ts", "samples_ts", "flash_attn", "type_k", "type_v",
            "n_batch", "n_ubatch", "n_gpu_layers", "n_threads", "build_commit", "gpu_info", "model_size",
            "model_n_params", "use_mmap", "load_mode")  # fmt: skip
    return [{k: r[k] for k in keep if k in r} for r in data]


def bench_args_for(server: list) -> list:
    """The llama-bench flags of the same runtime choices as a llama-server command line."""
    spelled = {"--cache-type-k": "-ctk", "--cache-type-v": "-ctv", "--n-gpu-layers": "-ngl",
               "--flash-attn": "-fa", "--load-mode": "-lm", "--threads": "-t",
               "--batch-size": "-b", "--ubatch-size": "-ub"}  # fmt: skip
    out, i = [], 0
    while i < len(server):
        a = server[i]
        if a in spelled and i + 1 < len(server):
            out += [spelled[a], server[i + 1]]
            i += 2
            continue
        if a == "--no-mmap":
            out += ["-mmp", "0"]
        elif a == "--no-repack":
            out += ["--repack", "0"]
        elif a == "--flash-attn":  # a bare switch in older builds
            out += ["-fa", "1"]
        i += 1
    return out


def reserve_from(needed: list) -> dict:
    """server_memory_reserve_mib from measured runs: the largest need, +10%, rounded up to 64 MiB."""
    worst = max(needed)
    return {"needed_max_mib": worst, "needed_min_mib": min(needed),
            "suggested_mib": int(-(-worst * 1.10 // 64) * 64),
            "derivation": "needed = process memory (nvidia-smi) - the planned weights, KV and compute on the card; "
                          "suggested = the largest, +10%, rounded up to 64 MiB"}  # fmt: skip


def host_compute_cap(gpus: tuple):
    """The compute capability a host's one-card plan counts with: that of a card whose prompts
    go through cuBLAS when the host has one (its prefill pool is the larger need), else the
    smallest card's; None without cards."""
    if not gpus:
        return None
    smallest = min(gpus, key=lambda g: planning_memory_mib(g.pci_device_id, g.memory_mib))
    return next((g.compute_cap for g in gpus if cublas_prefill(g.compute_cap)), smallest.compute_cap)


def ledger_mib(book) -> dict:
    """The planner's ledger in MiB, the items llama.cpp's load log names."""
    mib = lambda b: round(b / MIB, 2)  # noqa: E731
    return {"weights": mib(book.weights_on_card), "weights_host": mib(book.weights_on_host),
            "kv": mib(book.kv_on_card), "kv_host": mib(book.kv_on_host), "compute": mib(book.compute_on_card),
            "prefill_pool": mib(book.prefill_pool + book.draft_prefill_pool),
            "reserve": mib(book.reserve), "total": mib(book.total_on_card)}  # fmt: skip


def with_arg(args: list, flag: str, value) -> list:
    """A copy of a command line with ``flag``'s value replaced (or the flag added)."""
    out = list(args)
    if flag in out:
        out[out.index(flag) + 1] = str(value)
    else:
        out += [flag, str(value)]
    return out


def stop(p) -> None:
    """End a server: SIGTERM, then SIGKILL after 30 s."""
    p.terminate()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def exec_start(unit: str) -> list:
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    return shlex.split(line[len("ExecStart="):])


def done(phase: dict) -> bool:
    """Whether a phase need not run again: it passed, or its fallback made what the later
    phases use (the phase itself stays not ok: the product's route failed)."""
    return bool(phase.get("ok") or (phase.get("fallback") or {}).get("ok"))


def lab_env() -> dict:
    """This environment with this checkout's ``lab/`` on PYTHONPATH: the lab's hub server
    runs from there (the GPU machine has no lab package installed)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "lab"),
                                                                      os.environ.get("PYTHONPATH")]))}


def systemd_run_path(work: Path):
    """(how the model role's steps run here, the PATH to run it with): systemd-run where
    systemd runs; else the unit tests' stand-in, installed under ``work`` and first on PATH."""
    if shutil.which("systemd-run") and Path("/run/systemd/system").is_dir():
        return "the machine's systemd-run", None
    spec = importlib.util.spec_from_file_location("fake_systemd_run", REPO / "tests/support/fake_systemd_run.py")
    fake = sys.modules.setdefault("fake_systemd_run", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(fake)  # a module of its name first: its dataclasses look themselves up
    return FAKE_SYSTEMD_RUN, fake.path_with(fake.install(work / "fake-systemd-run"))


def tokens_sha256(tokens) -> str:
    """What a decode generated, short: the first 16 hex digits of the sha256 of its token list."""
    return hashlib.sha256(json.dumps(tokens).encode()).hexdigest()[:16]


def _plain(value) -> bool:
    """A value, or a list of values: no object, no list in a list."""
    return not isinstance(value, dict) and not (isinstance(value, list) and any(isinstance(v, (dict, list))
                                                                                for v in value))  # fmt: skip


def dumps(value, indent: int = 0) -> str:
    """The results file's JSON: a key a line, sorted, but on one line a list of plain values
    (a command line, samples), an object of plain values up to 400 characters (a
    llama-bench row), and anything up to 120."""
    flat = json.dumps(value, sort_keys=True)
    if _plain(value) or len(flat) <= 120 or isinstance(value, dict) and len(flat) <= 400 and all(
            _plain(v) for v in value.values()):  # fmt: skip
        return flat
    pad = " " * (indent + 1)
    if isinstance(value, dict):
        items = [f"{pad}{json.dumps(k)}: {dumps(v, indent + 1)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    return "[\n" + ",\n".join(pad + dumps(v, indent + 1) for v in value) + "\n" + " " * indent + "]"


# --------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------


class Proof:
    def __init__(self, a):
        self.a = a
        self.work = Path(a.work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.logs = self.work / "logs"
        self.logs.mkdir(exist_ok=True)
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.state_file = self.work / "results.json"
        self.r = json.loads(self.state_file.read_text()) if self.state_file.exists() else {"phases": {}}
        self.cpu = a.cpu_check is not None
        self.root = a.root
        self.layout = Layout(a.root)
        self.commit = a.commit
        self.deadline = T0 + a.limit
        self.bg = None
        self.earlier = self.r.get("provenance")  # the stamps of the commands that wrote this result before
        self.stamp = provenance.stamp(__file__, extra=RAN_WITH)

    # -- bookkeeping
    def log(self, msg: str) -> None:
        line = f"[{time.time() - T0:6.1f}s] {msg}"
        print(line, flush=True)
        with open(self.out / "proof.log", "a") as f:
            f.write(line + "\n")

    def save(self) -> None:
        self.r["written"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.r["what"] = WHAT
        self.r["provenance"] = provenance.joined(self.earlier, {**self.stamp, "written": provenance.now()})
        text = dumps(self.r) + "\n"
        self.state_file.write_text(text)
        (self.out / "gpu-proof.json").write_text(text)

    def left(self) -> float:
        return self.deadline - time.time()

    def sh(self, cmd, log: str, timeout: float = None, env=None) -> tuple:
        """Run ``cmd`` (list or shell string), output to logs/<log>; (rc, output, seconds)."""
        start = time.time()
        timeout = timeout or max(5, self.left() - 10)
        try:
            p = subprocess.run(cmd, shell=isinstance(cmd, str), capture_output=True, text=True,
                               timeout=timeout, env=env, errors="replace")  # fmt: skip
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = 124, f"{e.stdout or ''}{e.stderr or ''}\n[timed out after {timeout:.0f}s]"
        (self.logs / log).write_text(text if isinstance(text, str) else text.decode(errors="replace"))
        return rc, text, round(time.time() - start, 1)

    def fact(self, cls, *args, **kw):
        """A project fact, read the way pyinfra reads it: its command through sh, its process()."""
        fact = cls()
        p = subprocess.run(["sh", "-c", fact.command(*args, **kw)], capture_output=True, text=True)
        return fact.process(p.stdout.splitlines())

    # -- settings and the served command line
    def data(self, **extra) -> dict:
        d = {
            "llamarack_root": self.root, "python_env_backend": "venv",
            "llamarack_allow_shared_dirs": True,  # a throwaway machine: the root may be under /tmp
            "llamacpp_git_url": f"file://{REPO}/.carry/llama.cpp.git", "llamacpp_commit": self.commit,
            "llamacpp_build_jobs": os.cpu_count(),
        }  # fmt: skip
        if self.cpu:
            d["llamacpp_backend"] = "cpu"
        else:
            d["toolchain_cuda_version"] = "13.0"
        d.update(extra)
        return d

    def pyinfra(self, deploy: str, data: dict, log: str, path: str = None) -> dict:
        """``pyinfra -y @local DEPLOY --data ...`` (``path``: its PATH, where not this one's)."""
        cmd = [sys.executable, "-m", "pyinfra", "-y", "@local", deploy]
        for k, v in data.items():
            cmd += ["--data", f"{k}={json.dumps(v)}"]
        rc, text, s = self.sh(cmd, log, env={**os.environ, "PATH": path} if path else None)
        return {"rc": rc, "seconds": s, "command": " ".join(shlex.quote(c) for c in cmd[1:])}

    def plan(self, root: str = None, card: tuple = None, **overrides) -> dict:
        """What the server role would write for this host: the plan, the args, the unit."""
        root = root or self.root
        settings = load_settings("gpu-proof", self.data(llamarack_root=root, **overrides))
        layout = Layout(root)
        build_dir, model_dir = os.path.realpath(layout.current_build), os.path.realpath(layout.current_model)
        flags = self.fact(LlamaServerFlags, root)
        shape = self.fact(GgufShape, path=f"{model_dir}/model.gguf")
        if card is None:
            gpus = () if self.cpu else self.fact(NvidiaSmi).gpus
            card_mib = min((planning_memory_mib(g.pci_device_id, g.memory_mib) for g in gpus), default=None) \
                if settings.server.gpu_layers != 0 else None  # fmt: skip
            card_desc = [dict(name=g.name, memory_mib=g.memory_mib, pci_device_id=g.pci_device_id) for g in gpus]
            cap = host_compute_cap(gpus)
        else:
            card_mib = planning_memory_mib(*card)
            cap = compute_cap_of(card[0])
            card_desc = [{"pci_device_id": card[0], "reported_mib": card[1], "planned_mib": card_mib,
                          "compute_cap": cap}]  # fmt: skip
        if self.cpu and card is None:
            card_mib = 16130  # the CPU check still plans against a card, as the lab does
        cards = [Card("", card_mib, cap)] if card_mib is not None else []
        ctx = plan(shape, dataclasses.replace(knobs(settings), compute_cap=cap), cards)
        args = server_args(settings, flags, build_dir, model_dir, ctx, cuda=settings.llamacpp.backend == "cuda")
        unit = render_unit(settings, args, f"llamarack llama-server: {Path(model_dir).name} "
                                           f"({shape['architecture']}, {ctx.note})")  # fmt: skip
        start = exec_start(unit)
        assert start == args, (start, args)
        s = settings.server
        return {
            "settings": {k: v for k, v in overrides.items()},
            "card": card_desc, "card_mib": card_mib, "shape": shape,
            "ctx_size": ctx.ctx_size, "ctx_per_slot": ctx.ctx_per_slot, "note": ctx.note,
            "cache_type": ctx.cache_type_k, "gpu_layers": ctx.gpu_layers, "n_layer": ctx.ledger.n_layer,
            "ledger_mib": ledger_mib(ctx.ledger),
            "kv_bytes_per_token": ctx.ledger.kv_bytes_per_token,
            "exec_start": start, "port": s.port, "parallel": s.parallel,
            "knobs": dataclasses.asdict(dataclasses.replace(knobs(settings), compute_cap=cap)),
        }  # fmt: skip

    # -- a running llama-server
    def serve(self, args: list, name: str, port: int, env: dict = None):
        log = open(self.logs / f"server-{name}.log", "w")
        p = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        url = f"http://127.0.0.1:{port}"
        start = time.time()
        while time.time() - start < 300:
            if p.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return p, url, round(time.time() - start, 1)
            except Exception:
                pass
            time.sleep(0.2)
        p.kill()
        p.wait()
        raise RuntimeError(f"llama-server {name} did not answer /health: "
                           + (self.logs / f"server-{name}.log").read_text()[-2000:])  # fmt: skip

    @staticmethod
    def post(url: str, body: dict, timeout: float = 300) -> dict:
        req = urllib.request.Request(url + "/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def gpu_memory(self, pid: int) -> dict:
        if self.cpu:
            return {"process_mib": None, "note": "no GPU (CPU check)"}
        q = "nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
        rows = parse_compute_apps(subprocess.run(q, shell=True, capture_output=True, text=True).stdout)
        used = subprocess.run("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits", shell=True,
                              capture_output=True, text=True).stdout.strip()  # fmt: skip
        mine = [r for r in rows if r["pid"] == pid]
        return {"process_mib": mine[0]["used_mib"] if mine else None, "apps": rows,
                "gpu_used_mib": int(used) if used.isdigit() else used}  # fmt: skip

    def tokens(self, n: int, seed: int, hi: int = 999) -> list:
        rnd = random.Random(seed)
        return [rnd.randrange(3, hi) for _ in range(n)]

    # ----------------------------------------------------------------------
    # phases
    # ----------------------------------------------------------------------

    def machine(self):
        m = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count()}
        q = ("nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total,pci.device_id,clocks.max.sm,"
             "clocks.max.mem,power.limit --format=csv,noheader")  # fmt: skip
        m["nvidia_smi"] = subprocess.run(q, shell=True, capture_output=True, text=True).stdout.strip() or None
        nv = subprocess.run("nvcc --version | tail -2", shell=True, capture_output=True, text=True).stdout.strip()
        m["nvcc"] = nv or None
        cpu = subprocess.run("grep -m1 'model name' /proc/cpuinfo", shell=True, capture_output=True, text=True)
        m["cpu"] = cpu.stdout.split(":", 1)[-1].strip()
        m["mem_total"] = Path("/proc/meminfo").read_text().splitlines()[0]
        m["disk"] = subprocess.run(f"df -h {self.root.rsplit('/', 1)[0] or '/'} /dev/shm | tail -2", shell=True,
                                   capture_output=True, text=True).stdout.strip()  # fmt: skip
        try:
            import torch

            m["torch"] = torch.__version__
            m["torch_cuda"] = torch.version.cuda
        except Exception as e:
            m["torch"] = f"unavailable: {e}"
        m["llamacpp_commit"] = self.commit
        return m

    def start_checkpoint(self):
        """Generate the 8B checkpoint (GPU random, safetensors in shm) and start the hub
        server on it (its scan hashes every file) while the build runs."""
        hub = Path(self.a.shm) / "hub" / HUB_REPO
        done = hub.parent / "generated.json"
        self.hub = None
        if self.r["phases"].get("model8b", {}).get("ok"):
            return
        cmd = [self.a.gen_python, str(REPO / "bench/gpu/random_model.py"), "checkpoint", "llama3-8b", str(hub),
               "--tokenizer", str(REPO / ".carry/tokenizer"), "--scale-down", str(self.a.scale_down)]  # fmt: skip

        def run():
            if not done.exists():
                shutil.rmtree(hub, ignore_errors=True)
                rc, text, s = self.sh(cmd, "checkpoint.log", timeout=900)
                self.log(f"checkpoint rc={rc} in {s}s")
                if rc:
                    return
                done.write_text(text.strip().splitlines()[-1])
            start = time.time()
            self.hub = subprocess.Popen([sys.executable, "-m", "llamarack_lab.hub_server", "--port", "0",
                                         f"{HUB_REPO}={hub}"], stdout=subprocess.PIPE, text=True, cwd=REPO,
                                        env=lab_env())  # fmt: skip
            self.hub_line = self.hub.stdout.readline().strip()  # http://127.0.0.1:PORT/api/models/REPO/revision/SHA
            self.hub_scan_seconds = round(time.time() - start, 1)
            self.log(f"hub: {self.hub_line} after {self.hub_scan_seconds}s")

        self.bg = threading.Thread(target=run, daemon=True)
        self.bg.start()
        self.log("checkpoint generation started in the background")

    def build(self):
        if self.cpu:
            # The CPU check serves a CPU build made elsewhere (no CUDA here): a build dir
            # as the role leaves it (bin/, server-help.txt, build-info.json).
            b = Path(self.layout.build("cpucheck"))
            b.mkdir(parents=True, exist_ok=True)
            if not (b / "bin").exists():
                (b / "bin").symlink_to(self.a.cpu_check)
            help_text = subprocess.run([f"{b}/bin/llama-server", "--help"], capture_output=True, text=True)
            (b / "server-help.txt").write_text(help_text.stdout + help_text.stderr)
            # The CPU build's own record when it has one: the runtime flags its smoke run
            # needed (--no-repack on a CPU whose AMX repack faults) reach the served args.
            made = Path(self.a.cpu_check).parent / "build-info.json"
            (b / "build-info.json").write_text(made.read_text() if made.exists()
                                               else json.dumps({"proof": {"runtime_args": []}}))  # fmt: skip
            link = Path(self.layout.current_build)
            if not link.is_symlink():
                link.symlink_to("cpucheck")
            src = Path(self.layout.src)
            if not src.exists():
                src.parent.mkdir(parents=True, exist_ok=True)
                src.symlink_to(self.a.cpu_src)
            return {"ok": True, "cpu_check": self.a.cpu_check}
        d = self.pyinfra(str(REPO / "bench/gpu/build_deploy.py"), self.data(), "deploy-build.log")
        info = Path(self.layout.current_build) / "build-info.json"
        if info.exists():
            rec = json.loads(info.read_text())
            d["build_info"] = {k: rec.get(k) for k in ("stamp", "commit", "cuda_archs", "cuda_version",
                                                       "cmake_args", "targets", "host_compiler")}  # fmt: skip
            d["proof"] = rec.get("proof")
        ver = Path(self.layout.current_build) / "version.txt"
        d["version"] = ver.read_text().strip() if ver.exists() else None
        d["ok"] = d["rc"] == 0 and info.exists()
        return d

    def model8b(self):
        if self.bg is not None:
            self.bg.join(timeout=max(1, self.left() - 60))
        hub_dir = Path(self.a.shm) / "hub" / HUB_REPO
        gen = hub_dir.parent / "generated.json"
        if not gen.exists():
            return {"ok": False, "error": "checkpoint not generated: see logs/checkpoint.log"}
        d = {"checkpoint": json.loads(gen.read_text())}
        if self.hub is None:
            return {**d, "ok": False, "error": "the hub server did not start"}
        try:
            d["hub_scan_seconds"] = self.hub_scan_seconds
            m = re.match(r"(http://[^/]+)/api/models/.+/revision/([0-9a-f]{40})$", self.hub_line)
            if not m:
                return {**d, "ok": False, "error": f"hub server said {self.hub_line!r}"}
            endpoint, revision = m.groups()
            # The artifact on tmpfs when it has room for the role's peak (checkpoint copy,
            # f16 GGUF, Q4_K_M): disk write speed is no part of what is measured here.
            models = Path(self.layout.models)
            shm_models = Path(self.a.shm) / "models"
            if not models.exists() and shutil.disk_usage(self.a.shm).free > 2.7 * d["checkpoint"]["bytes"]:
                shm_models.mkdir(parents=True, exist_ok=True)
                models.parent.mkdir(parents=True, exist_ok=True)
                models.symlink_to(shm_models)
                d["models_dir"] = f"{models} -> {shm_models}"
            data = self.data(model_source="hf", model_repo=HUB_REPO, model_revision=revision,
                             model_hf_endpoint=endpoint, bench_convert_python=self.a.convert_python)  # fmt: skip
            if self.cpu:
                data["bench_quantize"] = f"{self.a.cpu_check}/llama-quantize"
            d["systemd_run"], path = systemd_run_path(self.work)
            d.update(self.pyinfra(str(REPO / "bench/gpu/model_deploy.py"), data, "deploy-model.log", path))
        finally:
            self.hub.terminate()
            self.hub.wait()
        cur = Path(os.path.realpath(self.layout.current_model))
        d["ok"] = d["rc"] == 0 and (cur / "model.gguf").exists()
        d["route"] = "the model role (bench/gpu/model_deploy.py)"
        if d["ok"]:
            d["artifact"] = str(cur)
            d["gguf_bytes"] = (cur / "model.gguf").stat().st_size
            for step in ("fetch", "convert", "quantize"):
                f = cur / f"{step}.log"
                if f.exists():
                    tail = f.read_text(errors="replace").strip().splitlines()[-3:]
                    d[f"{step}_log_tail"] = tail
            shutil.rmtree(hub_dir, ignore_errors=True)  # shm back for the V100 shape's f16 GGUF
        elif self.left() > 150:
            # The role's route failed: the phase stays not ok. The model the later phases
            # measure is made another way, and every figure from it says so (``route``).
            d["fallback"] = self.direct_8b()
            d["route"] = "fallback: " + d["fallback"].get("note", "") if d["fallback"].get("ok") else d["route"]
        return d

    def direct_8b(self) -> dict:
        """When the role's path fails: the same shape written as an f16 GGUF with gguf-py,
        quantized by the same build's llama-quantize, served from models/current."""
        shutil.rmtree(Path(self.a.shm) / "hub", ignore_errors=True)
        art = Path(self.a.shm) / "direct8b"
        art.mkdir(parents=True, exist_ok=True)
        f16 = art / "model-f16.gguf"
        rc, text, s = self.sh([self.a.gen_python, str(REPO / "bench/gpu/random_model.py"), "gguf", "llama3-8b",
                               str(f16), "--gguf-py", f"{self.layout.src}/gguf-py", "--scale-down",
                               str(self.a.scale_down)], "gguf8b.log")  # fmt: skip
        d = {"f16": {"rc": rc, "seconds": s}}
        if rc:
            return {**d, "ok": False}
        q = f"{os.path.realpath(self.layout.current_build)}/bin/llama-quantize"
        rc, text, s = self.sh([q, str(f16), str(art / "model.gguf"), "Q4_K_M"], "quantize8b.log")
        f16.unlink(missing_ok=True)
        d["quantize"] = {"rc": rc, "seconds": s, "tail": text.strip().splitlines()[-2:]}
        if rc:
            return {**d, "ok": False}
        cur = Path(self.layout.current_model)
        cur.parent.mkdir(parents=True, exist_ok=True)
        if cur.is_symlink():
            cur.unlink()
        cur.symlink_to(art)
        return {**d, "ok": True, "artifact": str(art), "gguf_bytes": (art / "model.gguf").stat().st_size,
                "note": "the model role failed (see deploy-model.log): random_model.py's f16 GGUF (gguf-py) and "
                        "the build's llama-quantize made the model instead"}  # fmt: skip

    def roofline(self):
        if self.cpu:
            return {"ok": True, "note": "no GPU (CPU check)"}
        import torch

        n = 4 << 30  # bytes per buffer: far over the 60 MB L2
        x = torch.empty(n // 2, dtype=torch.float16, device="cuda").normal_()
        y = torch.empty_like(x)
        for _ in range(3):
            y.copy_(x)
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            y.copy_(x)
            e1.record()
            e1.synchronize()
            times.append(e0.elapsed_time(e1) / 1e3)
        assert torch.equal(x[:1 << 20], y[:1 << 20])
        med = statistics.median(times)
        del x, y
        torch.cuda.empty_cache()
        return {"ok": True, "bytes_per_copy": n, "median_s": med, "min_s": min(times),
                "bandwidth_GBps": round(2 * n / med / 1e9, 1), "method": "torch y.copy_(x), 4 GiB fp16, "
                "20 timed after 3 warm-ups, CUDA events; bytes read + written"}  # fmt: skip

    def llama_bench(self, cmd: list, log: str, timeout: float, env: dict = None, shown: str = "") -> dict:
        """One llama-bench run with -o json: its status, command line and result rows."""
        rc, text, s = self.sh(cmd, log, timeout=timeout, env=env)
        try:
            rows = parse_bench_json(text)
        except ValueError as e:
            rows = [{"error": f"unparsed: {e}"}]
        return {"rc": rc, "seconds": s, "command": shown + " ".join(cmd), "results": rows}

    def bench8b(self):
        p = self.plan()
        b = f"{os.path.realpath(self.layout.current_build)}/bin/llama-bench"
        model = p["exec_start"][p["exec_start"].index("--model") + 1]
        served = bench_args_for(p["exec_start"])
        reps = "5" if not self.cpu else "2"
        runs = {"served_flags": served}

        def flags_with(**kv):
            f = list(served)
            for k, v in kv.items():
                if k in f:
                    f[f.index(k) + 1] = v
                else:
                    f += [k, v]
            return f

        if not self.cpu:
            runs["kv_f16_fa_on_off"] = flags_with(**{"-ctk": "f16", "-ctv": "f16", "-fa": "on,off"})
            runs["kv_q8_0"] = flags_with(**{"-ctk": "q8_0", "-ctv": "q8_0"})
            runs["ubatch"] = flags_with(**{"-ub": "256,1024,2048"})
        out = {"served_flags": served, "model": model, "runs": {}}
        for name, flags in runs.items():
            cmd = [b, "-m", model, "-p", "512", "-n", "128", "-r", reps, "-o", "json", *flags]
            if name == "ubatch":
                cmd[cmd.index("-p") + 1] = "512,2048"
                cmd[cmd.index("-n") + 1] = "0"
            out["runs"][name] = self.llama_bench(cmd, f"bench-{name}.log", 240)
        if not self.cpu:
            # CUDA graphs are on by default; this says what they are worth here.
            env = {**os.environ, "GGML_CUDA_DISABLE_GRAPHS": "1"}
            cmd = [b, "-m", model, "-p", "0", "-n", "128", "-r", reps, "-o", "json", *served]
            out["runs"]["cuda_graphs_off"] = self.llama_bench(cmd, "bench-nographs.log", 120, env=env,
                                                              shown="GGML_CUDA_DISABLE_GRAPHS=1 ")  # fmt: skip
        out["ok"] = out["runs"]["served_flags"]["rc"] == 0
        return out

    def decode(self, url: str, sampling: dict, reps: int) -> dict:
        """Served decode: 128 tokens after a short prompt, ``reps`` times (a warm-up first)."""
        prompt = "The history of the rack server begins with"
        self.post(url, {"prompt": prompt, "n_predict": 16, "ignore_eos": True, **sampling})  # warm-up
        rows, texts = [], []
        for i in range(reps):
            r = self.post(url, {"prompt": prompt, "n_predict": 128, "ignore_eos": True,
                                "cache_prompt": False, "return_tokens": True, **sampling})  # fmt: skip
            t = r["timings"]
            rows.append({"predicted_n": t["predicted_n"], "predicted_per_second": t["predicted_per_second"],
                         "prompt_n": t["prompt_n"]})  # fmt: skip
            texts.append(r.get("tokens") or r.get("content", ""))
        return {"n_predict": 128, "reps": rows, "tokens_sha256": tokens_sha256(texts[0]),
                "median_tps": statistics.median(r["predicted_per_second"] for r in rows)}  # fmt: skip

    def decode_variant(self, args: list, name: str, port: int, reps: int, env: dict = None, **shown) -> dict:
        """A llama-server started with ``args`` (the unit's ExecStart and a variation), its
        decode with the default sampling and greedy; ``shown`` (and ``env``, when given) is
        recorded beside them."""
        shown = {**shown, "env": env} if env is not None else shown
        proc, url, _ = self.serve(args, name, port, env=env)
        try:
            return {**shown, "default_sampling": self.decode(url, {}, reps),
                    "greedy": self.decode(url, {"temperature": 0}, reps)}  # fmt: skip
        except Exception as e:
            return {**shown, "error": f"{type(e).__name__}: {e}"}
        finally:
            stop(proc)

    def serve8b(self):
        reps = 5 if not self.cpu else 2
        p = self.plan()
        out = {"plan": p}
        proc, url, load_s = self.serve(p["exec_start"], "served", p["port"])
        try:
            out["load_seconds"] = load_s
            out["decode_default_sampling"] = self.decode(url, {}, reps)
            out["decode_greedy"] = self.decode(url, {"temperature": 0}, reps)
            rows = []
            self.post(url, {"prompt": self.tokens(512, 99), "n_predict": 1, "cache_prompt": False})
            for i in range(reps):
                r = self.post(url, {"prompt": self.tokens(512, i), "n_predict": 1, "cache_prompt": False})
                rows.append({"prompt_n": r["timings"]["prompt_n"],
                             "prompt_per_second": r["timings"]["prompt_per_second"]})  # fmt: skip
            out["prefill_single_pp512"] = {"reps": rows,
                                           "median_tps": statistics.median(r["prompt_per_second"] for r in rows)}
            out["memory"] = self.gpu_memory(proc.pid)
        finally:
            stop(proc)
        # Where served decode loses to llama-bench: llama-bench decodes a fixed token and
        # samples nothing; the server copies the logits (128K floats for Llama 3) to the
        # host and runs the sampler chain on the CPU for every token. Variants of the
        # unit's command line, each served and measured the same way.
        help_text = subprocess.run([p["exec_start"][0], "--help"], capture_output=True, text=True).stdout
        # Threads: the CPU side only embeds the token and samples, and llama-bench (16 threads)
        # sampling nothing says little about it; all threads cost about 3% of served decode here.
        variants = {"threads_all": ["--threads", str(os.cpu_count())], "threads_1": ["--threads", "1"],
                    "threads_2": ["--threads", "2"], "threads_4": ["--threads", "4"]}  # fmt: skip
        if "--poll" in help_text:
            variants["poll_0"] = ["--poll", "0"]
        if "--backend-sampling" in help_text:
            variants["backend_sampling"] = ["--backend-sampling"]
            variants["backend_sampling_threads_2"] = ["--backend-sampling", "--threads", "2"]
        out["decode_variants"] = {}
        for name, extra in variants.items():
            out["decode_variants"][name] = self.decode_variant(p["exec_start"] + extra, f"variant-{name}", p["port"],
                                                               reps, extra_args=extra)  # fmt: skip
        out["aggregate_prefill"] = {}
        for n in self.a.parallel:
            out["aggregate_prefill"][str(n)] = self.aggregate(n)
        out["ok"] = True
        return out

    def pinning(self):
        """Served decode with the process held on one or two CPUs, against llama-bench the same way.

        What the server adds per token beyond llama-bench (pinned build): the sampler chain
        on the CPU, and a hand-off to a queue thread around every decode (``yield_to_queue``
        wakes it, then waits until it has gone back to sleep). Two thread wake-ups per token
        cost little on a busy CPU and tens of microseconds on an idle one, which is what a
        CPU waiting on the GPU is. One CPU for the whole process makes each wake-up a
        context switch on that CPU. These variants measure that, each served with the
        unit's ExecStart plus the extra arguments, under ``taskset`` for the pinned ones.
        """
        reps = 5 if not self.cpu else 2
        p = self.plan()
        b = f"{os.path.realpath(self.layout.current_build)}/bin/llama-bench"
        model = p["exec_start"][p["exec_start"].index("--model") + 1]
        served = bench_args_for(p["exec_start"])
        cpus = sorted(os.sched_getaffinity(0))
        one, two = str(cpus[-1]), ",".join(str(c) for c in cpus[-2:])
        idle = Path("/sys/devices/system/cpu/cpuidle")
        out = {"cpus": cpus, "one_cpu": one, "two_cpus": two, "served_flags": served,
               "cpuidle": {f.name: f.read_text().strip() for f in sorted(idle.glob("current_*"))} if idle.is_dir()
               else None, "bench": {}, "served": {}}  # fmt: skip
        bench_runs = {"unpinned": ([], []), "one_cpu_threads_1": (["taskset", "-c", one], ["-t", "1"])}
        for name, (prefix, extra) in bench_runs.items():
            cmd = prefix + [b, "-m", model, "-p", "0", "-n", "128", "-r", str(reps), "-o", "json", *served, *extra]
            run = self.llama_bench(cmd, f"pinning-bench-{name}.log", 180)
            run["tg128_tps"] = next((r.get("avg_ts") for r in run["results"] if r.get("n_gen")), None)
            out["bench"][name] = run
        reference = out["bench"]["unpinned"]["tg128_tps"]
        variants = {
            "unit": ([], [], {}),
            "threads_1": ([], ["--threads", "1"], {}),
            "one_cpu_threads_1": (["taskset", "-c", one], ["--threads", "1"], {}),
            "two_cpus_threads_1": (["taskset", "-c", two], ["--threads", "1"], {}),
            "one_cpu_threads_1_backend_sampling": (["taskset", "-c", one], ["--threads", "1", "--backend-sampling"],
                                                   {}),
            "cuda_graphs_off": ([], [], {"GGML_CUDA_DISABLE_GRAPHS": "1"}),
        }  # fmt: skip
        help_text = subprocess.run([p["exec_start"][0], "--help"], capture_output=True, text=True).stdout
        if "--backend-sampling" not in help_text:
            variants.pop("one_cpu_threads_1_backend_sampling")
        for name, (prefix, extra, env) in variants.items():
            row = self.decode_variant(prefix + p["exec_start"] + extra, f"pinning-{name}", p["port"], reps, env=env,
                                      prefix=prefix, extra_args=extra)  # fmt: skip
            if "default_sampling" in row and reference:
                row["over_llama_bench_unpinned"] = round(row["default_sampling"]["median_tps"] / reference, 3)
            out["served"][name] = row
        out["ok"] = reference is not None and "error" not in out["served"]["unit"]
        return out

    def aggregate(self, n: int) -> dict:
        p = self.plan(server_parallel=n)
        proc, url, _ = self.serve(p["exec_start"], f"parallel{n}", p["port"])
        try:
            self.post(url, {"prompt": self.tokens(512, 7), "n_predict": 1, "cache_prompt": False})
            rounds = []
            for k in range(3):
                results, gate = [None] * n, threading.Barrier(n + 1)

                def one(i):
                    gate.wait()
                    results[i] = self.post(url, {"prompt": self.tokens(512, 1000 * k + i), "n_predict": 1,
                                                 "cache_prompt": False})  # fmt: skip

                threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
                for t in threads:
                    t.start()
                gate.wait()
                start = time.time()
                for t in threads:
                    t.join()
                wall = time.time() - start
                tokens = sum(r["timings"]["prompt_n"] for r in results)
                rounds.append({"prompt_tokens": tokens, "wall_s": round(wall, 4),
                               "aggregate_tps": round(tokens / wall, 1),
                               "per_request_prompt_tps": [round(r["timings"]["prompt_per_second"], 1)
                                                          for r in results]})  # fmt: skip
        finally:
            stop(proc)
        return {"parallel": n, "ctx_size": p["ctx_size"], "exec_start": p["exec_start"], "rounds": rounds,
                "median_aggregate_tps": statistics.median(r["aggregate_tps"] for r in rounds),
                "method": f"{n} concurrent /completion requests of 512 distinct random tokens, n_predict 1; "
                          "client wall time from one release to the last answer"}  # fmt: skip

    def measure_memory(self, p: dict, name: str, env: dict = None, prompt_tokens: int = None) -> dict:
        """Start the planned server (``env`` added to its environment), one request of
        ``prompt_tokens`` tokens, then what llama.cpp and nvidia-smi say, item by item
        against the planner's ledger. Both default to the plan's own (``p["env"]``,
        ``p["prompt_tokens"]``), else none and 256."""
        env = env if env is not None else p.get("env")
        prompt_tokens = prompt_tokens or p.get("prompt_tokens") or 256
        proc, url, load_s = self.serve(p["exec_start"], name, p["port"], env={**LOAD_LOG_ENV, **(env or {})})
        try:
            before = self.gpu_memory(proc.pid)
            self.post(url, {"prompt": self.tokens(prompt_tokens, 5), "n_predict": 16, "cache_prompt": False,
                            "ignore_eos": True})  # fmt: skip
            after = self.gpu_memory(proc.pid)
        finally:
            stop(proc)
        text = (self.logs / f"server-{name}.log").read_text(errors="replace")
        log = parse_load_log(text)
        on_gpu = lambda k: k.startswith("CUDA") and "Host" not in k  # noqa: E731
        gpu = lambda d: round(sum(v for k, v in d.items() if on_gpu(k)), 2)  # noqa: E731
        host = lambda d: round(sum(v for k, v in d.items() if not on_gpu(k)), 2)  # noqa: E731
        meas = {
            "weights_gpu": gpu(log.get("model", {})), "weights_host": host(log.get("model", {})),
            "kv": gpu(log.get("KV", {})), "kv_host": host(log.get("KV", {})),
            "compute_gpu": gpu(log.get("compute", {})), "compute_host": host(log.get("compute", {})),
        }  # fmt: skip
        kv_lines = re.findall(r"llama_kv_cache: size = .*", text[text.rfind("llama_context: n_ctx "):])
        used = [m["process_mib"] for m in (before, after) if m.get("process_mib") is not None]
        led = p["ledger_mib"]
        row = {"ctx_size": p["ctx_size"], "ctx_per_slot": p.get("ctx_per_slot"), "parallel": p.get("parallel"),
               "env": env, "prompt_tokens": prompt_tokens,
               "cache_type": p.get("cache_type"), "gpu_layers": p.get("gpu_layers"), "n_layer": p.get("n_layer"),
               "knob": p.get("knob"), "ledger_mib": led, "log_mib": meas, "load_log": log, "kv_lines": kv_lines,
               "smi_after_load": before, "smi_after_request": after, "load_seconds": load_s,
               "exec_start": p["exec_start"]}  # fmt: skip
        err = lambda plan, seen: round((plan - seen) / seen, 4) if seen else None  # noqa: E731
        row["error"] = {"weights": err(led["weights"], meas["weights_gpu"]),
                        "weights_host": err(led["weights_host"], meas["weights_host"]),
                        "kv": err(led["kv"], meas["kv"]), "kv_host": err(led["kv_host"], meas["kv_host"]),
                        "compute": err(led["compute"], meas["compute_gpu"])}  # fmt: skip
        if used:
            proc_mib = max(used)
            row["process_mib"] = proc_mib
            row["planned_total_mib"] = led["total"]
            row["error"]["total_vs_process"] = err(led["total"], proc_mib)
            # What the reserve would have had to be for this run: the process less the planned items
            # (the prefill pool among them, counted apart from the reserve, where this build made it:
            # this card's own MMQ build never does, whatever card the plan was for).
            pool = led.get("prefill_pool", 0.0) if p.get("prefill_pool_made", True) else 0.0
            row["reserve_needed_mib"] = round(proc_mib - led["weights"] - led["kv"] - led["compute"] - pool, 1)
            # The CUDA context, cuBLAS workspace and pools: what no llama.cpp buffer line names.
            row["beyond_log_buffers_mib"] = round(proc_mib - meas["weights_gpu"] - meas["kv"]
                                                  - meas["compute_gpu"], 1)  # fmt: skip
        return row

    def memory8b(self):
        """The 8B: 3 contexts x 2 KV types, then one row per planner knob."""
        rows = []
        cases = [dict(server_ctx_size=ctx, server_cache_type_k=kv, server_cache_type_v=kv)
                 for kv in ("q4_0", "f16") for ctx in self.a.contexts]  # fmt: skip
        top = max(self.a.contexts)
        knob_cases = {
            "kv q8_0": dict(server_ctx_size=top, server_cache_type_k="q8_0", server_cache_type_v="q8_0"),
            "kv auto": dict(server_ctx_size=top),
            "slots 4": dict(server_ctx_size=top // 4, server_parallel=4, server_cache_type_k="q8_0",
                            server_cache_type_v="q8_0"),
            "yarn x4": dict(server_ctx_size=4 * top, server_rope_scaling="yarn", server_rope_scale=4.0,
                            server_cache_type_k="q4_0", server_cache_type_v="q4_0"),
            "partial offload 20 layers": dict(server_ctx_size=top, server_gpu_layers=20,
                                              server_cache_type_k="f16", server_cache_type_v="f16"),
        }  # fmt: skip
        # Long contexts (YaRN past the shape's trained 8192): how llama.cpp's compute buffer
        # grows with the cells, which the planner's estimate follows to 8192 only.
        for scale, kv in ((2, "q4_0"), (4, "f16"), (8, "q4_0"), (16, "q4_0")):
            knob_cases[f"yarn x{scale} {kv}"] = dict(
                server_ctx_size=scale * top, server_rope_scaling="yarn", server_rope_scale=float(scale),
                server_cache_type_k=kv, server_cache_type_v=kv)  # fmt: skip
        for case in cases + list(knob_cases.items()):
            knob, overrides = case if isinstance(case, tuple) else (None, case)
            try:
                p = self.plan(**overrides)
            except PlanError as e:
                rows.append({"knob": knob, "settings": overrides, "refused": e.failure.message("gpu-proof")})
                continue
            p["knob"] = knob
            rows.append(self.measure_memory(p, "mem-" + re.sub(r"\W+", "-", knob or
                                                                 f"{p['cache_type']}-{p['ctx_size']}")))  # fmt: skip
            self.log(f"memory {knob or ''} {p['cache_type']} ctx {p['ctx_size']}: {rows[-1].get('process_mib')} MiB "
                     f"errors {rows[-1]['error']}")  # fmt: skip
        out = {"ok": True, "rows": rows}
        needed = [r["reserve_needed_mib"] for r in rows if "reserve_needed_mib" in r]
        if needed:
            out["reserve"] = reserve_from(needed)
        return out

    def smi(self):
        """What the audit's two nvidia-smi queries cost on a real driver (CPU seconds, the
        median of 9), and whether one run of nvidia-smi answers both (it would halve them)."""
        gpu_q = ("nvidia-smi --query-gpu=index,name,uuid,memory.total,compute_cap,driver_version,pci.device_id"
                 " --format=csv,noheader,nounits")  # fmt: skip
        apps_q = "nvidia-smi --query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid --format=csv,noheader,nounits"
        out = {}
        for name, q in (("query_gpu", gpu_q), ("query_compute_apps", apps_q)):
            cpu, wall = [], []
            for _ in range(9):
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                start = time.time()
                r = subprocess.run(q, shell=True, capture_output=True, text=True)
                wall.append(time.time() - start)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
            out[name] = {"command": q, "rc": r.returncode, "output": r.stdout[-1000:],
                         "cpu_s_median": round(statistics.median(cpu), 4),
                         "wall_s_median": round(statistics.median(wall), 4)}  # fmt: skip
        both = gpu_q.replace(" --format", " --query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid --format")
        r = subprocess.run(both, shell=True, capture_output=True, text=True)
        out["both_in_one_run"] = {"command": both, "rc": r.returncode, "output": (r.stdout + r.stderr)[-1500:]}
        out["ok"] = self.cpu or out["query_gpu"]["rc"] == 0  # the CPU check proves the script only
        return out

    def modload(self):
        """The 8B plan served with CUDA_MODULE_LOADING=LAZY and =EAGER, a 512-token request
        each. CUDA's runtime loads every kernel of the process (llama.cpp's and cuBLAS's)
        onto the card at start when EAGER, the default of runtimes before 12.2 (the
        toolkit 11.8 this project installs for V100s); LAZY, the default since, loads a
        kernel when it is first used. This card's runtime (13) is LAZY by default, so the
        reserve was measured LAZY."""
        p = self.plan()
        out = {}
        for mode in ("LAZY", "EAGER"):
            out[mode.lower()] = self.measure_memory(p, f"modload-{mode.lower()}", env={"CUDA_MODULE_LOADING": mode},
                                                    prompt_tokens=512)  # fmt: skip
        used = {m: out[m].get("process_mib") for m in ("lazy", "eager")}
        out["eager_over_lazy_mib"] = used["eager"] - used["lazy"] if None not in used.values() else None
        out["ok"] = self.cpu or out["eager_over_lazy_mib"] is not None
        return out

    def cublas_build(self):
        """llama-server again, from the same source and cmake flags with GGML_CUDA_FORCE_CUBLAS:
        the quantized matrix products of a batch go through cuBLAS, as they do on a V100 for
        batches of 64 tokens and more (ggml-cuda/mmq.cu, ggml_cuda_should_use_mmq: FP16 tensor
        cores without int8 MMA). This card's own choice is MMQ."""
        if self.cpu:
            return {"ok": True, "server": os.path.realpath(f"{self.layout.current_build}/bin/llama-server"),
                    "note": "CPU check: no CUDA here, the role's build stands in"}  # fmt: skip
        info = json.loads((Path(self.layout.current_build) / "build-info.json").read_text())
        d = self.work / "build-force-cublas"
        args = list(info["cmake_args"]) + ["-DGGML_CUDA_FORCE_CUBLAS=ON"]
        rc, text, s1 = self.sh(["cmake", "-S", self.layout.src, "-B", str(d), *args], "cublas-configure.log",
                               timeout=120)  # fmt: skip
        out = {"cmake_args": args, "configure": {"rc": rc, "seconds": s1}}
        if rc == 0:
            rc, text, s2 = self.sh(["cmake", "--build", str(d), "--config", "Release", "-j", str(os.cpu_count()),
                                    "--target", "llama-server"], "cublas-build.log")  # fmt: skip
            out["build"] = {"rc": rc, "seconds": s2, "tail": text.strip().splitlines()[-3:]}
        out["server"] = str(d / "bin/llama-server")
        out["ok"] = rc == 0 and Path(out["server"]).exists()
        return out

    def cublas(self):
        """The 8B plan served by the GGML_CUDA_FORCE_CUBLAS build and by the role's, each with a
        128- and a 512-token request (LAZY module loading both): what the cuBLAS path holds
        beyond MMQ's is each weight matrix dequantized to f16 in ggml's CUDA pool, beside
        the batch converted to f16 (and, on cards other than Volta, the f16 result):
        ``cublas_prefill`` in the summary, against ``planner.prefill_pool_bytes``."""
        server = self.r["phases"]["cublas_build"]["server"]
        p = self.plan()
        out = {"server": server, "rows": {}}
        for tokens in (128, 512):
            for name, binary in (("mmq", p["exec_start"][0]), ("cublas", server)):
                q = dict(p, exec_start=[binary, *p["exec_start"][1:]])
                out["rows"][f"{name}_{tokens}"] = self.measure_memory(q, f"cublas-{name}-{tokens}", prompt_tokens=tokens,
                                                                      env={"CUDA_MODULE_LOADING": "LAZY"})  # fmt: skip
        used = {k: r.get("process_mib") for k, r in out["rows"].items()}
        out["cublas_over_mmq_mib"] = {str(t): used[f"cublas_{t}"] - used[f"mmq_{t}"] for t in (128, 512)
                                      if used.get(f"cublas_{t}") is not None and used.get(f"mmq_{t}") is not None}
        out["shape"] = {k: p["shape"].get(k) for k in ("n_embd", "n_ff", "n_head", "n_head_kv", "head_dim_k",
                                                        "head_dim_v", "file_type", "n_vocab", "n_layer")}  # fmt: skip
        out["ok"] = self.cpu or len(out["cublas_over_mmq_mib"]) == 2
        return out

    def measure_past(self, p: dict, knob: str, log: str, layers: int, per_slot: int) -> dict:
        """``measure_memory`` of plan ``p`` taken further than the planner went (``layers`` on
        the card, ``per_slot`` cells a slot), with the planner's ledger for it."""
        args = p["exec_start"]
        if layers != p["gpu_layers"]:
            args = with_arg(args, "--n-gpu-layers", layers)
        if per_slot != p["ctx_per_slot"]:
            args = with_arg(args, "--ctx-size", per_slot * p["parallel"])
        kn = Knobs(**p["knobs"])
        book = planner_ledger(p["shape"], kn, [Card("", p["card_mib"], kn.compute_cap)], layers, p["cache_type"],
                              p["cache_type"], per_slot)  # fmt: skip
        past = dict(p, knob=knob, exec_start=args, ledger_mib=ledger_mib(book), gpu_layers=layers,
                    ctx_per_slot=per_slot, ctx_size=per_slot * p["parallel"])  # fmt: skip
        row = self.measure_memory(past, log)
        row["planned_total_mib"] = round(book.total_on_card / MIB, 1)
        return row

    def v100(self):
        """A Gemma-3-27B-shaped Q4_K_M (the write-up's model class), planned for a V100 16 GB
        with the card table, served with that plan on this card; then one layer and one
        context step past it."""
        return self.v100_question("v100")

    def v100_cublas(self):
        """``v100`` served by the GGML_CUDA_FORCE_CUBLAS build (``cublas_build``): prompts take
        the cuBLAS path a V100 takes, so the prefill pool the planner counts for a V100 is
        really allocated; each start is sent a 1024-token prompt (two 512-token batches),
        with the unit's lazy module loading."""
        server = self.r["phases"].get("cublas_build", {}).get("server")
        if not server:
            return {"ok": False, "error": "no cublas_build in this run"}
        return self.v100_question("v100-cublas", server=server, prompt_tokens=1024,
                                  env={"CUDA_MODULE_LOADING": "LAZY"})  # fmt: skip

    def v100_question(self, tag: str, server: str = None, prompt_tokens: int = 256, env: dict = None) -> dict:
        """The V100 16 GB plan of ``--v100-shape`` served here (by ``server`` where given, else
        the role's build), one layer and one context step past it, and the edge."""
        shape_name = self.a.v100_shape
        root = self.a.root + "-v100"
        layout = Layout(root)
        gguf_dir = Path(layout.model(f"{shape_name}-q4km"))
        out = {"shape_name": shape_name, "server": server or "the role's build", "prompt_tokens": prompt_tokens,
               "env": env}  # fmt: skip
        Path(self.a.shm).mkdir(parents=True, exist_ok=True)  # a fresh machine: the 8B phases made it before
        hub = Path(self.a.shm) / "hub"
        if hub.exists():
            shutil.rmtree(hub, ignore_errors=True)  # the 8B checkpoint: shm back for the f16 GGUF
        if not (gguf_dir / "model.gguf").exists():
            failed = self.v100_gguf(shape_name, gguf_dir, out)
            if failed:
                return failed
        Path(layout.builds).mkdir(parents=True, exist_ok=True)
        for link, target in ((layout.current_build, os.path.realpath(self.layout.current_build)),
                             (layout.current_model, str(gguf_dir))):  # fmt: skip
            if not os.path.islink(link):
                os.symlink(target, link)
        card = (V100_PCI_ID, 16130)

        def served(plan: dict) -> dict:
            if server:
                plan["exec_start"] = [server, *plan["exec_start"][1:]]
            return dict(plan, prompt_tokens=prompt_tokens, env=env, prefill_pool_made=bool(server))

        try:
            p = served(self.plan(root=root, card=card))
        except PlanError as e:
            return {**out, "ok": True, "refused": e.failure.message("v100-16gb")}
        out["plan"] = {k: p[k] for k in ("card", "card_mib", "ctx_size", "note", "ledger_mib", "shape", "exec_start",
                                         "gpu_layers", "n_layer", "cache_type")}  # fmt: skip
        p["knob"] = f"{tag} plan"
        out["at_plan"] = self.measure_memory(p, f"{tag}-plan")
        # One step past the plan, each way the planner could have gone further: one more
        # layer on the card (partial offload), or one more context step.
        steps = {}
        if p["gpu_layers"] is not None and p["gpu_layers"] <= p["n_layer"]:
            steps["one_layer_past"] = (p["gpu_layers"] + 1, p["ctx_per_slot"])
        steps["one_ctx_step_past"] = (p["gpu_layers"], p["ctx_per_slot"] + CTX_STEP)
        for name, (layers, per_slot) in steps.items():
            out[name] = self.measure_past(p, f"{tag} {name}", f"{tag}-{name}", layers, per_slot)
        lim = 16130  # what nvidia-smi reports for a V100 16 GB (the card table's figure)
        out["card_limit_mib"] = lim
        for name in ["at_plan", *steps]:
            used = out[name].get("process_mib")
            out[f"fits_card_{name}"] = None if used is None else used <= lim
        # The default reserve leaves a margin (about five context steps here) over the largest
        # "beyond the buffers" figure seen, because that figure moves between runs. At the
        # edge: plan again with the reserve this run measured (rounded up to a whole MiB),
        # start that plan and the one a context step past it. Shows the planner's arithmetic,
        # not a setting to ship: the next start may need a few MiB more.
        needed = out["at_plan"].get("reserve_needed_mib")
        if needed is not None and self.left() > 120:
            out["edge"] = self.v100_edge(tag, root, card, served, needed, lim)
        out["ok"] = True
        return out

    def v100_gguf(self, shape_name: str, gguf_dir: Path, out: dict) -> dict:
        """The random-weights Q4_K_M GGUF of ``shape_name`` made in ``gguf_dir`` (its f16 in shm,
        or on disk where shm has no room), each step recorded in ``out``; the result to return
        where a step failed, else None."""
        import math

        sys.path.insert(0, str(REPO / "bench/gpu"))
        from random_model import SHAPES, scaled, tensors

        need = 2.05 * sum(math.prod(d) for _, _, d, _ in tensors(scaled(SHAPES[shape_name],
                                                                      self.a.scale_down)))  # fmt: skip
        gguf_dir.mkdir(parents=True, exist_ok=True)
        places = [Path(self.a.shm), gguf_dir]
        free = {str(p): shutil.disk_usage(p).free for p in places}
        room = [p for p in places if free[str(p)] > need * (1 if p != gguf_dir else 1.35)]
        out["f16_room"] = {"needed": int(need), "free": free}
        if not room:
            return {**out, "ok": False, "error": "no room for the f16 GGUF (shm or disk)"}
        f16 = room[0] / "v100-f16.gguf"
        cmd = [self.a.gen_python, str(REPO / "bench/gpu/random_model.py"), "gguf", shape_name, str(f16),
               "--gguf-py", f"{self.layout.src}/gguf-py", "--scale-down", str(self.a.scale_down)]  # fmt: skip
        rc, text, s = self.sh(cmd, "gguf-v100.log", timeout=max(30, self.left() - 200))
        out["f16_gguf"] = {"rc": rc, "seconds": s, "info": text.strip().splitlines()[-1][:2000]}
        if rc:
            return {**out, "ok": False}
        q = f"{os.path.realpath(self.layout.current_build)}/bin/llama-quantize"
        rc, text, s = self.sh([q, str(f16), str(gguf_dir / "model.gguf.tmp"), "Q4_K_M"], "quantize-v100.log",
                              timeout=max(30, self.left() - 60))  # fmt: skip
        f16.unlink(missing_ok=True)
        out["quantize"] = {"rc": rc, "seconds": s, "command": f"{q} F16 OUT Q4_K_M",
                           "tail": text.strip().splitlines()[-2:]}  # fmt: skip
        if rc:
            return {**out, "ok": False}
        (gguf_dir / "model.gguf.tmp").rename(gguf_dir / "model.gguf")
        return None

    def v100_edge(self, tag: str, root: str, card: tuple, served, needed: float, lim: int) -> dict:
        """The V100 plan again with the reserve this run measured (``needed``, rounded up to a
        whole MiB), started at that plan and a context step past it (``served``: the plan as
        the phase serves it; ``lim``: the card's MiB)."""
        reserve = int(-(-needed // 1))
        try:
            q = served(self.plan(root=root, card=card, server_memory_reserve_mib=reserve))
        except PlanError as e:
            return {"reserve_mib": reserve, "refused": e.failure.message("v100-16gb")}
        q["knob"] = f"{tag} edge, reserve {reserve}"
        edge = {"reserve_mib": reserve, "ctx_size": q["ctx_size"], "gpu_layers": q["gpu_layers"],
                "note": q["note"], "at_plan": self.measure_memory(q, f"{tag}-edge")}  # fmt: skip
        if self.left() > 60:
            edge["one_ctx_step_past"] = self.measure_past(q, f"{tag} edge, one ctx step past",
                                                          f"{tag}-edge-past", q["gpu_layers"],
                                                          q["ctx_per_slot"] + CTX_STEP)  # fmt: skip
        for k in ("at_plan", "one_ctx_step_past"):
            used = edge.get(k, {}).get("process_mib")
            edge[f"fits_card_{k}"] = None if used is None else used <= lim
        return edge

    # ----------------------------------------------------------------------

    PHASES = (("machine", 5), ("build", 480), ("model8b", 120), ("roofline", 20), ("bench8b", 90),
              ("serve8b", 200), ("pinning", 150), ("memory8b", 180), ("smi", 10), ("modload", 90),
              ("cublas_build", 420), ("cublas", 150), ("v100", 400), ("v100_cublas", 400))  # fmt: skip

    def run(self, only) -> None:
        if "model8b" in only:
            self.start_checkpoint()
        for name, estimate in self.PHASES:
            if name not in only or done(self.r["phases"].get(name, {})):
                continue
            if name != "machine" and self.left() < estimate:
                self.log(f"{name}: {self.left():.0f}s left, estimate {estimate}s: left for the next command")
                self.r.setdefault("not_run", {})[name] = f"estimate {estimate}s > {self.left():.0f}s left"
                if name in ("build", "model8b"):
                    break  # the later phases need these
                continue
            self.log(f"{name}: start")
            start = time.time()
            try:
                res = getattr(self, name)() or {}
            except Exception as e:  # recorded, and the next phase still runs
                import traceback

                res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-800:]}
            res["phase_seconds"] = round(time.time() - start, 1)
            res["run"] = len(provenance.runs_of(self.earlier))  # this command's place in the stamp's runs
            if name == "machine":
                self.r["machine"] = res
                res = {"ok": "error" not in res, "phase_seconds": res["phase_seconds"]}
            self.r["phases"][name] = res
            self.r.get("not_run", {}).pop(name, None)
            self.save()
            self.log(f"{name}: ok={res.get('ok')} in {res['phase_seconds']}s")
            if name in ("build", "model8b") and not done(res):
                break
        self.save()


# --------------------------------------------------------------------------
# the summary: figures derived from the raw results, each with what it was measured on
# --------------------------------------------------------------------------


def bench_ts(bench: dict, run: str, **match):
    """The tokens per second of the first result of ``bench``'s ``run`` matching ``match``."""
    for x in bench.get("runs", {}).get(run, {}).get("results", []):
        if all(x.get(k) == v for k, v in match.items()):
            return round(x["avg_ts"], 1)
    return None


def served_variants(serve: dict, tg) -> dict:
    """Each server variant's decode, beside llama-bench's tg128 (``tg``)."""
    out = {}
    for name, var in serve.get("decode_variants", {}).items():
        if "default_sampling" in var:
            vs = round(var["default_sampling"]["median_tps"], 1)
            out[name] = {
                "extra_args": var["extra_args"], "tps_default_sampling": vs,
                "tps_greedy": round(var["greedy"]["median_tps"], 1),
                "over_llama_bench": round(vs / tg, 3) if tg else None,
                "greedy_tokens_same_as_unit": var["greedy"]["tokens_sha256"] == serve["decode_greedy"]["tokens_sha256"],
            }  # fmt: skip
    return out


def pinning_summary(pin: dict) -> dict:
    """The pinning phase's decode figures, pinned and not."""
    ref = pin["bench"]["unpinned"]["tg128_tps"]
    return {
        "run": pin.get("run"),  # which of the stamp's runs (its machine) measured it
        "llama_bench_tg128_tps": {k: round(b["tg128_tps"], 1) for k, b in pin["bench"].items()
                                  if b.get("tg128_tps")},
        "served_tps_default_sampling": {k: round(x["default_sampling"]["median_tps"], 1)
                                        for k, x in pin["served"].items() if "default_sampling" in x},
        "served_over_llama_bench_unpinned": {k: round(x["default_sampling"]["median_tps"] / ref, 3)
                                             for k, x in pin["served"].items() if "default_sampling" in x},
        "one_cpu": pin.get("one_cpu"), "cpuidle": pin.get("cpuidle"),
    }  # fmt: skip


def model_8b(phase: dict) -> dict:
    """How the 8B model was made: by the model role, or (the role's route failed) by the
    fallback, with the size of the GGUF the later phases served."""
    made = phase if phase.get("ok") else phase.get("fallback") or {}
    return {"route": phase.get("route"), "made_by_the_role": bool(phase.get("ok")),
            "systemd_run": phase.get("systemd_run"), "gguf_bytes": made.get("gguf_bytes")}  # fmt: skip


def served_label(flags: list) -> str:
    """The served llama-bench run's name from its own flags: its KV type and flash attention
    (llama-bench's defaults where a flag is not given)."""
    value = lambda flag, default: flags[flags.index(flag) + 1] if flag in flags[:-1] else default  # noqa: E731
    fa = {"1": "on", "0": "off"}.get(value("-fa", "auto"), value("-fa", "auto"))
    return f"{value('-ctk', 'f16')}_kv_fa_{fa}"


def decode_summary(ph: dict) -> dict:
    """The 8B's decode: served against llama-bench's tg128 and the copy-bandwidth roofline."""
    serve, bench, roof = ph["serve8b"], ph["bench8b"], ph.get("roofline", {})
    model = model_8b(ph.get("model8b", {}))
    tg = bench_ts(bench, "served_flags", n_prompt=0, n_gen=128)
    served = round(serve["decode_default_sampling"]["median_tps"], 1)
    d = {"served_exec_start": serve["plan"]["exec_start"], "llama_bench_flags": bench["served_flags"],
         "served_tps_default_sampling": served,
         "served_tps_greedy": round(serve["decode_greedy"]["median_tps"], 1),
         "llama_bench_tg128_tps": tg, "served_over_llama_bench": round(served / tg, 3) if tg else None,
         "goal_0_97_met": bool(tg and served / tg >= 0.97)}  # fmt: skip
    if roof.get("bandwidth_GBps") and model.get("gguf_bytes"):
        limit = roof["bandwidth_GBps"] * 1e9 / model["gguf_bytes"]
        d.update(copy_bandwidth_GBps=roof["bandwidth_GBps"], weight_bytes=model["gguf_bytes"],
                 roofline_tps=round(limit, 1), llama_bench_roofline_fraction=round(tg / limit, 3) if tg else None,
                 served_roofline_fraction=round(served / limit, 3))  # fmt: skip
    served_as = served_label(bench["served_flags"])
    d["llama_bench_tg128_variants"] = {
        f"{served_as} (served)": tg,
        "f16_kv_fa_on": bench_ts(bench, "kv_f16_fa_on_off", n_gen=128, flash_attn=1),
        "f16_kv_fa_off": bench_ts(bench, "kv_f16_fa_on_off", n_gen=128, flash_attn=0),
        "q8_0_kv_fa_on": bench_ts(bench, "kv_q8_0", n_gen=128),
        f"{served_as}_cuda_graphs_off": bench_ts(bench, "cuda_graphs_off", n_gen=128),
    }  # fmt: skip
    d["served_variants"] = served_variants(serve, tg)
    pin = ph.get("pinning", {})
    if pin.get("ok"):
        d["pinning"] = pinning_summary(pin)
    return d


def prefill_summary(ph: dict) -> dict:
    """The 8B's prefill: llama-bench's pp512 (and by ubatch) beside the server's."""
    serve, bench = ph["serve8b"], ph["bench8b"]
    return {
        "llama_bench_pp512_tps": bench_ts(bench, "served_flags", n_prompt=512, n_gen=0),
        "served_single_pp512_tps": round(serve["prefill_single_pp512"]["median_tps"], 1),
        "served_aggregate_tps": {n: a["median_aggregate_tps"] for n, a in serve.get("aggregate_prefill", {}).items()},
        "llama_bench_pp_by_ubatch": {f"pp{x['n_prompt']} ub{x['n_ubatch']}": round(x["avg_ts"], 1)
                                     for x in bench.get("runs", {}).get("ubatch", {}).get("results", [])},
    }  # fmt: skip


def memory_item(phase, row: dict) -> dict:
    """One measured start (``row`` of ``memory8b``, or of a V100 ``phase``): planned and logged."""
    lm = row["log_mib"]
    return {
        "model": phase.get("shape_name", "v100") if phase else "llama3-8b", "knob": row.get("knob"),
        "ctx": row["ctx_size"], "parallel": row.get("parallel"), "kv_type": row["cache_type"],
        "gpu_layers": row.get("gpu_layers"), "planned": row["ledger_mib"],
        "log": {"model_gpu": lm["weights_gpu"], "model_host": lm["weights_host"], "kv_gpu": lm["kv"],
                "kv_host": lm["kv_host"], "compute_gpu": lm["compute_gpu"]},
        "process_mib": row.get("process_mib"), "error": row["error"],
        "reserve_needed_mib": row.get("reserve_needed_mib"),
        "beyond_log_buffers_mib": row.get("beyond_log_buffers_mib"),
    }  # fmt: skip


def worst_errors(items: list) -> dict:
    """The largest planning error of each item (weights, kv, compute) over ``items``."""
    worst = {}
    for item in items:
        for k in ("weights", "kv", "compute"):
            e = item["error"].get(k)
            if e is not None and abs(e) >= abs(worst.get(k, 0)):
                worst[k] = e
    return worst


def memory_plan_summary(ph: dict):
    """The planner's ledger against each measured start (None where none was measured)."""
    rows = [r for r in ph.get("memory8b", {}).get("rows", []) if "error" in r]
    rows_v = [(ph[phase], ph[phase][k]) for phase in ("v100", "v100_cublas") if phase in ph
              for k in ("at_plan", "one_layer_past", "one_ctx_step_past") if k in ph[phase]]  # fmt: skip
    if not (rows or rows_v):
        return None
    items = [memory_item(phase, row) for phase, row in [(None, r) for r in rows] + rows_v]
    worst = worst_errors(items)
    # The goal is set on the 3 contexts x 2 KV types (the 8B rows without a knob).
    goal_worst = worst_errors([i for i in items if i["knob"] is None and i["model"] == "llama3-8b"])
    needed = [i["reserve_needed_mib"] for i in items if i["reserve_needed_mib"] is not None]
    out = {"rows": items, "worst_error_by_item": worst,
           "worst_error_3_contexts_x_2_kv_types": goal_worst,
           "goal_within_3_percent": {k: abs(e) <= 0.03 for k, e in goal_worst.items()},
           "within_3_percent_every_row": {k: abs(e) <= 0.03 for k, e in worst.items()}}  # fmt: skip
    if needed:
        out["reserve"] = {"today_mib": items[0]["planned"]["reserve"], **reserve_from(needed)}
    return out


def cublas_prefill_summary(c: dict) -> dict:
    """The cuBLAS build's prefill pool, measured and as the planner counts it."""
    from roles.server.planner import prefill_pool_bytes

    shape = {"head_dim_v": c["shape"]["head_dim_k"], "file_type": 15, **c["shape"]}  # the Q4_K_M 8B
    return {
        "cublas_over_mmq_mib": c["cublas_over_mmq_mib"],
        # the H200's cuBLAS path keeps an f16 product buffer, as a P100's (6.0) does
        "planned_mib_as_6_0": {str(t): round(prefill_pool_bytes(shape, "6.0", t) / MIB, 1)
                               for t in (128, 512)},
        "planned_mib_for_a_v100": round(prefill_pool_bytes(shape, "7.0") / MIB, 1),
    }  # fmt: skip


def summarize(r: dict) -> dict:
    """Derived figures (ratios, errors, the reserve) from the phases' raw results."""
    ph = r["phases"]
    build = ph.get("build", {})
    out = {"machine": {k: r.get("machine", {}).get(k) for k in ("nvidia_smi", "nvcc", "torch", "cpu", "cpus")},
           "llamacpp": {"commit": r.get("machine", {}).get("llamacpp_commit"), "version": build.get("version"),
                        "cmake_args": (build.get("build_info") or {}).get("cmake_args"),
                        "build_seconds": build.get("seconds")}}  # fmt: skip
    if "model8b" in ph:
        out["model_8b"] = model_8b(ph["model8b"])
    if ph.get("serve8b", {}).get("ok") and ph.get("bench8b", {}).get("ok"):
        out["decode_8b"] = decode_summary(ph)
        out["prefill_8b"] = prefill_summary(ph)
    memory_plan = memory_plan_summary(ph)
    if memory_plan:
        out["memory_plan"] = memory_plan
    for key, phase in (("v100_question", "v100"), ("v100_question_cublas", "v100_cublas")):
        question = v100_summary(ph.get(phase, {}))
        if question:
            out[key] = question
    m, c, smi = ph.get("modload", {}), ph.get("cublas", {}), ph.get("smi", {})
    if m.get("ok") and m.get("eager_over_lazy_mib") is not None:
        out["module_loading"] = {"lazy_process_mib": m["lazy"]["process_mib"], "eager_process_mib": m["eager"]["process_mib"],
                                 "eager_over_lazy_mib": m["eager_over_lazy_mib"], "prompt_tokens": 512,
                                 "note": "the 8B plan; the unit sets CUDA_MODULE_LOADING=LAZY"}  # fmt: skip
    if c.get("ok") and c.get("cublas_over_mmq_mib"):
        out["cublas_prefill"] = cublas_prefill_summary(c)
    if smi.get("ok") and "query_gpu" in smi:
        out["nvidia_smi_cpu_s"] = {k: smi[k]["cpu_s_median"] for k in ("query_gpu", "query_compute_apps")}
        out["nvidia_smi_cpu_s"]["both_in_one_run"] = smi["both_in_one_run"]["output"].strip()
    return out


def v100_summary(v: dict) -> dict:
    """The V100 question's figures from a ``v100`` or ``v100_cublas`` phase (None before it ran)."""
    if not (v.get("ok") and "plan" in v):
        return None
    steps = ("at_plan", "one_layer_past", "one_ctx_step_past")
    out = {
        "shape": f"{v.get('shape_name')} (random weights), Q4_K_M", "gguf_bytes": v["plan"]["shape"]["size"],
        "server": v.get("server", "the role's build"), "prompt_tokens": v.get("prompt_tokens", 256),
        "card_mib": v["plan"]["card_mib"], "card": v["plan"]["card"], "planned_ctx": v["plan"]["ctx_size"],
        "planned_gpu_layers": v["plan"]["gpu_layers"], "n_layer": v["plan"]["n_layer"],
        "planned_kv_type": v["plan"]["cache_type"], "plan_note": v["plan"]["note"],
        "card_limit_mib": v.get("card_limit_mib"),
        **{f"{k}_planned_total_mib": v[k].get("planned_total_mib") for k in steps if k in v},
        **{f"{k}_process_mib": v[k].get("process_mib") for k in steps if k in v},
        **{k: v[k] for k in v if k.startswith("fits_card_")},
        "quantize_seconds": (v.get("quantize") or {}).get("seconds"),
    }  # fmt: skip
    e = v.get("edge")
    if e and e.get("not_valid"):
        out["edge_not_valid"] = e["not_valid"]
    elif e and "at_plan" in e:
        out["edge"] = {
            "reserve_mib": e["reserve_mib"], "planned_ctx": e["ctx_size"], "gpu_layers": e["gpu_layers"],
            **{f"{k}_planned_total_mib": e[k].get("planned_total_mib") for k in ("at_plan", "one_ctx_step_past")
               if k in e},
            **{f"{k}_process_mib": e[k].get("process_mib") for k in ("at_plan", "one_ctx_step_past") if k in e},
            **{k: e[k] for k in e if k.startswith("fits_card_")},
        }  # fmt: skip
    return out

def merge(paths: list) -> dict:
    """Several commands' results (machines of one kind, each from ``machine,build,model8b``
    on), phase by phase in order: a later file's phase replaces an earlier one where the
    earlier is not done. The stamps' runs are kept in order (each phase's ``run`` counted
    in them), the summary made again."""
    out, stamps = {"phases": {}}, []
    for path in paths:
        r = json.loads(Path(path).read_text())
        before = len(provenance.runs_of(provenance.merged(stamps))) if stamps else 0
        for name, phase in r.get("phases", {}).items():
            if not done(out["phases"].get(name, {})):
                out["phases"][name] = {**phase, "run": before + phase.get("run", 0)}
        out.setdefault("machine", r.get("machine"))
        stamps += [r["provenance"]] if r.get("provenance") else []
    out.update(what=WHAT, written=provenance.now(), summary=summarize(out))
    out["not_run"] = {n: "in none of the merged results" for n, _ in Proof.PHASES if n not in out["phases"]}
    out["provenance"] = {**provenance.merged(stamps), "merged_by": provenance.stamp(__file__)} if stamps else None
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default=",".join(n for n, _ in Proof.PHASES))
    ap.add_argument("--limit", type=float, default=560, help="seconds this command may run (the machine's limit is 600)")
    ap.add_argument("--root", default="/tmp/llamarack")
    ap.add_argument("--work", default="/tmp/gpuproof")
    ap.add_argument("--shm", default="/dev/shm/gpuproof")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpuproof/out"))
    ap.add_argument("--commit", default=(REPO / ".carry/commit").read_text().strip()
                    if (REPO / ".carry/commit").exists() else None)  # fmt: skip
    ap.add_argument("--convert-python", default="python3")
    ap.add_argument("--gen-python", default=sys.executable, help="python with torch and safetensors")
    ap.add_argument("--cpu-check", metavar="BIN", help="a CPU build's bin/ folder: prove the scripts on a CPU")
    ap.add_argument("--cpu-src", help="with --cpu-check: a llama.cpp source tree (the converter, gguf-py)")
    ap.add_argument("--scale-down", type=int, default=1)
    ap.add_argument("--contexts", default="2048,4096,8192")
    ap.add_argument("--v100-shape", default="gemma3-27b", help="the shape planned for a V100 16 GB")
    ap.add_argument("--parallel", default="4,8", help="server_parallel values for the aggregate prefill")
    ap.add_argument("--merge", metavar="JSON", nargs="+",
                    help="merge results files phase by phase into OUT/gpu-proof.json (the summary made again), and stop")
    a = ap.parse_args(argv)
    if a.merge:
        r = merge(a.merge)
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "gpu-proof.json").write_text(dumps(r) + "\n")
        print(json.dumps({k: v.get("ok") for k, v in r["phases"].items()}))
        return
    a.contexts = [int(x) for x in a.contexts.split(",")]
    a.parallel = [int(x) for x in a.parallel.split(",") if x]
    proof = Proof(a)
    proof.run(set(a.phases.split(",")))
    proof.r["summary"] = summarize(proof.r)
    proof.save()
    print(json.dumps({k: v.get("ok") for k, v in proof.r["phases"].items()}))


if __name__ == "__main__":
    main()
