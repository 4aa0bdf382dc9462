"""What llama-server runs with on one host: the context that fits the card, and the unit
that serves it. Pure functions of settings and facts; the memory arithmetic is
``roles/server/planner.py``, the same code that ``llamarack plan`` runs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from llamarack.errors import Failure
from llamarack.gpu_table import board
from llamarack.layout import API_KEY_PATH, UNIT_NAME, unit_index, unit_name, unit_path
from llamarack.templates import template
from roles.llamacpp.files.llamacpp_proof import bench_args as proof_bench_args
from roles.llamacpp.files.llamacpp_proof import serving_args
from roles.llamacpp.plan import serving_inputs
from roles.llamacpp.reads import ServerFlags
from roles.settings import Settings

from . import unitfile
from .card_layout import Layout, Unit, cards_of, choose_layout, rival_layout, settle
from .files import bench_record
from .host_ram import HostLedger, HostRam, host_ledger, unit_share
from .planner import MIB, Knobs, Plan, PlanError  # noqa: F401 (MIB, PlanError: the role's API)
from .reads import HEALTH_MARK, RESIDENCY_MARK  # noqa: F401 (the role's API)

# The role's templates; a file of the same name in an override folder (the project's templates/) replaces one.
TEMPLATES = Path(__file__).resolve().parent / "templates"
UNIT_TEMPLATE = "llama-server.service.j2"


def knobs(settings: Settings) -> Knobs:
    """The planner's inputs from the ``server_*`` settings."""
    s = settings.server
    return Knobs(ctx_size=s.ctx_size, parallel=s.parallel, cache_type_k=s.cache_type_k,
                 cache_type_v=s.cache_type_v, flash_attn=s.flash_attn, gpu_layers=s.gpu_layers,
                 min_ctx_size=s.min_ctx_size, rope_scaling=s.rope_scaling, rope_scale=s.rope_scale,
                 rope_orig_ctx=s.rope_orig_ctx, reserve_mib=s.memory_reserve_mib,
                 draft_gpu_layers=s.draft_gpu_layers)  # fmt: skip


def host_ram(settings: Settings, flags: ServerFlags) -> HostRam:
    """The host-RAM plan's inputs from the ``server_*`` settings; the prompt cache only where
    this build's llama-server has ``--cache-ram``."""
    s = settings.server
    return HostRam(s.cache_ram, s.cache_ram_min, s.host_ram_reserve_mib, getattr(flags, "has_cache_ram", False))


def _unbuilt(code: str, given: str, lacks: str, wanted: str, undo: str) -> PlanError:
    """The refusal of a setting whose flag this build's llama-server --help lacks."""
    return PlanError(Failure(code, f"{given}, but this build's llama-server --help {lacks}", wanted,
                             f"pin a newer llamacpp_commit, or {undo}"))  # fmt: skip


def server_args(settings: Settings, flags: ServerFlags, build_dir: str, model_dir: str,
                ctx: Plan, cuda: bool, draft_dir: Optional[str] = None, port: Optional[int] = None,
                split: tuple = (), cache_ram: Optional[int] = None) -> list[str]:  # fmt: skip
    """llama-server's command line, spelled as the built binary's --help says; ``port``: the
    unit's (``server_port`` when None), ``split``: a unit's split flags over several cards
    (``Plan.split_args``), ``cache_ram``: its ``--cache-ram`` (the host-RAM ledger's;
    ``server_cache_ram`` when None), written where the build has the prompt cache. Raises
    PlanError when a setting needs a flag this build does not have."""
    s = settings.server
    if s.api_key_file and not flags.has_api_key_file:
        raise _unbuilt("api-key-file", "server_api_key_file set", "has no --api-key-file",
                       "a llama.cpp build that reads the key from a file (never from the command line)",
                       "unset server_api_key_file")  # fmt: skip
    args = [f"{build_dir}/bin/llama-server", "--model", f"{model_dir}/model.gguf",
            "--host", s.listen, "--port", str(s.port if port is None else port), "--ctx-size", str(ctx.ctx_size),
            "--parallel", str(ctx.parallel)]  # fmt: skip
    if getattr(flags, "has_cache_ram", False):  # BuildFlags knows; a bare ServerFlags does not
        args += ["--cache-ram", str(s.cache_ram if cache_ram is None else cache_ram)]
    # The same runtime flags the build's smoke run computed with, plus any it needed
    # (flags.proven_args, e.g. --no-repack on a CPU whose AMX faults); the KV
    # types and layers the plan chose.
    serving = {**serving_inputs(settings), "cache_type_k": ctx.cache_type_k, "cache_type_v": ctx.cache_type_v,
               "gpu_layers": ctx.gpu_layers if cuda else None}  # fmt: skip
    args += serving_args(flags, serving) + list(split) + rope_args(flags, ctx)
    if draft_dir:
        args += draft_args(settings, flags, draft_dir, ctx, cuda)
    if s.api_key_file:
        args += ["--api-key-file", API_KEY_PATH]
    if backend_sampling(settings, flags, cuda):
        args += ["--backend-sampling"]
    if s.sleep_idle_seconds is not None:
        if not getattr(flags, "has_sleep_idle", False):
            raise _unbuilt("sleep-idle", f"server_sleep_idle_seconds {s.sleep_idle_seconds}",
                           "has no --sleep-idle-seconds", "a llama.cpp build whose server sleeps while idle",
                           "unset server_sleep_idle_seconds")
        args += ["--sleep-idle-seconds", str(s.sleep_idle_seconds)]
    if flags.has_metrics:
        args += ["--metrics"]
    return args


