"""How a host's cards serve a model: one llama-server per card (``per_card``), or one over
several (``split``), or ``auto`` between them. docs/planning.md ("The layout", "When the
ledger alone cannot choose") says how the cards are grouped and when the host's llama-bench
record decides; ``choose_layout`` says which layout, and why, ``rival_layout`` finds the case
the ledger cannot rank and ``settle`` ranks it by the bench record.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional

from llamarack.errors import Failure
from llamarack.gpu_table import planning_memory_mib

from .planner import (MIB, Card, Knobs, Over, Plan, PlanError, check_shapes, checked_context_cap, check_split_mode,
                      kv_candidates, plan, unquantized_knobs)  # fmt: skip

LAYOUTS = ("auto", "per_card", "split")


def cards_of(gpus) -> tuple:
    """The planner's cards from a host's ``Gpu`` facts, in their order: each planned at its
    board's smallest known memory (``planning_memory_mib``), named by its UUID."""
    return tuple(Card(g.name, planning_memory_mib(g.pci_device_id, g.memory_mib), g.compute_cap, g.uuid)
                 for g in gpus)  # fmt: skip


@dataclass(frozen=True)
class Unit:
    """One llama-server: the host's cards it serves from (indexes into the host's list, in
    the unit's device order) and its plan."""

    cards: tuple
    plan: Plan

    def as_dict(self, host_cards: tuple) -> dict:
        return {"cards": list(self.cards), "card_ids": [host_cards[i].id for i in self.cards],
                "plan": self.plan.as_dict()}  # fmt: skip


@dataclass(frozen=True)
class Layout:
    asked: str  # auto, per_card, split
    chosen: str  # per_card, split, mixed (units of one card and of several), cpu
    units: tuple
    free: tuple  # the cards no unit serves from
    reason: str
    cards: tuple  # the host's cards (Card)
    contested: str = ""  # where the ledger alone could not choose (``rival_layout``): how it was settled

    def as_dict(self) -> dict:
        return {"asked": self.asked, "chosen": self.chosen, "reason": self.reason, "free": list(self.free),
                "contested": self.contested or None,
                "cards": [asdict(c) for c in self.cards],
                "units": [u.as_dict(self.cards) for u in self.units]}  # fmt: skip


def choose_layout(shape: dict, knobs: Knobs, cards, layout: str = "auto", draft: Optional[dict] = None,
                  split_mode: str = "layer") -> Layout:  # fmt: skip
    """The units ``layout`` makes of a host's ``cards`` (its order: CUDA's), each with its
    plan, and the reason. No card: one unit served from the CPU. Raises PlanError (a card
    of ``per_card`` that serves nothing, a unit over all the cards that serves nothing, a
    split mode that cannot serve the KV cache)."""
    cards = tuple(cards)
    check_shapes(shape, draft)
    if layout not in LAYOUTS:
        raise PlanError(Failure("layout", repr(layout), "one of " + ", ".join(LAYOUTS), "set the layout to auto"))
    if not cards or knobs.gpu_layers == 0:
        unit = Unit(tuple(range(min(len(cards), 1))), plan(shape, knobs, cards[:1], draft))
        why = "no card: served from the CPU" if not cards else "server_gpu_layers 0: one unit, served from the CPU"
        return Layout(layout, "cpu", (unit,), tuple(range(1, len(cards))), why, cards)
    if layout == "per_card":
        units = tuple(Unit((i,), _alone(shape, knobs, cards, i, draft)) for i in range(len(cards)))
        why = "; ".join(f"card {u.cards[0]}: {u.plan.note}" for u in units if u.plan.note != units[0].plan.note
                        or u is units[0])  # fmt: skip
        return Layout(layout, "per_card", units, (), f"per_card (asked): each card planned alone; {why}"
                      + (f"; {len(units)} units" if len(units) > 1 else ""), cards)  # fmt: skip
    check_split_mode(split_mode, knobs.cache_type_k, knobs.cache_type_v)
    need = _need(shape, knobs)
    order = sorted(range(len(cards)), key=lambda i: -cards[i].mib)
    groups, left, at_least = [], order, 2 if layout == "split" else 1
    while left and (take := _fewest(shape, knobs, [cards[i] for i in left], draft, split_mode, need, at_least)):
        groups.append(tuple(left[:take]))
        left = left[take:]
    if not groups:  # nothing holds every layer: one unit over every card, the most layers it can
        groups, left = [tuple(order)], []
    units = tuple(Unit(g, plan(shape, knobs, [cards[i] for i in g], draft, split_mode)) for g in groups)
    return _explained(shape, knobs, cards, layout, units, tuple(sorted(left)), need, draft)


