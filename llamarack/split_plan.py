"""The planner per card: one llama-server over several cards with llama.cpp's layer
split (``--split-mode layer``), each card with a ledger of its own.

Where llama.cpp puts what, read in its source (src/llama-model.cpp ``load_tensors``,
src/llama-context.cpp where the scheduler is made, ggml/src/ggml-backend.cpp
``ggml_backend_sched_split_graph``) and in the pinned build's ``--help``:

- The offloaded layers (the last ``--n-gpu-layers`` G of the n_layer + 1, the output
  layer last, as on one card) go to the cards in order: the j-th of them to the first
  card whose running share of ``--tensor-split`` (over the sum) is above j / G
  (``std::upper_bound`` over the running sums, in float). Shares given as layer counts
  put exactly that many layers on each card (at a card's boundary both sides are the same
  float quotient, so that layer goes to the next card), and the output layer on the last
  card with a share.
- The token embedding stays on the CPU, as on one card.
- A layer's KV cache is on its layer's card ("split layers and KV across GPUs").
- Each card runs the graph of its own layers and has its own compute buffer (the
  scheduler reserves one per backend): the same feed-forward or attention peak as one card.
- With every layer on the cards and more than one card, llama.cpp pipelines micro-batches
  ("pipeline parallelism enabled"): the scheduler keeps GGML_SCHED_MAX_COPIES (4, the
  build's default) copies of every input of a card's graph: the attention masks, the hidden
  state handed on from the card before (or from the CPU's embedding), the positions. A
  card's compute buffer holds 3 more copies of those than one card's.
- ``--main-gpu`` places nothing with the layer split (the help: "the GPU to use for the
  model (with split-mode = none), or for intermediate results and KV (with split-mode =
  row)"); the plan names the card with the output layer as the main one.
- Every card makes a CUDA context (``reserve_mib``) and, where its prompts go through
  cuBLAS, a prefill pool of its own (``prefill_pool_bytes``, by that card's capability).
- A draft model (speculative decoding) is planned whole on the first card: the unit names
  that card with ``--spec-draft-device`` (by default the draft follows ``--device``).

One card is planned by ``planner.plan`` itself (``plan_split`` of one card is that plan);
the arithmetic here equals ``planner.ledger``'s for one card (tests/unit/test_split_plan.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from itertools import accumulate
from typing import Optional

from llamarack.planner import (CTX_STEP, MIB, N_UBATCH, UNQUANTIZED_KV_TYPES, Knobs, Plan, PlanError, _slots,
                               check_shapes, checked_context_cap, choose, compute_bytes, draft_layers, kv_layer_bytes,
                               kv_sizes, largest_where, model_bytes, plan, prefill_pool_bytes, sliding_count,
                               sliding_layers)  # fmt: skip
from llamarack.errors import Failure

# ggml's GGML_SCHED_MAX_COPIES (ggml/CMakeLists.txt, default 4): the inputs a card's graph
# keeps, per input, when the scheduler pipelines micro-batches over several cards.
PIPELINE_COPIES = 4
# What llama.cpp's --split-mode takes that the planner plans. Never "row" (deprecated
# upstream, and no faster on P40s); "tensor" only with an unquantized KV cache.
SPLIT_MODES = ("layer", "tensor")


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
    draft: int = 0  # the draft model's weights, KV, compute and prefill pool (the first card)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.prefill_pool + self.reserve + self.draft

    def fits(self) -> bool:
        return self.total <= self.card_mib * MIB

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total, "spare": self.card_mib * MIB - self.total}


@dataclass(frozen=True)
class SplitLedger:
    """Where the bytes go over a unit's cards, for one choice of layers, KV types and context."""

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
    pipelined: bool  # llama.cpp's pipeline parallelism: every layer on more than one card
    draft_gpu_layers: Optional[int] = None
    draft_on_host: int = 0  # the draft's weights and KV left on the host

    @property
    def tensor_split(self) -> tuple:
        """``--tensor-split``: each card's layer count (llama.cpp takes proportions)."""
        return tuple(c.layers for c in self.cards)

    @property
    def main_gpu(self) -> int:
        """The card that holds the output layer (its index in the unit)."""
        return next((i for i, c in enumerate(self.cards) if c.output_layer), 0)

    @property
    def weights_on_card(self) -> int:
        """The model's weights on all the cards together (the unit's residency check)."""
        return sum(c.weights for c in self.cards)

    def fits(self) -> bool:
        return all(c.fits() for c in self.cards)

    def as_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "cards"},
                "cards": [c.as_dict() for c in self.cards], "tensor_split": list(self.tensor_split),
                "main_gpu": self.main_gpu, "weights_on_card": self.weights_on_card,
                "total_on_cards": sum(c.total for c in self.cards)}  # fmt: skip