def backend_sampling(settings: Settings, flags: ServerFlags, cuda: bool) -> bool:
    """Whether the unit samples on the backend (``server_backend_sampling``): on, or auto on a
    CUDA build whose --help has --backend-sampling (on a CPU build the backend is the CPU:
    nothing to gain). PlanError for on where this build lacks the flag."""
    mode, built = settings.server.backend_sampling, getattr(flags, "has_backend_sampling", False)
    if mode == "on" and not built:
        raise _unbuilt("backend-sampling", "server_backend_sampling 'on'", "has no --backend-sampling",
                       "a llama.cpp build that samples on the backend",
                       "set server_backend_sampling = 'auto' (on where the build has it)")  # fmt: skip
    return mode == "on" or (mode == "auto" and cuda and built)


def rope_args(flags: ServerFlags, ctx: Plan) -> list[str]:
    """--rope-scaling/--rope-scale/--yarn-orig-ctx for a plan past the trained
    context; PlanError when this build's --help lacks them."""
    if not ctx.rope:
        return []
    # BuildFlags (the LlamaServerFlags fact) knows; a bare ServerFlags does not.
    if not getattr(flags, "has_rope_scaling", False):
        raise _unbuilt("rope-scaling", f"server_rope_scaling {ctx.rope[0]!r}",
                       "lacks --rope-scaling, --rope-scale or --yarn-orig-ctx",
                       "a llama.cpp build with RoPE scaling options", "set server_rope_scaling = 'none'")
    method, scale, orig = ctx.rope
    args = ["--rope-scaling", method, "--rope-scale", f"{scale:g}"]
    return args + (["--yarn-orig-ctx", str(orig)] if method == "yarn" else [])


def draft_args(settings: Settings, flags: ServerFlags, draft_dir: str, ctx: Plan, cuda: bool) -> list[str]:
    """Speculative decoding with the draft model in ``draft_dir``: its KV types are the
    plan's (the planner counted them so), its layers on the card those the plan placed;
    PlanError when this build's --help lacks the options."""
    if not getattr(flags, "has_spec_draft", False):
        raise _unbuilt("spec-draft", "model_draft_repo set", "lacks --spec-type draft-simple or a --spec-draft-* "
                       "option (model, n-max, n-min, ngl, type-k, type-v)",
                       "a llama.cpp build with --spec-draft-* options", "unset model_draft_repo")
    s = settings.server
    args = ["--spec-type", "draft-simple", "--spec-draft-model", f"{draft_dir}/model.gguf",
            "--spec-draft-n-max", str(s.draft_max), "--spec-draft-n-min", str(s.draft_min),
            "--spec-draft-type-k", ctx.cache_type_k, "--spec-draft-type-v", ctx.cache_type_v]  # fmt: skip
    if cuda:
        args += ["--spec-draft-ngl", str(ctx.ledger.draft_gpu_layers)]
    return args


# llama-bench's prompt (pp512): the build's proof computes a batch at least this large.
BENCH_PROMPT = 512