def _alone(shape: dict, knobs: Knobs, cards: tuple, i: int, draft: Optional[dict]) -> Plan:
    """Card ``i``'s plan alone; a refusal names the card."""
    try:
        return plan(shape, knobs, [cards[i]], draft)
    except PlanError as e:
        f = e.failure
        raise PlanError(Failure(f.rule, f"card {i} ({cards[i].name}): {f.found}", f.needed, f.fix)) from None


def _need(shape: dict, knobs: Knobs) -> int:
    """The context per slot a unit must give with every layer: the wanted one, else the
    minimum (at most the trained one)."""
    cap, _ = checked_context_cap(shape, knobs)
    return knobs.ctx_size or min(knobs.min_ctx_size, cap)


def reach(shape: dict, knobs: Knobs, cards: list, draft: Optional[dict], split_mode: str = "layer") -> int:
    """The largest context per slot these cards give with every layer (or the fixed
    ``gpu_layers``) on them, with the most compact KV type ``knobs`` allows."""
    cap, _ = checked_context_cap(shape, knobs)
    layers = shape["n_layer"] + 1 if knobs.gpu_layers is None else min(knobs.gpu_layers, shape["n_layer"] + 1)
    if len(cards) > 1 and split_mode == "tensor":
        knobs = unquantized_knobs(knobs)
    k, v = kv_candidates(knobs)[-1]
    return Over(shape, knobs, tuple(cards), draft, split_mode).largest_context(layers, k, v, cap)


def _fewest(shape: dict, knobs: Knobs, cards: list, draft: Optional[dict], split_mode: str, need: int,
            at_least: int) -> Optional[int]:  # fmt: skip
    """How many of ``cards`` (from the first) hold every layer at ``need`` tokens, fewest first."""
    return next((n for n in range(at_least, len(cards) + 1)
                 if reach(shape, knobs, cards[:n], draft, split_mode) >= need), None)  # fmt: skip


def _explained(shape: dict, knobs: Knobs, cards: tuple, layout: str, units: tuple, free: tuple,
               need: int, draft: Optional[dict]) -> Layout:  # fmt: skip
    """The layout, with the reason in words: what one card holds, what the units hold."""
    n_all, sizes = shape["n_layer"] + 1, {len(u.cards) for u in units}
    chosen = "per_card" if sizes == {1} else "split" if 1 not in sizes else "mixed"
    first, at = units[0].plan, f"{need:,} tokens" + ("" if knobs.ctx_size else " (the minimum)")
    big = max(cards, key=lambda c: c.mib)
    if first.gpu_layers < n_all:
        head = (f"{_over(units[0])}: {'no group of the cards holds' if len(cards) > 1 else 'the card does not hold'} "
                f"all {n_all} layers at {at}; {first.gpu_layers} of {n_all} on the "
                f"card{'s' if len(units[0].cards) > 1 else ''}, the rest on the host")  # fmt: skip
    elif chosen == "mixed":
        head = "mixed: " + "; ".join(f"{_over(u)}: {u.plan.note}" for u in units)
    elif chosen == "per_card":
        c = first.ledger.cards[0]
        head = (f"per_card: all {n_all} layers at {at} fit one {c.name} alone (planned {c.total / MIB:,.0f} of "
                f"{c.card_mib:,} MiB at {first.ctx_per_slot:,} tokens, {first.cache_type_k}/{first.cache_type_v} KV)")
    else:
        k, v = kv_candidates(knobs)[-1]
        alone = n_all if reach(shape, knobs, [big], draft) >= need else Over(shape, knobs, (big,), draft).most_layers(
            k, v, need)  # fmt: skip
        fullest = max(first.ledger.cards, key=lambda c: c.total / c.card_mib)
        asks = "the layout asks for a split" if layout == "split" else "the llama-bench record measured a split faster"
        head = (f"{_over(units[0])}: "
                + (f"all {n_all} layers fit one {big.name} at {at}, and {asks}"
                   if alone == n_all else f"{alone} of {n_all} layers fit one {big.name} at {at}")
                + f"; {len(units[0].cards)} cards hold all {n_all} at {first.ctx_per_slot:,} tokens "
                f"({first.cache_type_k}/{first.cache_type_v} KV, the fullest card {fullest.total / MIB:,.0f} of "
                f"{fullest.card_mib:,} MiB)")  # fmt: skip
    tail = f"; {len(units)} units" if len(units) > 1 else ""
    if free:
        tail += (f"; card{'s' if len(free) > 1 else ''} {', '.join(map(str, free))} left free: too few left for "
                 f"another unit that holds every layer at {at}" + (" (a split takes two cards at least)"
                                                                   if layout == "split" else ""))  # fmt: skip
    return Layout(layout, chosen, units, free, ("" if layout == "auto" else f"({layout} asked) ") + head + tail,
                  cards)  # fmt: skip


