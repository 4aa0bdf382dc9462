"""The memory planner: what a model needs on a host's cards, and what they allow.

One planner for the server role (``plan.py``, ``card_layout.py``) and ``llamarack plan``
(``plan_cli.py``): ``plan(shape, knobs, cards)``, pure, of a shape dict
(``roles/model/files/gguf_header.py`` makes it), ``Knobs`` and the cards a llama-server
serves from, in their device order: several cards (llama.cpp's layer split, each card
with a ledger of its own), one card (n = 1), or none (served from the CPU).

The ledger follows llama.cpp's own placement of weights, KV cache, compute buffers, a
draft model and the cuBLAS prefill pool, on one card and over several: docs/planning.md
says what each item counts, where in llama.cpp's source it was read and how close it
comes to llama.cpp's own figures ("The ledger", "Where llama.cpp puts what over several
cards"). One card or none is counted as one model (``model_bytes``), several card by card
(``Over``): the two agree to the byte for one card (tests/unit/test_split_plan.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from typing import Optional

from llamarack.errors import Failure
from llamarack.gpu_table import parse_compute_cap
from roles.model.files.gguf_header import GgufError, check_shape

from .settings import DEFAULT_RESERVE_MIB

MIB = 2**20
# Bytes per stored value of each KV cache type (GGML block size / values per block).
KV_TYPE_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0,
    "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32, "iq4_nl": 18 / 32,
    "q5_0": 22 / 32, "q5_1": 24 / 32,
}  # fmt: skip
# What ``auto`` tries, best first. Same type for K and V: a build without
# GGML_CUDA_FA_ALL_QUANTS has flash-attention kernels for each of these pairs.
AUTO_KV_TYPES = ("f16", "q8_0", "q4_0")
# Cache types the CUDA flash-attention kernel reads as they are; a quantized cache is
# converted to f16 for it, in the compute buffer (``compute_bytes``).
UNQUANTIZED_KV_TYPES = ("f32", "f16", "bf16")
# llama.cpp pads the context and each slot's share to 256 cells.
CTX_STEP = 256
# llama-server's default micro-batch (-ub), which sizes the compute buffer and SWA cells.
N_UBATCH = 512
# Sliding-window layouts llama.cpp hard-codes per architecture when the GGUF has no
# <arch>.attention.sliding_window_pattern: every Nth layer is dense (src/models/*.cpp).
SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma-embedding": 6, "cohere2": 4, "gpt-oss": 2,
                "exaone4": 4, "olmo2": 4}  # fmt: skip


# ggml's GGML_SCHED_MAX_COPIES (ggml/CMakeLists.txt, default 4): the inputs a card's graph
# keeps, per input, when the scheduler pipelines micro-batches over several cards.
PIPELINE_COPIES = 4
# What llama.cpp's --split-mode takes that the planner plans. Never "row" (deprecated
# upstream, and no faster on P40s); "tensor" only with an unquantized KV cache.
SPLIT_MODES = ("layer", "tensor")


class PlanError(Exception):
    """The plan cannot be met; ``failure`` says what was found and what is needed."""

    def __init__(self, failure: Failure):
        super().__init__(failure.rule)
        self.failure = failure


@dataclass(frozen=True)
class Knobs:
    """What the plan is asked for: the operator's ``server_*`` settings (or the CLI's
    options), and the planned card's compute capability."""

    ctx_size: Optional[int] = None  # per slot; None: the largest that fits
    parallel: int = 1
    cache_type_k: str = "auto"
    cache_type_v: str = "auto"
    flash_attn: bool = True
    gpu_layers: Optional[int] = None  # None: all that fit; 0: CPU only
    min_ctx_size: int = 4096  # per slot: below this, offload fewer layers
    rope_scaling: str = "none"  # none, yarn, linear
    rope_scale: float = 1.0
    rope_orig_ctx: Optional[int] = None  # None: from the GGUF
    reserve_mib: int = DEFAULT_RESERVE_MIB  # per card
    draft_gpu_layers: Optional[int] = None  # the draft's layers on the card; None: all of them
    compute_cap: Optional[str] = None  # the card's, "7.0": where prompts are multiplied; None: not known
    # A card planned as this many of its kind together, each keeping a reserve and a prefill
    # pool; the server role and ``llamarack plan`` name every card and leave this 1.
    cards: int = 1


@dataclass(frozen=True)
class Card:
    """One card as the planner sees it."""

    name: str
    mib: int  # the memory to plan with (gpu_table.planning_memory_mib)
    compute_cap: Optional[str] = None  # "7.0"; None: not known (no prefill pool counted)
    id: str = ""  # the host's name for it (its UUID), carried to the unit


@dataclass(frozen=True)
class CardLedger:
    """One card's part of a plan, in bytes."""

    name: str
    card_mib: int
    first_layer: int  # its first of the n_layer + 1 layers (n_layer: the output layer)
    layers: int  # how many: its share of --tensor-split
    output_layer: bool
    weights: int
    kv: int
    compute: int  # its compute buffer, the pipeline's copies of its inputs included
    pipeline_copies: int  # of which: the 3 more copies of its graph's inputs
    prefill_pool: int
    reserve: int
    # The draft model's weights, KV, compute and prefill pool (the first card's; 0 elsewhere).
    draft_weights: int = 0
    draft_kv: int = 0
    draft_compute: int = 0
    draft_prefill_pool: int = 0

    @property
    def draft(self) -> int:
        return self.draft_weights + self.draft_kv + self.draft_compute + self.draft_prefill_pool

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.prefill_pool + self.reserve + self.draft

    def fits(self) -> bool:
        return self.total <= self.card_mib * MIB

    def as_dict(self) -> dict:
        parts = {k: v for k, v in asdict(self).items() if not k.startswith("draft_")}
        return {**parts, "draft": self.draft, "total": self.total, "spare": self.card_mib * MIB - self.total}


