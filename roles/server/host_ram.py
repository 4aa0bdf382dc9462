"""The host's memory: what a host's llama-server units keep in its RAM, planned against its
``MemTotal`` (the ``HostMemory`` fact) less ``server_host_ram_reserve_mib``.

Each unit's share (``UnitShare``), read in llama.cpp's source as the cards' ledger is
(``planner.py``):

- **weights on the host**: the token embedding and the layers left on the CPU (with mmap
  off llama.cpp reads them into its own buffers; with mmap on they are the file's pages,
  resident once used); on a CPU build every weight. The draft model's likewise.
- **KV on the host**: the cache of the layers left on the CPU; on a CPU build all of it.
- **compute on the host**: on a CUDA build with layers on the cards, llama.cpp's
  ``CUDA_Host`` compute buffer, the micro-batch's embeddings in and out (2 x 512 x n_embd
  x 4 bytes) beside one slot's f16 attention mask (512 x cells x 2): the H200's load logs
  to 0.2 MiB, 18.01 MiB at 2,048 cells to 144.09 at 131,072 for the 8B
  (tests/fixtures/llama-server/gpu-load-logs); elsewhere the CPU compute buffer
  (``planner.compute_bytes``). Both beside the logits' output buffer (vocabulary x 4 bytes
  per slot).
- **the prompt cache** (tools/server/server-task.cpp, ``server_prompt_cache``): when a slot
  takes a new task, the state of its last prompt (its KV cells, the draft's too) is copied
  into host RAM, the oldest dropped while the cache would pass ``--cache-ram`` MiB
  (llama.cpp's default 8,192); 0 keeps none; -1 has no byte limit but a token one, the
  context's cells, enforced only after a new prompt state is saved (``update`` after
  ``alloc``): at most twice the KV cache of the whole context.
- **the process**: ``PROCESS_MIB`` (``PROCESS_CUDA_MIB`` for a CUDA build), llama-server's own
  resident memory beyond those.

The host's units fit when their shares together are at most MemTotal less the reserve.
When they do not, every unit's ``--cache-ram`` is lowered to the largest that fits, the
same for each, down to ``server_cache_ram_min``; below it the host is refused
(``host-memory``), naming each unit's share and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from llamarack.errors import Failure

from .planner import MIB, N_UBATCH, Knobs, Plan, PlanError, compute_bytes, kv_sizes, sliding_count
from .settings import DEFAULT_CACHE_RAM_MIB

# llama-server's resident memory beyond the weights, KV, compute and output buffers and the
# prompt cache the ledger counts: its code and libraries (16 MiB of mapped files), the
# tokenizer, the threads, the HTTP server, and what the allocator keeps of prompt states it
# freed. Measured on the pinned commit's CPU build (the lab's source, its tiny Llama; x86-64,
# Debian 12, glibc 2.36, 2 threads, 2,048 cells) with bench/gpu/host_ram.py --cpu
# (bench/results/cpu-host-ram.json): VmRSS after ten distinct 1,900-token prompts, less the
# ledger's buffers (llama.cpp's own CPU buffers to 0.02 MiB), was 24.6 MiB with the prompt
# cache off; with --cache-ram 8 and -1 the process stayed 2.8 and 0.7 MiB under the ledger with
# this figure (an evicted prompt state's pages are kept a while).
PROCESS_MIB = 27
# A CUDA build's: its runtime, driver and cuBLAS libraries and their host allocations. Measured
# on an H100 (driver 580.159.04, CUDA 13, the pinned commit built for sm_90) with
# bench/gpu/host_ram.sh: a random-weights Llama-3-8B Q4_K_M, every layer on the card, 8,192
# cells, the prompt cache off: VmRSS 710.6 MiB, 404.3 beyond llama.cpp's CUDA_Host buffers
# (bench/results/gpu-host-ram.json, ``beyond_buffers_mib``); +4%.
PROCESS_CUDA_MIB = 420


@dataclass(frozen=True)
class HostRam:
    """What the host-RAM plan is asked: the ``server_*`` settings of it (or ``llamarack plan``'s
    options), and whether the build's llama-server has a prompt cache (``--cache-ram``)."""

    cache_ram: int = DEFAULT_CACHE_RAM_MIB  # MiB; -1: no byte limit; 0: no prompt cache
    cache_ram_min: int = 1024  # the least it is lowered to
    reserve_mib: int = 4096  # of MemTotal, left to the system
    has_cache_ram: bool = True  # False: a build from before the prompt cache (no --cache-ram)