def _over(unit: Unit) -> str:
    n = len(unit.cards)
    return f"card {unit.cards[0]} alone" if n == 1 else f"split over {n} cards ({', '.join(map(str, unit.cards))})"


def rival_layout(shape: dict, knobs: Knobs, cards, chosen: Layout, draft: Optional[dict] = None,
                 split_mode: str = "layer") -> Optional[Layout]:  # fmt: skip
    """The layout the ledger alone cannot rank against ``chosen`` (``auto``'s answer), or None:
    ``split``'s units when ``auto`` chose ``per_card`` with no wanted context and each of
    them gives more context than the per-card unit with the least (docs/planning.md, "When
    the ledger alone cannot choose", says why only then)."""
    cards = tuple(cards)
    if chosen.asked != "auto" or chosen.chosen != "per_card" or knobs.ctx_size or len(cards) < 2:
        return None
    try:
        split = choose_layout(shape, knobs, cards, "split", draft, split_mode)
    except PlanError:
        return None
    if (split.chosen != "split" or any(u.plan.gpu_layers < shape["n_layer"] + 1 for u in split.units)
            or _least_context(split) <= _least_context(chosen)):
        return None
    return _explained(shape, knobs, cards, "auto", split.units, split.free, _need(shape, knobs), draft)


def _least_context(layout: Layout) -> int:
    return min(u.plan.ctx_per_slot for u in layout.units)


def trade(chosen: Layout, rival: Layout) -> str:
    """What the ledger offers between a layout and its rival, in words."""
    def said(lay: Layout) -> str:
        n = len(lay.units)
        return f"{lay.chosen} serves {n} unit{'s' if n > 1 else ''} of {_least_context(lay):,} tokens per slot"

    return f"the ledger alone cannot choose: {said(chosen)}, {said(rival)}"


def settle(chosen: Layout, rival: Layout, figures: Optional[dict], source: str) -> tuple:
    """(the layout served, the other) of ``chosen`` (the ledger's answer) and its ``rival``:
    the one of the larger total tg128 over its units (``figures``: ``{layout.chosen: [t/s,
    ...]}``, None when the record does not hold both), else the ledger's answer; the reason
    says which, and by what (``source``: which record, or why there is none)."""
    said = trade(chosen, rival)
    if not figures:
        return replace(chosen, reason=f"{chosen.reason}; {said}; {source}: {chosen.chosen}, the ledger's answer",
                       contested=f"{said}; {source}"), rival  # fmt: skip
    totals = {lay.chosen: sum(figures[lay.chosen]) for lay in (chosen, rival)}
    served, other = (rival, chosen) if totals[rival.chosen] > totals[chosen.chosen] else (chosen, rival)

    def measured(lay: Layout) -> str:
        each = figures[lay.chosen]
        if len(each) == 1:
            return f"{lay.chosen} {each[0]:g} t/s in 1 unit"
        parts = f"{len(each)} x {each[0]:g}" if len(set(each)) == 1 else " + ".join(f"{f:g}" for f in each)
        return f"{lay.chosen} {parts} = {totals[lay.chosen]:g} t/s"

    verdict = f"{source}: tg128 {measured(served)} against {measured(other)}: {served.chosen}"
    return replace(served, reason=f"{served.reason}; {said}; {verdict}", contested=f"{said}; {verdict}"), other