# The one-card ledger's names for the cards' parts together (one card: that card's own).
ON_CARDS = {"weights_on_card": "weights", "kv_on_card": "kv", "compute_on_card": "compute", "reserve": "reserve",
            "prefill_pool": "prefill_pool", "draft_weights_on_card": "draft_weights", "draft_kv_on_card": "draft_kv",
            "draft_compute_on_card": "draft_compute", "draft_prefill_pool": "draft_prefill_pool",
            "total_on_card": "total"}  # fmt: skip
# How a ledger of one card, or none, reads (``Ledger.as_dict``): every part on the card or on the host.
ONE_CARD = ("card_mib", "ctx_per_slot", "parallel", "cache_type_k", "cache_type_v", "gpu_layers", "n_layer",
            "weights_on_card", "weights_on_host", "kv_bytes_per_token", "kv_on_card", "kv_on_host", "compute",
            "compute_on_card", "reserve", "draft_gpu_layers", "draft_weights_on_card", "draft_weights_on_host",
            "draft_kv_on_card", "draft_kv_on_host", "draft_compute_on_card", "prefill_pool", "draft_prefill_pool",
            "total_on_card")  # fmt: skip


@dataclass(frozen=True)
class Ledger:
    """Where the bytes go over a unit's cards (none: served from the CPU), for one choice of
    layers, KV types and context. The parts on the cards together are named as one card's
    (``ON_CARDS``: ``kv_on_card``, ``total_on_card``...)."""

    cards: tuple  # CardLedger per card, in the unit's device order (CUDA0, CUDA1, ...)
    ctx_per_slot: int
    parallel: int
    cache_type_k: str
    cache_type_v: str
    gpu_layers: int  # --n-gpu-layers over all the cards (n_layer + 1: everything)
    n_layer: int
    weights_on_host: int
    kv_on_host: int
    kv_bytes_per_token: float  # per token of context, dense layers on the cards
    compute: int  # the compute buffer's estimate (each card's own; the host's when nothing is on a card)
    pipelined: bool = False  # llama.cpp's pipeline parallelism: every layer on more than one card
    draft_gpu_layers: Optional[int] = None
    draft_weights_on_host: int = 0  # the draft's weights and KV left on the host
    draft_kv_on_host: int = 0

    def __getattr__(self, name: str):
        if name in ON_CARDS:
            return sum(getattr(c, ON_CARDS[name]) for c in self.cards)
        if name == "card_mib":  # the cards' memory together; None without one
            return sum(c.card_mib for c in self.cards) if self.cards else None
        raise AttributeError(name)

    @property
    def tensor_split(self) -> tuple:
        """``--tensor-split``: each card's layer count (llama.cpp takes proportions)."""
        return tuple(c.layers for c in self.cards)

    @property
    def main_gpu(self) -> int:
        """The card that holds the output layer (its index in the unit)."""
        return next((i for i, c in enumerate(self.cards) if c.output_layer), 0)

    def fits(self) -> bool:
        return all(c.fits() for c in self.cards)

    def as_dict(self) -> dict:
        """One card or none: each part on the card or on the host (``ONE_CARD``); several: each card's."""
        if len(self.cards) < 2:
            return {name: getattr(self, name) for name in ONE_CARD}
        skip = ("cards", "compute", "draft_weights_on_host", "draft_kv_on_host")
        return {**{k: v for k, v in asdict(self).items() if k not in skip},
                "draft_on_host": self.draft_weights_on_host + self.draft_kv_on_host,
                "cards": [c.as_dict() for c in self.cards], "tensor_split": list(self.tensor_split),
                "main_gpu": self.main_gpu, "weights_on_card": self.weights_on_card,
                "total_on_cards": sum(c.total for c in self.cards)}  # fmt: skip


@dataclass(frozen=True)
class Plan:
    ctx_per_slot: int
    parallel: int
    cache_type_k: str
    cache_type_v: str
    gpu_layers: Optional[int]  # None: CPU serving (no card)
    rope: tuple  # () or ("yarn", scale, original context)
    ledger: Ledger
    note: str  # how it was chosen, for the operation's name and the logs
    largest: dict = field(default_factory=dict)  # KV type -> largest per-slot context, all layers
    split_mode: str = "layer"

    @property
    def ctx_size(self) -> int:
        """llama-server's --ctx-size: every slot's cells together."""
        return self.ctx_per_slot * self.parallel

    def split_args(self) -> list:
        """llama-server's split flags: none for one card."""
        if len(self.ledger.cards) < 2:
            return []
        return ["--split-mode", self.split_mode, "--tensor-split", ",".join(map(str, self.ledger.tensor_split)),
                "--main-gpu", str(self.ledger.main_gpu)]  # fmt: skip

    def as_dict(self) -> dict:
        split = {"split_mode": self.split_mode, "split_args": self.split_args()} if len(self.ledger.cards) > 1 else {}
        return {"ctx_size": self.ctx_size, "ctx_per_slot": self.ctx_per_slot, "parallel": self.parallel,
                "cache_type_k": self.cache_type_k, "cache_type_v": self.cache_type_v,
                "gpu_layers": self.gpu_layers, "rope": list(self.rope), "note": self.note, **split,
                "ledger": self.ledger.as_dict(), "largest_ctx_per_slot": self.largest}  # fmt: skip