def bench_args(settings: Settings, flags: ServerFlags, build_dir: str, model_dir: str, ctx: Plan,
               cuda: bool) -> list[str]:  # fmt: skip
    """llama-bench's command line for pp512 and tg128 with the served flags (KV types,
    layers on the card, flash attention, mmap, repacking), as llama-bench spells them."""
    s = settings.server
    serving = {"cache_type_k": ctx.cache_type_k, "cache_type_v": ctx.cache_type_v, "flash_attn": s.flash_attn,
               "gpu_layers": ctx.gpu_layers if cuda else None, "mmap": s.mmap, "repack": s.repack}  # fmt: skip
    return [f"{build_dir}/bin/llama-bench", "-m", f"{model_dir}/model.gguf", "-p", str(BENCH_PROMPT), "-n", "128",
            *proof_bench_args(flags, serving)]  # fmt: skip


def bench_split_args(plan: Any) -> list[str]:
    """llama-bench's spelling of a unit's split over several cards (``-sm``, ``-ts`` with
    ``/``, ``-mg``); none for one card."""
    if len(plan.ledger.cards) < 2:
        return []
    return ["-sm", plan.split_mode, "-ts", "/".join(map(str, plan.ledger.tensor_split)),
            "-mg", str(plan.ledger.main_gpu)]  # fmt: skip


def roofline(cards: tuple, shape: dict) -> dict:
    """Decode's ceiling on the host's slowest card: its memory bandwidth (the card table's
    data-sheet figure) over the bytes every token reads (each layer's weights and the
    output layer; the token embedding is a lookup of one row)."""
    output = shape["output_bytes"] + (shape["token_embd_bytes"] if shape["tied_embeddings"] else 0)
    weights = sum(shape["layer_bytes"]) + output
    known = [b for b in (board(g.pci_device_id) for g in cards) if b and b.bandwidth_gbs]
    slowest = min(known, key=lambda b: b.bandwidth_gbs, default=None)
    return {"card": slowest.name if slowest else None, "bandwidth_gbs": slowest.bandwidth_gbs if slowest else None,
            "weight_bytes": weights,
            "tokens_per_second": round(slowest.bandwidth_gbs * 1e9 / weights, 1) if slowest else None}  # fmt: skip


def serving_lines(settings: Settings, address: str, record: Optional[dict], gpus: tuple) -> str:
    """Where each unit of the host serves, a line each, with its cards: ``address``, how clients
    reach the host; ``record``: its units record (``state/units.json``; None: the one unit at
    ``server_port``); ``gpus``: the run's cards (``Gpu``), by which a unit's UUIDs are named."""
    units = (record or {}).get("units") or [{"index": 0, "port": settings.server.port, "cards": None}]
    key = "API key required" if settings.server.api_key_file else "no API key"
    named = {g.uuid: f"GPU {g.index} ({g.name})" for g in gpus}
    lines = []
    for unit in units:
        listen = unit.get("listen") or settings.server.listen
        where = address if listen in ("0.0.0.0", "::", "") else listen
        url = f"http://{f'[{where}]' if ':' in where else where}:{unit['port']}"
        cards, cpu = unit.get("cards"), settings.llamacpp.backend != "cuda"
        on = [unit_name(unit["index"]).removesuffix(".service")] if len(units) > 1 else []
        if cards:
            on.append("on " + ", ".join(named.get(c, f"card {c}") for c in cards) + (", computing on the CPU" if cpu
                                                                                     else ""))  # fmt: skip
        elif cards is not None and cpu:
            on.append("on the CPU")
        lines.append(f"serving: {url}/v1/chat/completions (OpenAI API), {url}/completion, health at {url}/health "
                     f"({key})" + (f": {' '.join(on)}" if on else ""))  # fmt: skip
    return "\n".join(lines)


def health_url(settings: Settings, port: Optional[int] = None) -> str:
    """Where llama-server's /health answers, seen from its own host (``port``: a unit's,
    ``server_port`` when None)."""
    listen = settings.server.listen
    addr = "127.0.0.1" if listen in ("0.0.0.0", "") else "::1" if listen == "::" else listen
    if ":" in addr:
        addr = f"[{addr}]"
    return f"http://{addr}:{settings.server.port if port is None else port}/health"


# The names of major 195, the control and card nodes: ``nvidia-frontend`` before driver 550.40,
# ``nvidia`` and ``nvidiactl`` from it on (docs/ARCHITECTURE.md, "The served unit's sandbox").
MAJOR_195_NAMES = ("nvidia-frontend", "nvidia", "nvidiactl")
_DEVICE_NAME = re.compile(r"nvidia[a-z0-9_-]*")