@dataclass(frozen=True)
class UnitShare:
    """One unit's part of the host's memory, in bytes, at its ``--cache-ram``."""

    name: str
    weights: int
    kv: int
    compute: int
    process: int
    context_kv: int  # the KV cache of the whole context (model and draft): -1 lets the cache hold twice it
    cache_ram: Optional[int]  # its --cache-ram MiB; None: the build has no prompt cache

    @property
    def cache(self) -> int:
        """What its prompt cache can reach."""
        if not self.cache_ram:
            return 0
        return 2 * self.context_kv if self.cache_ram < 0 else self.cache_ram * MIB

    @property
    def fixed(self) -> int:
        return self.weights + self.kv + self.compute + self.process

    @property
    def total(self) -> int:
        return self.fixed + self.cache

    def parts(self) -> str:
        """Its share in words, MiB: "weights 282 + KV 0 + compute 144 + process 27 + prompt cache 1,024"."""
        return (f"weights {_mib(self.weights)} + KV {_mib(self.kv)} + compute {_mib(self.compute)} + process "
                f"{_mib(self.process)} + prompt cache {_mib(self.cache)}")  # fmt: skip

    def as_dict(self) -> dict:
        return {"unit": self.name, "weights_mib": _round(self.weights), "kv_mib": _round(self.kv),
                "compute_mib": _round(self.compute), "process_mib": _round(self.process),
                "cache_ram": self.cache_ram, "prompt_cache_mib": _round(self.cache), "total_mib": _round(self.total)}


@dataclass(frozen=True)
class HostLedger:
    """The host's units against its memory: each unit's share at the ``--cache-ram`` they get."""

    units: tuple  # UnitShare per unit
    host_mib: Optional[int]  # MemTotal; None: not known, so not checked
    asked: HostRam
    cache_ram: Optional[int]  # every unit's --cache-ram; None: the build has none (no flag, no cache)

    @property
    def budget(self) -> Optional[int]:
        """Bytes the units may take: MemTotal less the reserve; None where MemTotal is not known."""
        return None if self.host_mib is None else (self.host_mib - self.asked.reserve_mib) * MIB

    @property
    def total(self) -> int:
        return sum(u.total for u in self.units)

    @property
    def lowered(self) -> bool:
        return self.cache_ram is not None and self.cache_ram != self.asked.cache_ram

    def fits(self) -> Optional[bool]:
        return None if self.budget is None else self.total <= self.budget

    def at(self, cache_ram: Optional[int]) -> "HostLedger":
        """The same units with every ``--cache-ram`` at ``cache_ram``."""
        return replace(self, units=tuple(replace(u, cache_ram=cache_ram) for u in self.units), cache_ram=cache_ram)

    def why(self) -> str:
        """How the units' --cache-ram was chosen, in words."""
        if self.cache_ram is None:
            return "no prompt cache: this llama-server has no --cache-ram"
        if self.budget is None:
            return f"--cache-ram {self.cache_ram} as asked; the host's memory is not known here: not checked"
        said = f"{len(self.units)} unit{'s' if len(self.units) > 1 else ''} in {_mib(self.budget)} MiB"
        if not self.lowered:
            return f"--cache-ram {self.cache_ram} as asked: {said} ({_mib(self.total)} MiB)"
        return (f"--cache-ram {self.cache_ram}, lowered from {self.asked.cache_ram}: {said} (MemTotal "
                f"{_mib(self.host_mib * MIB)} less the {_mib(self.asked.reserve_mib * MIB)} MiB reserve)")

    def as_dict(self) -> dict:
        return {"mem_total_mib": self.host_mib, "reserve_mib": self.asked.reserve_mib,
                "budget_mib": None if self.budget is None else _round(self.budget),
                "cache_ram": self.cache_ram, "asked_cache_ram": self.asked.cache_ram,
                "cache_ram_min": self.asked.cache_ram_min, "lowered": self.lowered, "total_mib": _round(self.total),
                "fits": self.fits(), "why": self.why(), "units": [u.as_dict() for u in self.units]}  # fmt: skip


def _mib(n: float) -> str:
    return f"{n / MIB:,.0f}"


def _round(n: float) -> float:
    return round(n / MIB, 1)


def unit_share(name: str, shape: dict, knobs: Knobs, plan: Plan, on_cards: bool, draft: Optional[dict] = None,
               cache_ram: Optional[int] = None) -> UnitShare:  # fmt: skip
    """One unit's share of the host's memory: ``plan``'s ledger, where what it puts on the
    cards stays on the cards only with ``on_cards`` (a CUDA build: a CPU build holds every
    part in host RAM), at ``cache_ram`` MiB of prompt cache (None: none)."""
    book = plan.ledger
    draft_weights = book.draft_weights_on_host + (0 if on_cards else book.draft_weights_on_card)
    draft_kv = book.draft_kv_on_host + (0 if on_cards else book.draft_kv_on_card)
    cards = on_cards and bool(book.cards) and bool(plan.gpu_layers)
    compute = sum(host_compute_bytes(s, knobs, plan, cards) for s in (shape, draft) if s is not None)
    return UnitShare(
        name, book.weights_on_host + (0 if on_cards else book.weights_on_card) + draft_weights,
        book.kv_on_host + (0 if on_cards else book.kv_on_card) + draft_kv, compute,
        (PROCESS_CUDA_MIB if on_cards else PROCESS_MIB) * MIB,
        book.kv_on_host + book.kv_on_card + book.draft_kv_on_host + book.draft_kv_on_card, cache_ram,
    )  # fmt: skip