def _pad(n: int) -> int:
    return -(-n // CTX_STEP) * CTX_STEP


def _swa_layout(shape: dict) -> tuple:
    """(the list of which layers slide, or None; else every Nth layer dense, or 0: none slides)."""
    if not shape.get("n_swa"):
        return None, 0
    pattern = shape.get("swa_pattern")
    if isinstance(pattern, list):
        return pattern[:shape["n_layer"]], 0
    return None, pattern or SWA_PATTERNS.get(shape["architecture"]) or 0


def sliding_layers(shape: dict) -> frozenset:
    """The layers with a sliding window, as llama.cpp lays them out; none when
    the window is unknown (then every layer counts at full context: safe)."""
    pattern, every = _swa_layout(shape)
    if pattern is not None:
        return frozenset(i for i, slides in enumerate(pattern) if slides)
    return frozenset(i for i in range(shape["n_layer"]) if every and i % every < every - 1)


def sliding_count(shape: dict, start: int, stop: int) -> int:
    """How many of the layers ``start`` to ``stop - 1`` slide (``sliding_layers``), counted
    without listing them: the planner asks it of every layer count it tries."""
    pattern, every = _swa_layout(shape)
    if pattern is not None:
        return sum(map(bool, pattern[start:stop]))
    if not every or start >= stop:
        return 0

    def before(n: int) -> int:  # sliding layers among 0 .. n - 1: each run of `every` has every - 1
        return n // every * (every - 1) + min(n % every, every - 1)

    return before(stop) - before(start)


def layers_on_card(n_layer: int, gpu_layers: int) -> range:
    """The repeating layers --n-gpu-layers puts on the card: the last ones."""
    return range(max(n_layer + 1 - gpu_layers, 0), n_layer)


def kv_layer_bytes(shape: dict, k: str, v: str) -> float:
    """KV bytes per cell of one layer."""
    return shape["n_head_kv"] * (shape["head_dim_k"] * KV_TYPE_BYTES[k] + shape["head_dim_v"] * KV_TYPE_BYTES[v])


def kv_sizes(shape: dict, knobs: Knobs, k: str, v: str, ctx_per_slot: int) -> tuple:
    """(one sliding layer's KV bytes, one other layer's, the sliding cells per slot), every slot's."""
    per_cell, swa_cells = kv_layer_bytes(shape, k, v), _pad(min(ctx_per_slot, shape.get("n_swa", 0) + N_UBATCH))
    return int(per_cell * (swa_cells * knobs.parallel)), int(per_cell * ctx_per_slot * knobs.parallel), swa_cells


def compute_bytes(shape: dict, knobs: Knobs, on_gpu: bool, ctx_per_slot: int, swa_per_slot: int,
                  k: str = "f16", v: str = "f16") -> int:  # fmt: skip
    """The compute buffer llama.cpp reserves for one n_ubatch micro-batch: on CUDA (``on_gpu``)
    with flash attention, the f16 mask of one slot's cells (a second one for the sliding
    window) beside the larger of the feed-forward and the attention peaks, all f32; without
    flash attention every head's f32 scores too; on the CPU backend (or without n_ff), the
    logits and four widths, and the mask. docs/planning.md ("The ledger") says how close
    each comes to llama.cpp's own figure."""
    cells = ctx_per_slot + swa_per_slot
    if on_gpu and shape.get("n_ff"):
        # the layer's input, residual and normed copy (n_embd) beside the gate, up and their product (n_ff)
        ffn = N_UBATCH * 4 * 3 * (shape["n_ff"] + shape["n_embd"])
        # the input and its normed copy (n_embd), Q and the attention's output; a quantized cache as f16
        attention = N_UBATCH * 4 * 2 * (shape["n_embd"] + shape["n_head"] * shape["head_dim_k"])
        for kind, size in ((k, shape["head_dim_k"]), (v, shape["head_dim_v"])):
            if kind not in UNQUANTIZED_KV_TYPES:
                attention += ctx_per_slot * shape["n_head_kv"] * size * 2
        scores = 0 if knobs.flash_attn else N_UBATCH * cells * 4 * (1 + shape["n_head"])
        return N_UBATCH * cells * 2 + max(ffn, attention) + scores
    mask = N_UBATCH * ctx_per_slot * (2 if knobs.flash_attn else 4 * shape["n_head"])
    return N_UBATCH * 4 * ((shape.get("n_vocab") or 0) + 4 * (shape.get("n_embd") or 0)) + mask


# Where a prompt's micro-batch goes through cuBLAS (ggml-cuda/mmq.cu, ggml_cuda_should_use_mmq), the
# weights are dequantized into ggml's CUDA pool, which keeps its largest size: docs/planning.md
# ("Prefill pool") says which cards and what was measured. cuBLAS's own handle, workspace and
# kernels, at most (bench/results/gpu-proof.json, phase cublas):
CUBLAS_OWN_MIB = 88
# GGUF general.file_type of unquantized weights (all f32, mostly f16, mostly bf16):
# cuBLAS multiplies those as they are, on every card.
UNQUANTIZED_FILE_TYPES = (0, 1, 32)


def cublas_prefill(compute_cap: Optional[str]) -> bool:
    """Whether a card of this compute capability multiplies a prompt's batches by the
    quantized weights with cuBLAS (see above): Volta (7.0, 7.2), and cards before 6.1."""
    cc = parse_compute_cap(compute_cap)
    return cc is not None and ((7, 0) <= cc < (7, 5) or cc < (6, 1))


def prefill_pool_bytes(shape: dict, compute_cap: Optional[str], n_tokens: int = N_UBATCH) -> int:
    """What ggml's CUDA pool holds after a prompt on a card that takes cuBLAS for it
    (``cublas_prefill``): the largest of the layer's products (the feed-forward's
    in and out, attention's in and out), each its weight dequantized plus the
    ``n_tokens`` batch converted (and the f16 product, except on Volta), and
    cuBLAS's own. 0 on other cards, for unquantized weights, without n_ff."""
    cc = parse_compute_cap(compute_cap)
    if not cublas_prefill(compute_cap) or not shape.get("n_ff") or shape.get("file_type") in UNQUANTIZED_FILE_TYPES:
        return 0
    n_embd, n_ff = shape["n_embd"], shape["n_ff"]
    products = ((n_embd, n_ff), (n_ff, n_embd), (n_embd, shape["n_head"] * shape["head_dim_k"]),
                (shape["n_head"] * shape["head_dim_v"], n_embd))  # (in, out) of each weight  # fmt: skip
    if cc >= (7, 0):  # f16, the f32 product written in place
        need = max(2 * i * o + 2 * i * n_tokens for i, o in products)
    elif cc >= (6, 0):  # f16, the product through an f16 buffer
        need = max(2 * i * o + 2 * i * n_tokens + 2 * o * n_tokens for i, o in products)
    else:  # f32: the weight only, the batch is f32 already
        need = max(4 * i * o for i, o in products)
    return need + CUBLAS_OWN_MIB * MIB


def model_bytes(shape: dict, knobs: Knobs, on_gpu: bool, gpu_layers: int, k: str, v: str,
                ctx_per_slot: int) -> dict:  # fmt: skip
    """One model's weights, KV cache and compute buffer, on the card and on the host. Every
    sliding layer's KV is the same size, and so is every other's: they are counted, not
    added up one by one, so a ledger costs no more than two sums of its layers' bytes."""
    n = shape["n_layer"]
    on_card = layers_on_card(n, gpu_layers) if on_gpu else range(0)
    output_on_card = on_gpu and gpu_layers >= 1
    output = shape["output_bytes"] + (shape["token_embd_bytes"] if shape["tied_embeddings"] else 0)
    weights = sum(shape["layer_bytes"]) + shape["token_embd_bytes"] + output
    card_weights = (sum(shape["layer_bytes"][on_card.start:]) if on_card else 0) + (output if output_on_card else 0)
    sliding = sliding_count(shape, 0, n)
    sliding_on_card = sliding_count(shape, on_card.start, n) if on_card else 0
    swa_size, full_size, swa_per_slot = kv_sizes(shape, knobs, k, v, ctx_per_slot)
    full_on_card = len(on_card) - sliding_on_card
    kv_card = sliding_on_card * swa_size + full_on_card * full_size
    kv_host = (sliding - sliding_on_card) * swa_size + (n - sliding - full_on_card) * full_size
    compute = compute_bytes(shape, knobs, on_gpu, ctx_per_slot, swa_per_slot if sliding else 0, k, v)
    # Anything on the card, and a prompt's products run there: llama.cpp also takes the
    # weights of layers left on the host to the card for a batch of 32 tokens or more.
    pool = prefill_pool_bytes(shape, knobs.compute_cap) * knobs.cards if output_on_card else 0
    return {"weights_on_card": card_weights, "weights_on_host": weights - card_weights,
            "kv_bytes_per_token": full_on_card * kv_layer_bytes(shape, k, v), "kv_on_card": kv_card,
            "kv_on_host": kv_host, "compute": compute, "compute_on_card": compute if output_on_card else 0,
            "prefill_pool": pool}  # fmt: skip


def draft_layers(knobs: Knobs, draft: dict) -> int:
    """The draft's ``--spec-draft-ngl``: ``draft_gpu_layers``, else all its n_layer + 1."""
    return draft["n_layer"] + 1 if knobs.draft_gpu_layers is None else knobs.draft_gpu_layers


def ledger(shape: dict, knobs: Knobs, cards, gpu_layers: int, k: str, v: str, ctx_per_slot: int,
           draft: Optional[dict] = None, split_mode: str = "layer") -> Ledger:  # fmt: skip
    """Where the bytes go with ``gpu_layers`` on ``cards`` (none: the host alone) at this KV
    type and context; ``draft``: the draft model's shape (speculative decoding), None without
    one. Several cards are counted card by card (``Over``); one, or none, as one model
    (``model_bytes``), nothing on the card but its reserve and the draft when no layer is."""
    cards = tuple(cards)
    if len(cards) > 1:
        return Over(shape, knobs, cards, draft, split_mode).ledger(gpu_layers, k, v, ctx_per_slot)
    card = cards[0] if cards else None
    knobs = card_knobs(knobs, card) if card else knobs
    main = model_bytes(shape, knobs, card is not None, gpu_layers, k, v, ctx_per_slot)
    parts = (0,) * 6
    if draft is not None:
        d = model_bytes(draft, knobs, card is not None, draft_layers(knobs, draft), k, v, ctx_per_slot)
        parts = tuple(d[key] for key in ("weights_on_card", "kv_on_card", "compute_on_card", "prefill_pool",
                                         "weights_on_host", "kv_on_host"))  # fmt: skip
    n = shape["n_layer"]
    books = (CardLedger(card.name, card.mib, n + 1 - gpu_layers, gpu_layers, gpu_layers >= 1, main["weights_on_card"],
                        main["kv_on_card"], main["compute_on_card"], 0, main["prefill_pool"],
                        knobs.reserve_mib * knobs.cards * MIB, *parts[:4]),) if card else ()  # fmt: skip
    return Ledger(books, ctx_per_slot, knobs.parallel, k, v, gpu_layers, n, main["weights_on_host"], main["kv_on_host"],
                  main["kv_bytes_per_token"], main["compute"], False,
                  draft_layers(knobs, draft) if draft is not None else None, parts[4], parts[5])  # fmt: skip


def context_cap(shape: dict, knobs: Knobs) -> tuple:
    """(largest per-slot context, the rope flags): the trained context, or with
    YaRN the original context x scale. llama.cpp raises its own idea of the
    trained context only for YaRN (llama_init_from_model: "n_ctx_train
    adjusted"), and llama-server caps every slot at it, so linear scaling past
    the trained context would allocate cells no slot can use: refused."""
    trained = shape["n_ctx_train"]
    if knobs.rope_scaling == "none":
        return trained, ()
    orig = knobs.rope_orig_ctx or shape.get("rope_orig_ctx") or trained
    if knobs.rope_scaling == "linear":
        return trained, ("linear", knobs.rope_scale, orig)
    return int(orig * knobs.rope_scale), ("yarn", knobs.rope_scale, orig)


def checked_context_cap(shape: dict, knobs: Knobs) -> tuple:
    """``context_cap``, and a wanted context past it refused ("context-trained")."""
    cap, rope = context_cap(shape, knobs)
    wanted, yarn = knobs.ctx_size, rope[:1] == ("yarn",)
    if wanted is not None and wanted > cap:
        how = f"{shape['n_ctx_train']} trained" + (f", x{knobs.rope_scale} with YaRN" if yarn else "")
        raise PlanError(Failure(
            "context-trained", f"server_ctx_size {wanted}", f"at most {cap} per slot ({shape['architecture']}: {how})",
            f"set server_ctx_size <= {cap}, or None for the largest that fits"
            + ("" if yarn else ", or server_rope_scaling = 'yarn' with a server_rope_scale"),
        ))  # fmt: skip
    return cap, rope


def largest_where(lo: int, hi: int, fits) -> int:
    """The largest n in ``lo`` + 1 .. ``hi`` for which ``fits(n)``, else ``lo``; ``fits``
    holds up to some n and from there on no more (more cells, more layers: more bytes)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def kv_candidates(knobs: Knobs) -> list:
    """(K, V) pairs to try, best first. ``auto`` on both sides steps them down
    together; a quantized V needs flash attention, so without it V stays f16."""
    ks = AUTO_KV_TYPES if knobs.cache_type_k == "auto" else (knobs.cache_type_k,)
    vs = (AUTO_KV_TYPES if knobs.flash_attn else ("f16",)) if knobs.cache_type_v == "auto" else (knobs.cache_type_v,)
    if len(ks) > 1 and len(vs) > 1:
        return list(zip(ks, vs))
    return [(k, v) for k in ks for v in vs]


def choose(knobs: Knobs, cap: int, n_all: int, largest_context, most_layers) -> tuple:
    """What a plan over one card or several takes, from ``largest_context(layers, k, v, cap)``
    and ``most_layers(k, v, ctx)``: ``auto`` KV the most precise type that gives the wanted
    (else the trained) context with every layer on the cards, and when every layer leaves less
    than the minimum context, the most layers that leave it (the rest on the host).
    (largest per KV type, k, v, layers, the largest context with them, the minimum, why)."""
    target = knobs.ctx_size or cap
    candidates = kv_candidates(knobs)
    largest = {f"{k}/{v}": largest_context(n_all, k, v, cap) for k, v in candidates}
    k, v = next(((k, v) for k, v in candidates if largest[f"{k}/{v}"] >= target), candidates[-1])
    layers = n_all if knobs.gpu_layers is None else min(knobs.gpu_layers, n_all)
    floor = min(knobs.min_ctx_size, target)
    fits, why = largest_context(layers, k, v, cap), ""
    fewer = most_layers(k, v, floor) if knobs.gpu_layers is None and fits < floor else 0
    if fewer:
        layers = fewer
        fits, why = largest_context(layers, k, v, cap), f" (all {n_all} leave no room for {floor} tokens per slot)"
    return largest, k, v, layers, fits, floor, why


class _Stack:
    """A shape's n_layer + 1 layers in llama.cpp's order, the output layer last, as running
    sums of their weights and of their sliding layers: any run of them costs two lookups."""

    def __init__(self, shape: dict):
        self.n = shape["n_layer"]
        output = shape["output_bytes"] + (shape["token_embd_bytes"] if shape["tied_embeddings"] else 0)
        self.weights = [0, *accumulate([*shape["layer_bytes"], output])]
        slides = sliding_layers(shape)
        self.sliding = [0, *accumulate(i in slides for i in range(self.n))]

    def run(self, a: int, b: int, swa: int, full: int) -> int:
        """The weights and KV of layers ``a`` .. ``b`` - 1 (the output layer has no KV); one
        sliding layer's KV is ``swa`` bytes, one other's ``full``."""
        la, lb = min(a, self.n), min(b, self.n)
        sliding = self.sliding[lb] - self.sliding[la]
        return self.weights[b] - self.weights[a] + sliding * swa + (lb - la - sliding) * full

    def kv(self, a: int, b: int, swa: int, full: int) -> int:
        return self.run(a, b, swa, full) - (self.weights[b] - self.weights[a])


def spread(stack: _Stack, budgets: list, first: int, swa: int, full: int) -> Optional[tuple]:
    """Layer counts per card for the layers ``first`` .. n_layer: each card in turn takes the
    most of the next layers its budget (bytes left for layers) holds; None when layers are
    left over or a budget is below 0. The farthest each card can reach, so no other way
    of cutting the run in order holds it where this does not."""
    counts, at = [], first
    for budget in budgets:
        if budget < 0:
            return None
        take = largest_where(0, stack.n + 1 - at, lambda m, at=at: stack.run(at, at + m, swa, full) <= budget)
        counts.append(take)
        at += take
    return tuple(counts) if at == stack.n + 1 else None


def even_spread(stack: _Stack, budgets: list, first: int, swa: int, full: int) -> tuple:
    """Layer counts that leave every card the same spare as far as whole layers allow (the
    largest spare all cards keep, found by halving); when nothing fits, counts in proportion
    to the budgets, for the ledger of a refusal."""
    if spread(stack, budgets, first, swa, full) is None:
        total, layers = max(sum(max(b, 0) for b in budgets), 1), stack.n + 1 - first
        ends = [round(layers * s / total) for s in accumulate(max(b, 0) for b in budgets)]
        ends[-1] = layers
        return tuple(e - s for s, e in zip([0, *ends], ends))
    margin = largest_where(0, min(budgets), lambda m: spread(stack, [b - m for b in budgets], first, swa,
                                                               full) is not None)  # fmt: skip
    return spread(stack, [b - margin for b in budgets], first, swa, full)


class Over:
    """A shape, the knobs and a draft planned over a unit's cards: the ledger, and the
    searches for the largest context and the most layers, each a binary search of ledgers
    that cost O(cards x log layers) (``_Stack``)."""

    def __init__(self, shape: dict, knobs: Knobs, cards: tuple, draft: Optional[dict] = None,
                 split_mode: str = "layer"):  # fmt: skip
        self.shape, self.knobs, self.cards, self.draft = shape, knobs, cards, draft
        self.split_mode = split_mode
        self.stack = _Stack(shape)
        self.any_sliding = sliding_count(shape, 0, shape["n_layer"]) > 0

    def _fixed(self, gpu_layers: int, k: str, v: str, ctx: int) -> list:
        """Per card, what it holds besides its layers: (compute, pipeline copies, prefill
        pool, reserve, draft)."""
        knobs, shape = self.knobs, self.shape
        swa_per_slot = kv_sizes(shape, knobs, k, v, ctx)[2] if self.any_sliding else 0
        compute = compute_bytes(shape, knobs, True, ctx, swa_per_slot, k, v)
        pipelined = self.split_mode == "layer" and len(self.cards) > 1 and gpu_layers == shape["n_layer"] + 1
        inputs = N_UBATCH * ((ctx + swa_per_slot) * (2 if knobs.flash_attn else 4) + 4 * (shape.get("n_embd") or 0) + 4)
        copies = (PIPELINE_COPIES - 1) * inputs if pipelined else 0
        draft = sum(self._draft(k, v, ctx)[:4])
        return [(compute + copies, copies, prefill_pool_bytes(shape, card.compute_cap) * knobs.cards,
                 knobs.reserve_mib * knobs.cards * MIB, 0 if i else draft) for i, card in enumerate(self.cards)]

    def _draft(self, k: str, v: str, ctx: int) -> tuple:
        """The draft model's (weights, KV, compute, prefill pool) on the first card, all of it
        there, and (weights, KV) on the host; zeros without a draft."""
        if self.draft is None:
            return (0,) * 6
        d = model_bytes(self.draft, card_knobs(self.knobs, self.cards[0]), True, draft_layers(self.knobs, self.draft),
                        k, v, ctx)  # fmt: skip
        return tuple(d[key] for key in ("weights_on_card", "kv_on_card", "compute_on_card", "prefill_pool",
                                        "weights_on_host", "kv_on_host"))  # fmt: skip

    def _budgets(self, fixed: list) -> list:
        return [card.mib * MIB - sum(f) for card, f in zip(self.cards, fixed)]

    def fits(self, gpu_layers: int, k: str, v: str, ctx: int) -> bool:
        swa, full, _ = kv_sizes(self.shape, self.knobs, k, v, ctx)
        budgets = self._budgets(self._fixed(gpu_layers, k, v, ctx))
        return spread(self.stack, budgets, self.shape["n_layer"] + 1 - gpu_layers, swa, full) is not None

    def largest_context(self, gpu_layers: int, k: str, v: str, cap: int) -> int:
        """The largest per-slot context (a multiple of 256, at most ``cap``) that fits every
        card; 0 when not even 256 tokens do."""
        return CTX_STEP * largest_where(0, cap // CTX_STEP, lambda s: self.fits(gpu_layers, k, v, s * CTX_STEP))

    def most_layers(self, k: str, v: str, ctx: int) -> int:
        """Partial offload over the cards: the most layers short of all n_layer + 1 that leave
        room for ``ctx`` (a layer fewer never needs more of any card); 0 when none does."""
        return largest_where(0, self.shape["n_layer"], lambda n: self.fits(n, k, v, ctx))

    def ledger(self, gpu_layers: int, k: str, v: str, ctx: int) -> Ledger:
        """Each card's bytes, the layers spread as evenly as their spare allows (``even_spread``)."""
        shape, stack, n = self.shape, self.stack, self.shape["n_layer"]
        swa, full, swa_per_slot = kv_sizes(shape, self.knobs, k, v, ctx)
        fixed, draft = self._fixed(gpu_layers, k, v, ctx), self._draft(k, v, ctx)
        first = n + 1 - gpu_layers
        counts = even_spread(stack, self._budgets(fixed), first, swa, full)
        books, at = [], first
        for i, (card, take, (compute, copies, pool, reserve, _)) in enumerate(zip(self.cards, counts, fixed)):
            books.append(CardLedger(card.name, card.mib, at, take, take > 0 and at + take == n + 1,
                                    stack.run(at, at + take, 0, 0), stack.kv(at, at + take, swa, full), compute,
                                    copies, pool, reserve, *(draft[:4] if i == 0 else ())))  # fmt: skip
            at += take
        dense_on_cards = (n - min(first, n)) - sliding_count(shape, min(first, n), n)
        return Ledger(
            tuple(books), ctx, self.knobs.parallel, k, v, gpu_layers, n,
            weights_on_host=stack.run(0, first, 0, 0) + shape["token_embd_bytes"],
            kv_on_host=stack.kv(0, first, swa, full), kv_bytes_per_token=dense_on_cards * kv_layer_bytes(shape, k, v),
            compute=compute_bytes(shape, self.knobs, True, ctx, swa_per_slot if self.any_sliding else 0, k, v),
            pipelined=fixed[0][1] > 0, draft_weights_on_host=draft[4], draft_kv_on_host=draft[5],
            draft_gpu_layers=None if self.draft is None else draft_layers(self.knobs, self.draft),
        )  # fmt: skip


def card_knobs(knobs: Knobs, card: Card) -> Knobs:
    """The knobs of one model on this card (``model_bytes``): its own compute capability."""
    return dataclasses.replace(knobs, compute_cap=card.compute_cap)


def check_split_mode(split_mode: str, k: str, v: str) -> None:
    """Refuses a split llama.cpp's build does not serve as planned: ``row`` never, ``tensor``
    with a quantized KV cache (its tensor split does not take one)."""
    if split_mode not in SPLIT_MODES:
        raise PlanError(Failure("split-mode", f"--split-mode {split_mode}", "layer, or tensor",
                                "the layer split (row is deprecated upstream, and no faster on P40s)"))  # fmt: skip
    if split_mode == "tensor" and {k, v} - {*UNQUANTIZED_KV_TYPES, "auto"}:  # a quantized type
        raise PlanError(Failure(
            "split-mode", f"the tensor split with a {k}/{v} KV cache",
            "an unquantized KV cache (f16, bf16, f32): llama.cpp's tensor split does not take a quantized one",
            "server_cache_type_k/v f16 or auto (then f16 only), or the layer split"))  # fmt: skip


def unquantized_knobs(knobs: Knobs) -> Knobs:
    """The tensor split's knobs: ``auto`` KV tries f16 alone (a fixed type is ``check_split_mode``'s)."""
    return dataclasses.replace(knobs, cache_type_k="f16" if knobs.cache_type_k == "auto" else knobs.cache_type_k,
                               cache_type_v="f16" if knobs.cache_type_v == "auto" else knobs.cache_type_v)


def plan(shape: dict, knobs: Knobs, cards=(), draft: Optional[dict] = None, split_mode: str = "layer") -> Plan:
    """The context, KV types and layers of one llama-server over ``cards`` (in their device
    order; none: CPU serving, only the trained context limits it), with ``draft`` the draft
    model's shape sharing the first card (``choose``), each card's ledger and, over several,
    its ``--tensor-split`` share. Raises PlanError naming what was found and what would fit,
    or what in a shape is not what the arithmetic needs (``check_shapes``)."""
    cards = tuple(cards)[:1] if knobs.gpu_layers == 0 else tuple(cards)
    if len(cards) > 1:
        check_split_mode(split_mode, knobs.cache_type_k, knobs.cache_type_v)
        knobs = unquantized_knobs(knobs) if split_mode == "tensor" else knobs
    check_shapes(shape, draft)
    cap, rope = checked_context_cap(shape, knobs)
    wanted, n_all = knobs.ctx_size, shape["n_layer"] + 1
    if not cards or knobs.gpu_layers == 0:
        (k, v), ctx = kv_candidates(knobs)[0], wanted or cap
        return Plan(ctx, knobs.parallel, k, v, 0 if cards else None, rope,
                    ledger(shape, knobs, cards, 0, k, v, ctx, draft),
                    f"ctx {ctx}{_slots(knobs)}, {k}/{v} KV (CPU; trained {shape['n_ctx_train']})")  # fmt: skip
    over = Over(shape, knobs, cards, draft, split_mode)
    largest, k, v, layers, fits, floor, why = choose(knobs, cap, n_all, over.largest_context, over.most_layers)
    _refuse(shape, knobs, cards, draft, split_mode, (layers, k, v, fits, floor))
    ctx = wanted or fits
    book = ledger(shape, knobs, cards, layers, k, v, ctx, draft, split_mode)
    fitting = "the largest that fits" if wanted is None else f"fits; largest {fits}"
    auto = "" if len(largest) == 1 else " (auto)"
    if len(cards) == 1:
        placed = f", {layers} of {n_all} layers on the card" if layers < n_all else ""
        note = f"ctx {ctx}{_slots(knobs)}, {k}/{v} KV{auto}{placed}: {fitting} {cards[0].mib} MiB"
    else:
        fullest = max(book.cards, key=lambda c: c.total / (c.card_mib * MIB))
        placed = f"{layers} of {n_all} layers on the cards" if layers < n_all else f"all {n_all} layers"
        note = (f"ctx {ctx}{_slots(knobs)}, {k}/{v} KV{auto}, {placed} over {len(cards)} cards "
                f"(--tensor-split {','.join(map(str, book.tensor_split))}): {fitting}"
                f"; the fullest card {fullest.total / MIB:.0f} of {fullest.card_mib} MiB")  # fmt: skip
    return Plan(ctx, knobs.parallel, k, v, layers, rope, book, note + why, largest, split_mode)


def _refuse(shape: dict, knobs: Knobs, cards: tuple, draft: Optional[dict], split_mode: str, chosen: tuple) -> None:
    """PlanError ("memory") when the cards leave less than the minimum context, or less than the
    wanted one (``chosen``: layers, K, V, the largest context that fits, the minimum), with the
    numbers of the card, or of each card."""
    layers, k, v, fits, floor = chosen
    wanted, n_all, one = knobs.ctx_size, shape["n_layer"] + 1, len(cards) == 1
    if fits < floor:
        at = ledger(shape, knobs, cards, layers, k, v, floor, draft, split_mode)
        if one:
            raise _memory(f"{cards[0].mib} MiB on the card for {at.weights_on_card / MIB:.0f} MiB of weights "
                          f"(--n-gpu-layers {layers} of {n_all}) + {at.reserve // MIB} MiB reserve",
                          f"{at.total_on_card / MIB:.0f} MiB for a {floor}-token context x {knobs.parallel} slots "
                          f"({k}/{v} KV: {at.kv_bytes_per_token / 1024:.1f} KiB per token)",
                          "a smaller model_quant, a smaller server_min_ctx_size or server_parallel, "
                          "fewer server_gpu_layers (0: CPU only), or a bigger card")  # fmt: skip
        raise _memory(f"{len(cards)} cards of {_sizes(cards)} MiB for {at.weights_on_card / MIB:.0f} MiB of weights "
                      f"(--n-gpu-layers {layers} of {n_all}) + {knobs.reserve_mib} MiB reserve each",
                      f"{_per_card(at)} for a {floor}-token context x {knobs.parallel} slots ({k}/{v} KV)",
                      "more cards for the unit, a smaller model_quant, a smaller server_min_ctx_size or "
                      "server_parallel, fewer server_gpu_layers (0: CPU only)")  # fmt: skip
    if wanted is not None and wanted > fits:
        at = ledger(shape, knobs, cards, layers, k, v, wanted, draft, split_mode)
        if one:
            placed = f", {layers} of {n_all} layers on the card" if layers < n_all else ""
            raise _memory(f"server_ctx_size {wanted} x {knobs.parallel} slots: {at.total_on_card / MIB:.0f} MiB on a "
                          f"{cards[0].mib} MiB card",
                          f"at most {fits} tokens per slot on this card ({k}/{v} KV, "
                          f"{at.kv_bytes_per_token / 1024:.1f} KiB per token{placed})",
                          f"set server_ctx_size <= {fits} (or None), or quantize the KV cache further")  # fmt: skip
        raise _memory(f"server_ctx_size {wanted} x {knobs.parallel} slots: {_per_card(at)} on cards of "
                      f"{_sizes(cards)} MiB",
                      f"at most {fits} tokens per slot on these {len(cards)} cards ({k}/{v} KV, "
                      f"{at.kv_bytes_per_token / 1024:.1f} KiB per token)",
                      f"set server_ctx_size <= {fits} (or None), quantize the KV cache further, or give the unit "
                      "more cards")  # fmt: skip


def _sizes(cards: tuple) -> str:
    return "+".join(str(c.mib) for c in cards)


def _per_card(book: Ledger) -> str:
    return " + ".join(f"{c.total / MIB:.0f}" for c in book.cards) + " MiB"


def check_shapes(shape: dict, draft: Optional[dict] = None) -> None:
    """Where a model's shape comes into the planner, from a host's ``GgufShape``, a header
    read here, or a config.json's estimate: every value of the model's and the draft's is
    of the type and within the range the arithmetic needs (``gguf_header.check_shape``).
    PlanError ("model-shape") naming the first that is not: a bad file is that host's
    refusal, never a TypeError that stops the run for every host."""
    for what, s in [("model", shape)] + ([("draft model", draft)] if draft is not None else []):
        try:
            check_shape(s)
        except GgufError as e:
            where = s.get("path") if isinstance(s, dict) else None
            raise PlanError(Failure(
                "model-shape", f"{what} {where!r}: {e}" if isinstance(where, str) else f"{what}: {e}",
                "a GGUF whose metadata llama.cpp can load: counts as integers in range, a byte count per layer",
                "replace the model file (model_repo, model_file, model_quant), or the draft's",
            )) from None


def _memory(found: str, needed: str, fix: str) -> PlanError:
    return PlanError(Failure("memory", found, needed, fix))


def _slots(knobs: Knobs) -> str:
    return f" x {knobs.parallel} slots" if knobs.parallel > 1 else ""