def device_names(devices: tuple, cuda: bool) -> tuple[str, ...]:
    """The ``/proc/devices`` names (of the host's ``CharDevices``) the unit's ``DeviceAllow=char-NAME``
    lines allow: none for a CPU build; else every ``nvidia*`` name, plus ``nvidia-uvm``, and when
    nothing is at major 195 (the module not loaded when the host was read), the names of both
    driver eras, so a driver loaded later is still reached."""
    if not cuda:
        return ()
    names = [d.name for d in devices if _DEVICE_NAME.fullmatch(d.name)]
    if not any(d.major == 195 and d.name in names for d in devices):
        names += MAJOR_195_NAMES
    names.append("nvidia-uvm")
    return tuple(dict.fromkeys(names))


ARCH_SHOWN = 64  # characters of general.architecture in Description= (llama.cpp's names have at most 20)


def render_unit(settings: Settings, args: list[str], description: str, overrides: tuple = (),
                devices: tuple = (), residency_on: Optional[tuple] = None, port: Optional[int] = None,
                visible: tuple = (), name: str = UNIT_NAME) -> str:  # fmt: skip
    """The unit file; ``overrides``: folders whose templates win over the role's own;
    ``devices``: the character device names it may open (``device_names``);
    ``residency_on``: (card UUIDs, planned weights MiB) of a CUDA unit; ``port``: the unit's
    (its health line's); ``visible``: the UUIDs of the cards CUDA shows it, in its device order.
    Every value is escaped for systemd by ``roles.server.unitfile`` (the template only places
    them): ``description`` holds the GGUF's own metadata."""
    on = f"{','.join(residency_on[0])} {int(residency_on[1])}" if residency_on and residency_on[0] else ""
    return template(UNIT_TEMPLATE, TEMPLATES, overrides).render(
        description=unitfile.text(description),
        health_line=unitfile.comment(HEALTH_MARK + health_url(settings, port)),
        residency_line=unitfile.comment(RESIDENCY_MARK + on) if on else "",
        post_start=post_start(settings, health_url(settings, port), name, on) if on else "",
        user=unitfile.value("User", settings.general.service_user),
        exec_start=unitfile.exec_line(args),
        working_directory=unitfile.value("WorkingDirectory", settings.general.root),
        device_allow=[unitfile.value("DeviceAllow", f"char-{name} rw") for name in devices],
        visible_devices=unitfile.value("Environment", "CUDA_VISIBLE_DEVICES=" + ",".join(map(_card_id, visible)))
        if visible else "",
    )


def post_start(settings: Settings, url: str, name: str, on: str) -> str:
    """The unit's ``ExecStartPost=`` (less its ``+``): the check after each start, boot included,
    that it answers ``url`` within ``server_health_timeout`` from its cards (``on``: its
    residency line's "UUID[,UUID...] WEIGHTS_MIB"), the switch's own check."""
    return unitfile.exec_line(["/usr/bin/python3", "-I", "-S", settings.layout.unit_check, url, name,
                               str(settings.server.health_timeout), on])  # fmt: skip


# What nvidia-smi prints as a card's UUID (GPU-<hex and dashes>, MIG-...): nothing else
# reaches Environment=, whose value systemd splits on spaces and unquotes.
_CARD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def _card_id(uuid: str) -> str:
    if not _CARD_ID.fullmatch(uuid or ""):
        raise PlanError(Failure("card-uuid", f"card UUID {uuid!r}", "letters, digits, - and _, as nvidia-smi prints",
                                "check what nvidia-smi -L prints on the host"))  # fmt: skip
    return uuid


@dataclass(frozen=True)
class UnitRef:
    """Where one llama-server unit lives: its index among several (None: the host's one),
    its name, file and port (``server_port`` + its index)."""

    index: Optional[int]
    name: str
    path: str
    port: int


def unit_ref(settings: Settings, index: Optional[int]) -> UnitRef:
    name = unit_name(index)
    return UnitRef(index, name, unit_path(name), settings.server.port + (index or 0))


@dataclass(frozen=True)
class WantedUnit:
    ref: UnitRef
    text: str  # the unit file
    plan: Plan
    cards: tuple  # the UUIDs of its cards, in its device order
    memory: Optional[HostLedger] = None  # the host's units against its memory (the same for each unit)

    @property
    def share(self):
        """Its own part of the host-RAM ledger (``UnitShare``), or None."""
        return next((u for u in self.memory.units if u.name == self.ref.name), None) if self.memory else None