@dataclass(frozen=True)
class SplitPlan(Plan):
    """A unit's plan over its cards: ``planner.Plan``'s fields, ``ledger`` a ``SplitLedger``
    and ``largest`` with every layer on the cards; ``single`` is the one-card planner's own
    plan when there is one card."""

    split_mode: str = "layer"
    single: Optional[Plan] = None

    def split_args(self) -> list:
        """llama-server's split flags: none for one card."""
        if len(self.ledger.cards) < 2:
            return []
        return ["--split-mode", self.split_mode, "--tensor-split", ",".join(map(str, self.ledger.tensor_split)),
                "--main-gpu", str(self.ledger.main_gpu)]  # fmt: skip

    def as_dict(self) -> dict:
        return super().as_dict(split_mode=self.split_mode, split_args=self.split_args())


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
        self.shape, self.knobs, self.cards, self.draft = shape, dataclasses.replace(knobs, cards=1), cards, draft
        self.split_mode = split_mode
        self.stack = _Stack(shape)
        self.any_sliding = sliding_count(shape, 0, shape["n_layer"]) > 0

    def _fixed(self, gpu_layers: int, k: str, v: str, ctx: int) -> list:
        """Per card, what it holds besides its layers: (compute, pipeline copies, prefill
        pool, reserve, draft), and the draft's part on the host."""
        knobs, shape = self.knobs, self.shape
        swa_per_slot = kv_sizes(shape, knobs, k, v, ctx)[2] if self.any_sliding else 0
        compute = compute_bytes(shape, knobs, True, ctx, swa_per_slot, k, v)
        pipelined = self.split_mode == "layer" and len(self.cards) > 1 and gpu_layers == shape["n_layer"] + 1
        inputs = N_UBATCH * ((ctx + swa_per_slot) * (2 if knobs.flash_attn else 4) + 4 * (shape.get("n_embd") or 0) + 4)
        copies = (PIPELINE_COPIES - 1) * inputs if pipelined else 0
        draft = on_host = 0
        if self.draft is not None:  # all on the first card
            d = model_bytes(self.draft, card_knobs(knobs, self.cards[0]), True, draft_layers(knobs, self.draft), k, v,
                            ctx)  # fmt: skip
            draft = d["weights_on_card"] + d["kv_on_card"] + d["compute_on_card"] + d["prefill_pool"]
            on_host = d["weights_on_host"] + d["kv_on_host"]
        return [(compute + copies, copies, prefill_pool_bytes(shape, card.compute_cap), knobs.reserve_mib * MIB,
                 0 if i else draft) for i, card in enumerate(self.cards)], on_host  # fmt: skip

    def _budgets(self, fixed: list) -> list:
        return [card.mib * MIB - sum(f) for card, f in zip(self.cards, fixed)]

    def fits(self, gpu_layers: int, k: str, v: str, ctx: int) -> bool:
        swa, full, _ = kv_sizes(self.shape, self.knobs, k, v, ctx)
        budgets = self._budgets(self._fixed(gpu_layers, k, v, ctx)[0])
        return spread(self.stack, budgets, self.shape["n_layer"] + 1 - gpu_layers, swa, full) is not None

    def largest_context(self, gpu_layers: int, k: str, v: str, cap: int) -> int:
        """The largest per-slot context (a multiple of 256, at most ``cap``) that fits every
        card; 0 when not even 256 tokens do."""
        return CTX_STEP * largest_where(0, cap // CTX_STEP, lambda s: self.fits(gpu_layers, k, v, s * CTX_STEP))

    def most_layers(self, k: str, v: str, ctx: int) -> int:
        """Partial offload over the cards: the most layers short of all n_layer + 1 that leave
        room for ``ctx`` (a layer fewer never needs more of any card); 0 when none does."""
        return largest_where(0, self.shape["n_layer"], lambda n: self.fits(n, k, v, ctx))

    def ledger(self, gpu_layers: int, k: str, v: str, ctx: int) -> SplitLedger:
        """Each card's bytes, the layers spread as evenly as their spare allows (``even_spread``)."""
        shape, stack, n = self.shape, self.stack, self.shape["n_layer"]
        swa, full, _ = kv_sizes(shape, self.knobs, k, v, ctx)
        fixed, draft_on_host = self._fixed(gpu_layers, k, v, ctx)
        first = n + 1 - gpu_layers
        counts = even_spread(stack, self._budgets(fixed), first, swa, full)
        books, at = [], first
        for card, take, (compute, copies, pool, reserve, draft) in zip(self.cards, counts, fixed):
            books.append(CardLedger(card.name, card.mib, at, take, take > 0 and at + take == n + 1,
                                    stack.run(at, at + take, 0, 0), stack.kv(at, at + take, swa, full), compute,
                                    copies, pool, reserve, draft))  # fmt: skip
            at += take
        dense_on_cards = (n - min(first, n)) - sliding_count(shape, min(first, n), n)
        return SplitLedger(
            tuple(books), ctx, self.knobs.parallel, k, v, gpu_layers, n,
            weights_on_host=stack.run(0, first, 0, 0) + shape["token_embd_bytes"],
            kv_on_host=stack.kv(0, first, swa, full), kv_bytes_per_token=dense_on_cards * kv_layer_bytes(shape, k, v),
            pipelined=fixed[0][1] > 0, draft_on_host=draft_on_host,
            draft_gpu_layers=None if self.draft is None else draft_layers(self.knobs, self.draft),
        )  # fmt: skip


def _one_card(shape: dict, knobs: Knobs, card: Optional[Card], draft: Optional[dict]) -> SplitPlan:
    """``planner.plan`` for one card (None: CPU serving), as it is, its ledger as a unit's."""
    p = plan(shape, knobs, None, draft) if card is None else plan(shape, card_knobs(knobs, card), card.mib, draft)
    book, layers = p.ledger, p.ledger.gpu_layers or 0
    cards = () if card is None else (CardLedger(
        card.name, card.mib, book.n_layer + 1 - layers, layers, layers >= 1, book.weights_on_card, book.kv_on_card,
        book.compute_on_card, 0, book.prefill_pool, book.reserve,
        book.draft_weights_on_card + book.draft_kv_on_card + book.draft_compute_on_card + book.draft_prefill_pool),)
    split = SplitLedger(cards, book.ctx_per_slot, book.parallel, book.cache_type_k, book.cache_type_v, layers,
                        book.n_layer, book.weights_on_host, book.kv_on_host, book.kv_bytes_per_token, False,
                        book.draft_gpu_layers, book.draft_weights_on_host + book.draft_kv_on_host)  # fmt: skip
    return SplitPlan(**{**vars(p), "ledger": split}, single=p)


def card_knobs(knobs: Knobs, card: Card) -> Knobs:
    """The one-card planner's knobs for this card: its own compute capability, itself alone."""
    return dataclasses.replace(knobs, compute_cap=card.compute_cap, cards=1)


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


def plan_split(shape: dict, knobs: Knobs, cards, draft: Optional[dict] = None, split_mode: str = "layer") -> SplitPlan:
    """The plan of one llama-server over ``cards`` (in their device order): context, KV
    types and layers (``planner.choose``), each card's ledger and its ``--tensor-split``
    share. No card: CPU serving; one card: ``planner.plan``'s plan, exactly. Raises PlanError."""
    cards = tuple(cards)
    if len(cards) < 2 or knobs.gpu_layers == 0:
        return _one_card(shape, knobs, cards[0] if cards else None, draft)
    check_split_mode(split_mode, knobs.cache_type_k, knobs.cache_type_v)
    if split_mode == "tensor":
        knobs = unquantized_knobs(knobs)
    check_shapes(shape, draft)
    cap, rope = checked_context_cap(shape, knobs)
    over, n_all, wanted = Over(shape, knobs, cards, draft, split_mode), shape["n_layer"] + 1, knobs.ctx_size
    largest, k, v, layers, fits, floor, why = choose(knobs, cap, n_all, over.largest_context, over.most_layers)
    _refuse_split(over, layers, k, v, fits, floor)
    ctx = wanted or fits
    book = over.ledger(layers, k, v, ctx)
    fullest = max(book.cards, key=lambda c: c.total / (c.card_mib * MIB))
    placed = f"{layers} of {n_all} layers on the cards" if layers < n_all else f"all {n_all} layers"
    note = (f"ctx {ctx}{_slots(knobs)}, {k}/{v} KV"
            f"{'' if len(largest) == 1 else ' (auto)'}, {placed} over {len(cards)} cards "
            f"(--tensor-split {','.join(map(str, book.tensor_split))}): "
            + ("the largest that fits" if wanted is None else f"fits; largest {fits}")
            + f"; the fullest card {fullest.total / MIB:.0f} of {fullest.card_mib} MiB")  # fmt: skip
    return SplitPlan(ctx, knobs.parallel, k, v, layers, rope, book, note + why, largest, split_mode)


def unquantized_knobs(knobs: Knobs) -> Knobs:
    """The tensor split's knobs: ``auto`` KV tries f16 alone (a fixed type is ``check_split_mode``'s)."""
    return dataclasses.replace(knobs, cache_type_k="f16" if knobs.cache_type_k == "auto" else knobs.cache_type_k,
                               cache_type_v="f16" if knobs.cache_type_v == "auto" else knobs.cache_type_v)


def _refuse_split(over: Over, layers: int, k: str, v: str, fits: int, floor: int) -> None:
    """PlanError ("memory") when the cards leave less than the minimum context, or less than
    the wanted one, with each card's numbers."""
    knobs, n_all, wanted = over.knobs, over.shape["n_layer"] + 1, over.knobs.ctx_size
    sizes = "+".join(str(c.mib) for c in over.cards)
    if fits < floor:
        at = over.ledger(layers, k, v, floor)
        raise PlanError(Failure(
            "memory", f"{len(over.cards)} cards of {sizes} MiB for {at.weights_on_card / MIB:.0f} MiB of weights "
            f"(--n-gpu-layers {layers} of {n_all}) + {knobs.reserve_mib} MiB reserve each",
            f"{_per_card(at)} for a {floor}-token context x {knobs.parallel} slots ({k}/{v} KV)",
            "more cards for the unit, a smaller model_quant, a smaller server_min_ctx_size or server_parallel, "
            "fewer server_gpu_layers (0: CPU only)"))  # fmt: skip
    if wanted is not None and wanted > fits:
        at = over.ledger(layers, k, v, wanted)
        raise PlanError(Failure(
            "memory", f"server_ctx_size {wanted} x {knobs.parallel} slots: {_per_card(at)} on cards of {sizes} MiB",
            f"at most {fits} tokens per slot on these {len(over.cards)} cards ({k}/{v} KV, "
            f"{at.kv_bytes_per_token / 1024:.1f} KiB per token)",
            f"set server_ctx_size <= {fits} (or None), quantize the KV cache further, or give the unit more cards"))


def _per_card(book: SplitLedger) -> str:
    return " + ".join(f"{c.total / MIB:.0f}" for c in book.cards) + " MiB"
