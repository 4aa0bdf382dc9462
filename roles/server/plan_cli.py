"""``llamarack plan``: what can this card, or this host's cards, serve? Before
anything is deployed.

The same planner as the server role (``planner.py``, and ``card_layout.py`` for a
host's cards), on a shape from a GGUF header (a local file, or the hub with HTTP
ranges: only the header is read) or from a ``config.json`` and a quant.
"""

from __future__ import annotations

import collections
import json
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import click

from llamarack.errors import ModelSourceError
from llamarack.gpu_table import BOARDS, planning_memory_mib
from llamarack.secrets import read_token
from llamarack.settings_fields import loopback_url, remote_url
from roles.model.plan import artifact_quality, quality_summary
from roles.model.settings import QUANT_TYPES
from roles.model.shapes import hub_gguf_shape, local_gguf_shape, shape_from_config

from .card_layout import LAYOUTS, choose_layout, rival_layout, settle
from .host_ram import HostLedger, HostRam, plan_host, unit_share
from .planner import (AUTO_KV_TYPES, KV_TYPE_BYTES, MIB, SPLIT_MODES, Card, Knobs, Ledger, Over, PlanError,
                      check_shapes, context_cap, cublas_prefill, ledger, plan)  # fmt: skip
from .settings import DEFAULT_RESERVE_MIB

GIB = 2**30
# Where the ledger alone cannot choose the layout, a host's llama-bench record decides; here is none.
NO_RECORD = ("on a host its llama-bench record of both decides (the deploy's layout reason and `llamarack audit` "
             "say which, with the figures); `llamarack plan` reads none")


def card_memory(gpu: str) -> tuple:
    """(name, MiB to plan with, compute capability) for a card name from the table, or
    for a number of MiB (the capability then unknown: None)."""
    if gpu.isdigit():
        return f"{gpu} MiB", int(gpu), None
    want = re.sub(r"[^a-z0-9]", "", gpu.lower())
    found = {}
    for b in BOARDS.values():
        if b.memory_gb and want in re.sub(r"[^a-z0-9]", "", b.name.lower()):
            found.setdefault(planning_memory_mib(b.device_id, 10**9), (b.name, b.compute_cap))
    if len(found) != 1:
        known = sorted({b.name for b in BOARDS.values() if b.memory_gb})
        which = "matches boards of different memory: " + ", ".join(sorted(n for n, _ in found.values())) if found \
            else "names no board with known memory"  # fmt: skip
        raise click.BadParameter(f"{gpu!r} {which}; give MiB, or one of: {', '.join(known)}", param_hint="--gpu")
    mib, (name, cap) = next(iter(found.items()))
    return name, mib, cap


def token_host(endpoint: str, token_file: Optional[str], trusted_network: bool) -> Optional[str]:
    """The server (host[:port]) a hub token read from ``token_file`` is sent to, or None
    without a token; the endpoint is held to model_hf_endpoint's shape, and plain http://
    with a token off this host to ``trusted_network``, as the settings are."""
    problem = remote_url(endpoint)
    if problem:
        raise click.BadParameter(f"{endpoint!r}: allowed: {problem}", param_hint="--hub-endpoint")
    if not token_file:
        return None
    if endpoint.startswith("http://") and not (trusted_network or loopback_url(endpoint)):
        raise click.BadParameter(f"{endpoint!r} with --hub-token-file: the token would travel in clear; use "
                                 "https://, or --trusted-network on a closed network", param_hint="--hub-endpoint")
    return urllib.parse.urlsplit(endpoint).netloc


def kv_table(shape: dict, knobs: Knobs, cards, pairs: list, draft: Optional[dict] = None,
             split_mode: str = "layer") -> list:  # fmt: skip
    """Per KV type: the largest per-slot context with every layer on ``cards`` and, when that
    is below the minimum, the most layers that fit the minimum and what they allow."""
    over = Over(shape, knobs, tuple(cards), draft, split_mode)
    cap, _ = context_cap(shape, knobs)
    n_all = shape["n_layer"] + 1
    floor = min(knobs.min_ctx_size, cap)
    rows = []
    for k, v in pairs:
        row = {"kv": f"{k}/{v}", "all_layers": over.largest_context(n_all, k, v, cap), "gpu_layers": n_all}
        if row["all_layers"] < floor:
            fit = over.most_layers(k, v, floor)
            row.update(gpu_layers=fit, with_fewer=over.largest_context(fit, k, v, cap) if fit else 0)
        rows.append(row)
    return rows