def host_compute_bytes(shape: dict, knobs: Knobs, plan: Plan, on_cards: bool) -> int:
    """llama.cpp's compute and output buffers in host RAM for one model of the unit: with layers
    on the cards, the ``CUDA_Host`` compute buffer (the micro-batch's embeddings in and out, one
    slot's f16 mask); else the CPU compute buffer (``compute_bytes``); each beside the logits
    of every slot (the output buffer)."""
    ctx, k, v = plan.ctx_per_slot, plan.cache_type_k, plan.cache_type_v
    swa = kv_sizes(shape, knobs, k, v, ctx)[2] if sliding_count(shape, 0, shape["n_layer"]) else 0
    output = (shape.get("n_vocab") or 0) * 4 * plan.parallel
    if on_cards:
        return 2 * N_UBATCH * 4 * (shape.get("n_embd") or 0) + N_UBATCH * (ctx + swa) * 2 + output
    return compute_bytes(shape, knobs, False, ctx, swa, k, v) + output


def host_ledger(shares: list, host_mib: Optional[int], asked: HostRam, kept: Optional[int] = None) -> HostLedger:
    """``plan_host``'s ledger; raises PlanError ("host-memory") where it refuses the host."""
    book, failure = plan_host(shares, host_mib, asked, kept)
    if failure:
        raise PlanError(failure)
    return book


def plan_host(shares: list, host_mib: Optional[int], asked: HostRam, kept: Optional[int] = None) -> tuple:
    """(ledger, refusal or None) of the host's units (``shares``: ``UnitShare``) against
    ``host_mib`` (MemTotal; None: not checked): their ``--cache-ram`` as asked or, where that
    does not fit, lowered to the largest that does, the same for each unit (a lowered -1
    becomes a number: a byte limit lets a cache pass the context's cells). A lowered value
    the units in place already run (``kept``) stays while it fits and is no less than
    ``cache_ram_min``: a card that goes (fewer units, more room each) restarts no other unit.
    Where even ``cache_ram_min`` does not fit, the ledger at it and the "host-memory" refusal."""
    cache = asked.cache_ram if asked.has_cache_ram else None
    book = HostLedger(tuple(shares), host_mib, asked, None).at(cache)
    if book.fits() is not False:
        return book, None
    if cache:  # a prompt cache to lower
        room = book.budget - sum(u.fixed for u in book.units)
        lowered = room // len(book.units) // MIB if room >= 0 else -1
        if kept is not None and asked.cache_ram_min <= kept <= lowered:
            lowered = kept
        if lowered >= asked.cache_ram_min:
            return book.at(lowered), None
        book = book.at(asked.cache_ram_min if cache < 0 else min(cache, asked.cache_ram_min))
    return book, _refusal(book)


def _refusal(book: HostLedger) -> Failure:
    """The host-memory refusal: the host's memory, each unit's share at the floor, the fix."""
    groups: dict = {}
    for unit in book.units:
        groups.setdefault((unit.total, unit.parts()), []).append(unit.name)
    each = "; ".join(f"{', '.join(names)}: {_mib(total)} MiB{' each' if len(names) > 1 else ''} ({parts})"
                     for (total, parts), names in groups.items())  # fmt: skip
    cache = ("no prompt cache (this llama-server has no --cache-ram)" if book.cache_ram is None else
             f"--cache-ram {book.cache_ram}" + (", server_cache_ram_min" if book.lowered else ""))  # fmt: skip
    return Failure(
        "host-memory",
        f"MemTotal {book.host_mib:,} MiB; {len(book.units)} unit{'s' if len(book.units) > 1 else ''} at {cache} "
        f"take {_mib(book.total)} MiB: {each}",
        f"at most {_mib(book.budget)} MiB for the units: MemTotal less server_host_ram_reserve_mib "
        f"{book.asked.reserve_mib:,}",
        "fewer units or more layers on the cards (server_layout, server_gpu_layers), a smaller server_ctx_size or "
        "server_parallel where layers stay on the host, a lower server_cache_ram_min (0: no prompt cache) or "
        "server_host_ram_reserve_mib, or more memory for the host",
    )  # fmt: skip