def host_layouts(settings: Settings, shape: dict, gpus: tuple, draft_shape: Optional[dict] = None,
                 bench: Any = None, model: Optional[str] = None) -> tuple:  # fmt: skip
    """(the layout the host's cards make, ``server_layout`` and ``server_split_mode``; the
    layout the ledger alone could not rank against it, or None): where the ledger cannot
    choose (``card_layout.rival_layout``, CUDA builds), the host's llama-bench record of the
    served model (``bench``, when it names ``model``) picks the faster (``card_layout.settle``);
    without figures of both, the ledger's answer. ``bench`` may be a function that reads the
    record: it is called only there. Raises PlanError."""
    s = settings.server
    kn, cards = knobs(settings), cards_of(gpus)
    chosen = choose_layout(shape, kn, cards, s.layout, draft_shape, s.split_mode)
    rival = rival_layout(shape, kn, cards, chosen, draft_shape, s.split_mode) \
        if settings.llamacpp.backend == "cuda" else None  # fmt: skip
    if rival is None:
        return chosen, None
    figures, source = _bench_figures(settings, (chosen, rival), bench() if callable(bench) else bench, model)
    return settle(chosen, rival, figures, source)


def _bench_figures(settings: Settings, layouts: tuple, bench: Optional[dict], model: Optional[str]) -> tuple:
    """({layout: tg128 of each unit}, which record) from the host's llama-bench record, or
    (None, why not): every unit of both layouts must have its figure for the served model."""
    if settings.server.bench == "off":
        return None, "server_bench = 'off': no llama-bench record decides"
    key = (bench or {}).get("key") or {}
    if not bench or not model or key.get("model") != model:
        return None, (f"no llama-bench record of model {model} on this host yet (the bench measures both layouts "
                      "after a new build or model, with server_bench = 'stopped')")  # fmt: skip
    found = {}
    for entry in bench_record.entries(bench, serving=False):
        found.setdefault(bench_record.signature(entry), bench_record.tokens_per_second(entry, "tg128"))
    figures = {}
    for lay in layouts:
        each = [found.get(bench_record.signature(bench_entry(lay, unit, True))) for unit in lay.units]
        if None in each:
            return None, (f"the llama-bench record of model {model} has no tg128 of {lay.chosen}'s units (both are "
                          "measured after a new build or model, with server_bench = 'stopped')")  # fmt: skip
        figures[lay.chosen] = each
    return figures, f"the llama-bench record (build {key.get('build')}, model {model})"


def bench_entry(layout: Layout, unit: Unit, cuda: bool) -> dict:
    """A unit's entry in the bench record as far as the control machine knows it: its cards
    (UUIDs, and their kind: nvidia-smi's name), the served flags llama-bench runs with.
    ``bench_record.signature`` of it is what a measurement of the unit is found by."""
    ctx = unit.plan
    return {"cards": [layout.cards[i].id for i in unit.cards], "card_names": [layout.cards[i].name for i in unit.cards],
            "served": {"cache_type_k": ctx.cache_type_k, "cache_type_v": ctx.cache_type_v,
                       "gpu_layers": ctx.gpu_layers if cuda else None},
            "split_args": unit.plan.split_args()}  # fmt: skip


def bench_due(settings: Settings, record: Optional[dict], key: dict, layout: Layout, refs: list) -> Optional[str]:
    """Why the bench would measure now, or None when the record is current: it names the
    served build and model (``key``) and holds a figure (found by ``bench_record.signature``)
    for the plan of every unit of ``layout`` (``refs``: ``unit_refs``). A record from before
    units were listed, of that build and model, is current: its one figure stands for all."""
    if not record or record.get("key") != key:
        return f"the record names {(record or {}).get('key')}, not {key}"
    if not isinstance(record.get("units"), list):
        return None
    have = {bench_record.signature(e) for e in bench_record.entries(record, serving=False)}
    cuda = settings.llamacpp.backend == "cuda"
    missing = [ref.name for ref, unit, _ in refs if bench_record.signature(bench_entry(layout, unit, cuda)) not in have]
    return f"no figure of {', '.join(missing)} (its cards or plan changed)" if missing else None