def _gib(n: float) -> str:
    return f"{n / GIB:8.2f} GiB"


@click.command("plan")
@click.argument("gguf", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--hub-repo", help="read the GGUF's header from this hub repository (HTTP ranges)")
@click.option("--revision", help="the hub commit (with --hub-repo)")
@click.option("--file", "hub_file", help="the GGUF's path in the repository (with --hub-repo)")
@click.option("--hub-endpoint", default="https://huggingface.co", show_default=True,
              help="Hugging Face endpoint or mirror (as model_hf_endpoint)")
@click.option("--hub-token-file", type=click.Path(exists=True, dir_okay=False),
              help="file holding a hub token (sent to --hub-endpoint's server alone, named in the output)")
@click.option("--trusted-network", is_flag=True,
              help="allow a plain http:// --hub-endpoint with a token (a closed network, as llamarack_trusted_network)")
@click.option("--config", "config_json", type=click.Path(exists=True, dir_okay=False),
              help="a model's config.json: the weights estimated for --quant")
@click.option("--quant", type=click.Choice(QUANT_TYPES), default="Q4_K_M", show_default=True,
              help="with --config: the llama-quantize type")
@click.option("--gpu", required=True, multiple=True,
              help="a card from the table (e.g. 'V100 SXM2 16GB') or its memory in MiB; for a host of mixed cards "
                   "repeat it, or give a comma-separated list, one name per card")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1),
              help="cards per host: this many of the one --gpu, each planned as itself (see --layout)")
@click.option("--layout", type=click.Choice(LAYOUTS), default="auto", show_default=True,
              help="with several cards: a server per card, one over the fewest cards that hold every layer, "
                   "or auto (per card when one card holds every layer at the wanted or minimum context)")
@click.option("--split-mode", type=click.Choice(SPLIT_MODES), default="layer", show_default=True,
              help="llama.cpp's split over a unit's cards (tensor: an unquantized KV cache only)")
@click.option("--kv", "kv_types", multiple=True, type=click.Choice(("auto",) + tuple(KV_TYPE_BYTES)),
              help="KV cache type for K and V (repeat for a table; default: the table of f16, q8_0, q4_0, plan with auto)")
@click.option("--ctx", "ctx_size", type=click.IntRange(1), help="wanted context per slot (default: the largest)")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(1), help="slots")
@click.option("--gpu-layers", type=click.IntRange(0), help="fix --n-gpu-layers (default: all that fit)")
@click.option("--min-ctx", default=4096, show_default=True, type=click.IntRange(1),
              help="context per slot below which fewer layers go on the card")
@click.option("--rope-scaling", type=click.Choice(("none", "yarn", "linear")), default="none", show_default=True)
@click.option("--rope-scale", default=1.0, show_default=True, type=click.FloatRange(1.0))
@click.option("--yarn-orig-ctx", type=click.IntRange(1), help="YaRN's original context (default: the GGUF's)")
@click.option("--reserve-mib", default=DEFAULT_RESERVE_MIB, show_default=True, type=click.IntRange(0),
              help="per card: the CUDA context and pools")
@click.option("--no-flash-attn", is_flag=True, help="plan without flash attention (V stays f16)")
@click.option("--draft", "draft_gguf", type=click.Path(exists=True, dir_okay=False),
              help="a draft model's GGUF (speculative decoding): its weights, KV and compute share the card")
@click.option("--draft-config", type=click.Path(exists=True, dir_okay=False),
              help="a draft model's config.json, its weights estimated for --draft-quant")