def unit_refs(settings: Settings, layout: Layout, in_place: Optional[dict] = None) -> list:
    """(UnitRef, Unit, its cards' UUIDs) of each unit of ``layout``, by index: one unit is the
    host's ``llamarack-server.service``; of several, a unit over the same cards as one in
    place (``in_place``: name -> its cards' UUIDs) keeps its N, the others take the lowest free."""
    uuids = [tuple(layout.cards[c].id for c in unit.cards) for unit in layout.units]
    indices = unit_indices(uuids, in_place or {}) if len(layout.units) > 1 else [None]
    refs = [(unit_ref(settings, i), unit, u) for i, unit, u in zip(indices, layout.units, uuids)]
    return sorted(refs, key=lambda r: r[0].index or 0)


def wanted_units(settings: Settings, flags: ServerFlags, build_dir: str, model_dir: str, shape: dict,
                 cards: tuple, templates: tuple = (), draft: Optional[tuple] = None,
                 devices: tuple = (), in_place: Optional[dict] = None,
                 bench: Any = None, host_mib: Optional[int] = None,
                 kept_cache: Optional[int] = None) -> tuple[Layout, tuple]:  # fmt: skip
    """The host's layout and the units it should run (``WantedUnit``, each with its plan and
    the host-RAM ledger): what the service operation writes and what ``llamarack audit``
    compares with the units found. ``cards``: the host's GPUs; ``draft``: (directory, shape) of
    the draft model when ``model_draft_repo`` is set; ``devices``: the host's ``CharDevices``;
    ``in_place``: the units on the host (``unit_refs``: a card that goes retires only its own
    unit); ``bench``: the host's llama-bench record (``host_layouts``); ``host_mib``: its
    ``HostMemory`` (None: not checked); ``kept_cache``: the lowered ``--cache-ram`` the units in
    place run (``cache_in_place``), kept while it fits. Raises PlanError."""
    if settings.model.draft_repo and not draft:
        raise PlanError(Failure(
            "draft-model", "model_draft_repo set, but no draft model under models/draft",
            "the draft artifact the model role makes", "run the model role (deploy.py runs it)",
        ))  # fmt: skip
    draft_dir, draft_shape = draft if settings.model.draft_repo else (None, None)
    layout = host_layouts(settings, shape, tuple(cards), draft_shape, bench, Path(model_dir).name)[0]
    refs = unit_refs(settings, layout, in_place)
    memory = host_memory(settings, flags, shape, [(ref.name, unit.plan) for ref, unit, _ in refs], draft_shape,
                         host_mib, kept_cache)  # fmt: skip
    wanted = []
    for ref, unit, uuids in refs:
        text = _unit_text(settings, flags, (build_dir, model_dir, draft_dir), shape, ref, unit.plan, uuids,
                          len(cards) > 1, templates, devices, memory.cache_ram)  # fmt: skip
        wanted.append(WantedUnit(ref, text, unit.plan, uuids, memory))
    return layout, tuple(wanted)


def host_memory(settings: Settings, flags: ServerFlags, shape: dict, plans: list, draft_shape: Optional[dict] = None,
                host_mib: Optional[int] = None, kept: Optional[int] = None) -> HostLedger:  # fmt: skip
    """The host-RAM ledger of the host's units (``plans``: (name, Plan) of each) against
    ``host_mib`` (MemTotal; None: not checked): each unit's share and the ``--cache-ram`` they
    get. On a CPU build what a plan puts on the cards is in host RAM too. Raises PlanError
    ("host-memory")."""
    kn, cuda = knobs(settings), settings.llamacpp.backend == "cuda"
    shares = [unit_share(name, shape, kn, plan, cuda, draft_shape) for name, plan in plans]
    return host_ledger(shares, host_mib, host_ram(settings, flags), kept)


_CACHE_RAM = re.compile(r"^ExecStart=.* --cache-ram (\d+)(?: |$)")


def cache_in_place(found: dict) -> Optional[int]:
    """The ``--cache-ram`` every unit in place runs (``found``: ``ServedUnits``), None where they
    differ or one names none: what the host-RAM ledger keeps while it fits."""
    said = {m.group(1) if m else None for f in found.values()
            for m in [next(filter(None, map(_CACHE_RAM.match, f.lines)), None)]}  # fmt: skip
    return int(said.pop()) if len(said) == 1 and None not in said else None


def unit_indices(unit_cards: list, in_place: dict) -> list:
    """N for each of several units (their cards' UUIDs): that of the unit in place over the
    same cards, else the lowest N no other unit takes."""
    kept = {tuple(c): unit_index(name) for name, c in in_place.items() if unit_index(name) is not None and c}
    taken, out = set(), []
    for cards in unit_cards:
        n = kept.get(tuple(cards))
        out.append(n if n is not None and n not in taken else None)
        taken.add(out[-1])
    free = (n for n in itertools.count() if n not in taken)
    return [n if n is not None else next(free) for n in out]


def _unit_text(settings: Settings, flags: ServerFlags, dirs: tuple, shape: dict, ref: UnitRef, plan: Any,
               uuids: tuple, visible: bool, templates: tuple, devices: tuple,
               cache_ram: Optional[int] = None) -> str:  # fmt: skip
    """One unit's file: its plan's arguments and split flags, its port, its cards, its --cache-ram."""
    build_dir, model_dir, draft_dir = dirs
    ctx, cuda = plan, settings.llamacpp.backend == "cuda"
    args = server_args(settings, flags, build_dir, model_dir, ctx, cuda=cuda, draft_dir=draft_dir, port=ref.port,
                       split=tuple(plan.split_args()), cache_ram=cache_ram)  # fmt: skip
    with_draft = f", draft {Path(draft_dir).name}" if draft_dir else ""
    # The architecture is the GGUF's own text: cut to a name's length, the plan's note is kept.
    arch = unitfile.clipped(str(shape["architecture"]), ARCH_SHOWN)
    description = f"llamarack llama-server: {Path(model_dir).name}{with_draft} ({arch}, {ctx.note})"
    on = (uuids, ctx.ledger.weights_on_card // MIB) if residency_checked(settings) else None
    return render_unit(settings, args, description, templates, device_names(devices, cuda), on, ref.port,
                       uuids if visible else (), ref.name)  # fmt: skip


def unit_model(unit_lines) -> Optional[str]:
    """The model file a unit's ExecStart serves (its ``--model``), None where it names none."""
    line = next((x for x in unit_lines or () if x.startswith("ExecStart=")), None)
    try:
        words = shlex.split(line.split("=", 1)[1]) if line else []
    except ValueError:
        words = []
    return words[words.index("--model") + 1] if "--model" in words[:-1] else None


def process_drift(found: Any) -> Optional[str]:
    """Why the process a unit runs is not the one its file names, from the process's own /props
    (``FoundUnit.props``; None where it said nothing): another model than the unit's ``--model``,
    or another build than the unit's (build_info ``b<N>-<commit>`` against the commit the unit's
    build's ``--version`` names). A unit whose files were switched without a restart, or that was
    restarted by hand from elsewhere, still answers /health: this says so."""
    said = (found.props or {}) if found else {}
    model, path = unit_model(found.lines) if found else None, said.get("model_path")
    if model and isinstance(path, str) and path != model:
        return f"the process serves {path}, not the unit's {model}: it was not restarted since its unit changed"
    built, info = found.built if found else None, said.get("build_info")
    ran = info.rpartition("-")[2] if isinstance(info, str) else ""
    if built and ran and not (built.startswith(ran) or ran.startswith(built)):
        return f"the process runs llama.cpp {ran} ({info}), not the unit's build of {built}"
    return None


def residency_checked(settings: Settings) -> bool:
    """Whether a unit planned on cards is checked to serve from them (``server_residency``)."""
    mode = settings.server.residency
    return mode == "on" or (mode == "auto" and settings.llamacpp.backend == "cuda")


def parse_pin(lines) -> Optional[dict]:
    """The rollback pin (``state/rollback.json``, host data: only compared, never run), or None."""
    if not lines:
        return None
    try:
        pin = json.loads("\n".join(lines))
    except ValueError:
        return {}
    return pin if isinstance(pin, dict) else {}


def pin_holds(pin: Optional[dict], found_sha1: Optional[str], wanted_text: str) -> bool:
    """Whether a rollback pin keeps the unit in place (of sha1 ``found_sha1``): it does while the
    settings still want the very unit it replaced (``wanted_text``); a change of what they want releases it."""
    return bool(pin) and pin.get("unit_sha1") == found_sha1 and \
        pin.get("replaced_sha1") == hashlib.sha1(wanted_text.encode()).hexdigest()  # fmt: skip