@click.option("--draft-quant", type=click.Choice(QUANT_TYPES), default="Q8_0", show_default=True)
@click.option("--draft-gpu-layers", type=click.IntRange(0), help="the draft's layers on the card (default: all)")
@click.option("--host-ram-mib", type=click.IntRange(1),
              help="the host's memory (its MemTotal, MiB): the units' host-RAM ledger is checked against it less "
                   "--host-ram-reserve-mib, their --cache-ram lowered to fit (default: shown, not checked)")
@click.option("--host-ram-reserve-mib", default=HostRam.reserve_mib, show_default=True, type=click.IntRange(0),
              help="of the host's memory, left to the system (server_host_ram_reserve_mib)")
@click.option("--cache-ram", default=HostRam.cache_ram, show_default=True, type=click.IntRange(-1),
              help="llama-server's prompt cache in host RAM, MiB (server_cache_ram; -1 no limit, 0 none)")
@click.option("--cache-ram-min", default=HostRam.cache_ram_min, show_default=True, type=click.IntRange(0),
              help="the least --cache-ram is lowered to where the host's memory does not hold it (server_cache_ram_min)")
@click.option("--cpu-build", is_flag=True,
              help="the units run a CPU build (llamacpp_backend = 'cpu'): every part of them, and a CPU process, in "
                   "the host's memory")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def plan_command(gguf, hub_repo, revision, hub_file, hub_endpoint, hub_token_file, trusted_network, config_json,
                 quant, gpu, gpus, layout, split_mode,
                 kv_types, ctx_size, parallel, gpu_layers, min_ctx, rope_scaling, rope_scale, yarn_orig_ctx,
                 reserve_mib, no_flash_attn, draft_gguf, draft_config, draft_quant, draft_gpu_layers,
                 host_ram_mib, host_ram_reserve_mib, cache_ram, cache_ram_min, cpu_build, as_json):  # fmt: skip
    """What a model needs on a card and what the card allows: the ledger
    (weights, KV, compute, reserve), the largest context for each KV type, and
    whether every layer fits or only some. With several cards (--gpus, or --gpu
    repeated), how they serve it (--layout) and each card's ledger. Then each
    unit's share of the host's memory (--host-ram-mib). Give GGUF (a local file),
    or --hub-repo/--revision/--file, or --config with --quant."""
    if sum(map(bool, (gguf, hub_repo, config_json))) != 1:
        raise click.UsageError("give one of: a GGUF path, --hub-repo (with --revision and --file), --config")
    sent_to = None
    try:
        if gguf:
            shape = local_gguf_shape(gguf)
        elif hub_repo:
            if not (revision and hub_file):
                raise click.UsageError("--hub-repo needs --revision and --file")
            sent_to = token_host(hub_endpoint, hub_token_file, trusted_network)
            token = read_token(hub_token_file, "--hub-token-file") if hub_token_file else None
            shape = hub_gguf_shape(hub_endpoint, hub_repo, revision, hub_file, token)
        else:
            shape = shape_from_config(json.loads(Path(config_json).read_text()), quant, config_json)
        draft = local_gguf_shape(draft_gguf) if draft_gguf else None
        if draft_config:
            draft = shape_from_config(json.loads(Path(draft_config).read_text()), draft_quant, draft_config)
        check_shapes(shape, draft)
    except (ModelSourceError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except PlanError as e:
        raise click.ClickException(e.failure.message("plan")) from None
    cards = host_cards(gpu, gpus)
    chosen = kv_types[-1] if kv_types else "auto"
    knobs = Knobs(ctx_size=ctx_size, parallel=parallel, cache_type_k=chosen, cache_type_v=chosen,
                  flash_attn=not no_flash_attn, gpu_layers=gpu_layers, min_ctx_size=min_ctx,
                  rope_scaling=rope_scaling, rope_scale=rope_scale, rope_orig_ctx=yarn_orig_ctx,
                  reserve_mib=reserve_mib, draft_gpu_layers=draft_gpu_layers)  # fmt: skip
    pairs = [(t, t) for t in kv_types if t != "auto"] or [(t, t) for t in AUTO_KV_TYPES]
    pairs = list(dict.fromkeys([(k, "f16") for k, _ in pairs] if no_flash_attn else pairs))
    asked = _Asked(shape, knobs, pairs, draft, layout, split_mode)
    report, text, refusal, plans = (_one_card(asked, cards[0]) if len(cards) == 1 else _several(asked, cards))
    host = (host_ram_mib, HostRam(cache_ram, cache_ram_min, host_ram_reserve_mib), not cpu_build)
    report["host_ram"], more, refusal = _host_ram(asked, host, plans, refusal) if plans else (None, [], refusal)
    text += more
    cap, rope = context_cap(shape, knobs)
    report.update({
        "card": {**_card_dict(cards[0]), "count": len(cards)}, "cards": [_card_dict(c) for c in cards],
        "model": {k: shape.get(k) for k in ("path", "architecture", "n_layer", "n_ctx_train", "n_head_kv",
                                            "head_dim_k", "head_dim_v", "n_swa", "size", "tied_embeddings",
                                            "estimated_from", "header_requests") if shape.get(k) is not None},
        "draft": {k: draft.get(k) for k in ("path", "architecture", "n_layer", "n_head_kv", "size",
                                            "estimated_from") if draft.get(k) is not None} if draft else None,
        "ctx_cap_per_slot": cap, "rope": list(rope), "refused": refusal, "hub_token_sent_to": sent_to,
        # an artifact's GGUF: the quality its record holds
        "quality": artifact_quality(gguf) if gguf else None,
    })  # fmt: skip
    if as_json:
        click.echo(json.dumps(report, indent=1, sort_keys=True))
    else:
        click.echo((f"hub:   the token of {hub_token_file} was sent to {sent_to} only\n" if sent_to else "")
                   + "\n".join([_model_line(shape, knobs)] + text)
                   + (f"\nquality: {quality_summary(report['quality'])}" if report["quality"] else ""))
    if refusal:
        raise SystemExit(1)


def host_cards(gpu: tuple, gpus: int) -> tuple:
    """The host's cards from --gpu (repeated, or comma-separated: one name per card) and
    --gpus (that many of the one --gpu)."""
    names = [n.strip() for g in gpu for n in g.split(",") if n.strip()]
    if not names:
        raise click.BadParameter("name a card", param_hint="--gpu")
    if gpus > 1 and len(names) > 1:
        raise click.UsageError("--gpus N repeats one --gpu; for mixed cards name each card with --gpu")
    cards = [card_memory(n) for n in names] * gpus
    return tuple(Card(name, mib, cap, str(i)) for i, (name, mib, cap) in enumerate(cards))


@dataclass(frozen=True)
class _Asked:
    shape: dict
    knobs: Knobs
    pairs: list
    draft: Optional[dict]
    layout: str
    split_mode: str

    def fallback(self) -> tuple:
        """(layers, K, V, context) a refusal's ledger is shown at: the fixed layers, else all; the
        chosen KV types, else the most compact; the wanted context, else the cap."""
        knobs = self.knobs
        k = knobs.cache_type_k if knobs.cache_type_k != "auto" else self.pairs[-1][0]
        layers = knobs.gpu_layers if knobs.gpu_layers is not None else self.shape["n_layer"] + 1
        return layers, k, "f16" if not knobs.flash_attn else k, knobs.ctx_size or context_cap(self.shape, knobs)[0]


def _one_card(asked: _Asked, card: Card) -> tuple:
    """One card: the one-card planner's ledger, table and plan; the report, its lines, a
    refusal or None, and (name, plan) of its unit."""
    shape, knobs, draft = asked.shape, asked.knobs, asked.draft
    table = kv_table(shape, knobs, (card,), asked.pairs, draft)
    try:
        result, refusal = plan(shape, knobs, (card,), draft), None
        book = result.ledger
        layout = choose_layout(shape, knobs, (card,), asked.layout, draft, asked.split_mode).as_dict()
    except PlanError as e:
        result, refusal, layout = None, e.failure.message(card.name), None
        book = ledger(shape, knobs, (card,), *asked.fallback(), draft)
    report = {"layout": layout, "ledger": book.as_dict(), "kv": table, "plan": result.as_dict() if result else None}
    text = [_card_line(card), *_ledger_lines(book, card.mib, shape["n_layer"] + 1), *_table_lines(table, shape),
            _plan_line(result, refusal)]  # fmt: skip
    return report, text, refusal, [("unit 1", result)] if result else []


def _several(asked: _Asked, cards: tuple) -> tuple:
    """Several cards: the layout, each unit's ledger per card, the first unit's table; the
    report, its lines, a refusal or None, and (name, plan) of each unit."""
    shape, knobs, draft = asked.shape, asked.knobs, asked.draft
    try:
        lay, refusal = choose_layout(shape, knobs, cards, asked.layout, draft, asked.split_mode), None
        rival = rival_layout(shape, knobs, cards, lay, draft, asked.split_mode)
        if rival is not None:
            lay, _ = settle(lay, rival, None, NO_RECORD)
        units = lay.units
    except PlanError as e:
        lay, refusal, units = None, e.failure.message(f"{len(cards)} cards"), ()
    first = tuple(cards[i] for i in units[0].cards) if units else cards
    table = kv_table(shape, knobs, first, asked.pairs, draft, asked.split_mode)
    report = {"layout": lay.as_dict() if lay else None, "kv": table}
    text = [f"cards: {_cards_words(cards)}"] + ([f"layout: {lay.asked}: {lay.reason}"] if lay else [])
    if units:
        report.update(ledger=units[0].plan.ledger.as_dict(), plan=units[0].plan.as_dict())
        text += _units_lines(asked, cards, units, table)
    else:
        book = ledger(shape, knobs, cards, *asked.fallback(), draft, asked.split_mode)
        report.update(ledger=book.as_dict(), plan=None)
        text += [f"all {len(cards)} cards:", *_split_lines(book, shape, range(len(cards))), *_table_lines(table, shape),
                 _plan_line(None, refusal)]  # fmt: skip
    return report, text, refusal, [(f"unit {n}", u.plan) for n, u in enumerate(units, 1)]


def _units_lines(asked: _Asked, cards: tuple, units: tuple, table: list) -> list:
    """Each unit's ledger and plan; a unit of the same cards and plan as one before says so."""
    lines, seen = [], {}
    for n, unit in enumerate(units, 1):
        p, names = unit.plan, tuple((cards[i].name, cards[i].mib) for i in unit.cards)
        which = f"card{'s' if len(unit.cards) > 1 else ''} {', '.join(map(str, unit.cards))}"
        if (names, p.note) in seen:
            lines.append(f"unit {n}: {which}: as unit {seen[names, p.note]}")
            continue
        seen[names, p.note] = n
        lines.append(f"unit {n}: {which} ({', '.join(dict.fromkeys(name for name, _ in names))}):")
        if len(unit.cards) == 1:
            lines += _ledger_lines(p.ledger, cards[unit.cards[0]].mib, asked.shape["n_layer"] + 1)
        else:
            lines += _split_lines(p.ledger, asked.shape, unit.cards)
        if n == 1:
            lines += _table_lines(table, asked.shape)
        lines.append(_plan_line(p, None) + "".join(f" {a}" for a in p.split_args()))
    return lines


def _card_dict(card: Card) -> dict:
    return {"name": card.name, "planned_mib": card.mib, "compute_cap": card.compute_cap,
            "cublas_prefill": cublas_prefill(card.compute_cap) if card.compute_cap else None}  # fmt: skip


def _cards_words(cards: tuple) -> str:
    """'2 x Tesla V100 SXM2 16GB (16130 MiB, 7.0: prompts through cuBLAS)', per kind of card, in order."""
    counts = collections.Counter((c.name, c.mib, c.compute_cap) for c in cards)
    return ", ".join(f"{n} x {name} ({mib} MiB, {f'{cap}{_cublas(cap)}' if cap else 'compute capability unknown'})"
                     for (name, mib, cap), n in counts.items())  # fmt: skip


def _cublas(cap) -> str:
    return ": prompts through cuBLAS" if cublas_prefill(cap) else ""


def _model_line(shape: dict, knobs: Knobs) -> str:
    cap, rope = context_cap(shape, knobs)
    rope_text = f", {rope[0]} x{rope[1]:g} from {rope[2]}" if rope else ""
    where = shape.get("estimated_from") or shape["path"]
    return (f"model: {where}: {shape['architecture']}, {shape['n_layer']} layers, {shape['n_head_kv']} KV heads, "
            f"trained {shape['n_ctx_train']}{rope_text}: at most {cap} per slot")


def _card_line(card: Card) -> str:
    cc = card.compute_cap
    return (f"card:  {card.name}: planned at {card.mib} MiB, "
            + (f"compute capability {cc}{_cublas(cc)}" if cc else "compute capability unknown (a V100's or P100's "
               "prefill pool is counted only for a card named from the table)"))  # fmt: skip


def _ledger_lines(book: Ledger, card_mib: int, n_all: int) -> list:
    """A ledger of one card."""
    return [
        f"ledger: ctx {book.ctx_per_slot} per slot x {book.parallel}, {book.cache_type_k}/{book.cache_type_v} KV, "
        f"--n-gpu-layers {book.gpu_layers} of {n_all}:",
        f"  weights on the card {_gib(book.weights_on_card)}",
        f"  weights on the host {_gib(book.weights_on_host)}   (the token embedding always stays there)",
        f"  KV per token        {book.kv_bytes_per_token / 1024:8.1f} KiB   (full-context layers on the card)",
        f"  KV on the card      {_gib(book.kv_on_card)}",
        f"  KV on the host      {_gib(book.kv_on_host)}",
        f"  compute (estimate)  {_gib(book.compute_on_card)}",
    ] + ([
        f"  draft: --spec-draft-ngl {book.draft_gpu_layers}: weights on the card {_gib(book.draft_weights_on_card).strip()}"
        f", on the host {_gib(book.draft_weights_on_host).strip()}; KV on the card {_gib(book.draft_kv_on_card).strip()}"
        f", on the host {_gib(book.draft_kv_on_host).strip()}; compute {_gib(book.draft_compute_on_card).strip()}",
    ] if book.draft_gpu_layers is not None else []) + ([
        f"  prefill pool        {_gib(book.prefill_pool + book.draft_prefill_pool)}"
        "   (cuBLAS: weights dequantized for prompts)",
    ] if book.prefill_pool or book.draft_prefill_pool else []) + [
        f"  CUDA reserve        {_gib(book.reserve)}",
        f"  total on the card   {_gib(book.total_on_card)}   of {card_mib * MIB / GIB:.2f} GiB: "
        + ("fits" if book.fits() else "does NOT fit"),
    ]  # fmt: skip


def _split_lines(book: Ledger, shape: dict, which) -> list:
    """A unit's ledger, a column per card (GiB), headed by the host's numbers for them."""
    n = shape["n_layer"]

    def row(label: str, values, fmt=lambda b: f"{b / GIB:.2f}") -> str:
        return f"  {label:<20}" + "".join(f"{fmt(x):>12}" for x in values)

    def span(c) -> str:
        last = c.first_layer + c.layers - 1
        if not c.layers:
            return "-"
        return (f"{c.first_layer}-{min(last, n - 1)}" if c.first_layer < n else "") + ("+out" if c.output_layer else "")

    cs = book.cards
    lines = [f"ledger: ctx {book.ctx_per_slot} per slot x {book.parallel}, {book.cache_type_k}/{book.cache_type_v} KV, "
             f"--n-gpu-layers {book.gpu_layers} of {n + 1} over {len(cs)} cards, --tensor-split "
             f"{','.join(map(str, book.tensor_split))} (GiB per card):",
             row("", which, lambda i: f"card {i}"),
             row("layers", cs, span),
             row("weights", (c.weights for c in cs)),
             row("KV", (c.kv for c in cs)),
             row("compute (estimate)", (c.compute for c in cs))]
    if book.pipelined:
        lines.append(row("  of which pipeline", (c.pipeline_copies for c in cs)))
    if any(c.prefill_pool for c in cs):
        lines.append(row("prefill pool", (c.prefill_pool for c in cs)))
    if book.draft_gpu_layers is not None:
        lines.append(row(f"draft (ngl {book.draft_gpu_layers})", (c.draft for c in cs)))
    lines += [row("CUDA reserve", (c.reserve for c in cs)), row("total", (c.total for c in cs)),
              row("of the card", (c.card_mib * MIB for c in cs)),
              row("", cs, lambda c: "fits" if c.fits() else "does NOT fit"),
              f"  on the host: weights {_gib(book.weights_on_host).strip()} (the token embedding always stays there), "
              f"KV {_gib(book.kv_on_host).strip()}; KV per token {book.kv_bytes_per_token / 1024:.1f} KiB "
              "(full-context layers on the cards)"]  # fmt: skip
    return lines


def _table_lines(table: list, shape: dict) -> list:
    n_all = shape["n_layer"] + 1
    lines = ["largest context per slot:", f"  {'KV':<12}{'all ' + str(n_all) + ' layers':>16}   with fewer layers"]
    for row in table:
        fewer = "" if "with_fewer" not in row else (
            f"{row['with_fewer']} with --n-gpu-layers {row['gpu_layers']}" if row["gpu_layers"] else "nothing fits")
        lines.append(f"  {row['kv']:<12}{row['all_layers']:>16}   {fewer}")
    return lines


def _plan_line(result, refusal: Optional[str]) -> str:
    return (f"plan: {result.note}; --ctx-size {result.ctx_size} --parallel {result.parallel} "
            f"--n-gpu-layers {result.gpu_layers}" if result else f"plan refused: {refusal}")  # fmt: skip


def _host_ram(asked: _Asked, host: tuple, plans: list, refusal: Optional[str]) -> tuple:
    """(the host-RAM ledger as a dict, its lines, the refusal: the cards' or the host's) of the
    units (``plans``: (name, Plan)), planned on their cards, against ``host``: (MemTotal MiB or
    None, ``HostRam``, whether what the plan puts on the cards stays there: a CUDA build)."""
    host_mib, wanted, on_cards = host
    shares = [unit_share(name, asked.shape, asked.knobs, p, on_cards, asked.draft) for name, p in plans]
    book, failure = plan_host(shares, host_mib, wanted)
    said = failure.message("host") if failure else None
    return book.as_dict(), _host_lines(book) + ([f"host refused: {said}"] if said else []), refusal or said


def _host_lines(book: HostLedger) -> list:
    """The host-RAM ledger: a row per kind of unit (MiB), the total against the host's memory."""
    count = len(book.units)
    if book.budget is None:
        head = (f"host RAM: {count} unit{'s' if count > 1 else ''}, not checked (--host-ram-mib gives the host's "
                "MemTotal), MiB:")  # fmt: skip
    else:
        head = (f"host RAM: MemTotal {book.host_mib:,} MiB less the {book.asked.reserve_mib:,} MiB reserve: "
                f"{book.budget / MIB:,.0f} for {count} unit{'s' if count > 1 else ''}, MiB:")  # fmt: skip
    rows: dict = {}
    for n, u in enumerate(book.units, 1):
        rows.setdefault((u.weights, u.kv, u.compute, u.process, u.cache, u.total), []).append(n)
    lines = [head, f"  {'units':<10}" + "".join(f"{h:>13}" for h in ("weights", "KV", "compute", "process",
                                                                      "prompt cache", "total"))]  # fmt: skip
    lines += [f"  {_runs(ns):<10}" + "".join(f"{x / MIB:>13,.1f}" for x in row) for row, ns in rows.items()]
    verdict = "" if book.budget is None else (": fits" if book.fits() else ": does NOT fit")
    return lines + [f"  total {book.total / MIB:,.0f} MiB{verdict}; {book.why()}"]


def _runs(numbers: list) -> str:
    """"1-3,5": unit numbers in order, runs of them as first-last."""
    runs: list = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
