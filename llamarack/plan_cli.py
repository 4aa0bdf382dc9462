"""``llamarack plan``: what can this card serve? Before anything is deployed.

The same planner as the server role (``llamarack/planner.py``), on a shape
from a GGUF header (a local file, or the hub with HTTP ranges: only the
header is read) or from a ``config.json`` and a quant.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from typing import Optional

import click

from llamarack.errors import ModelSourceError
from llamarack.gpu_table import BOARDS, planning_memory_mib
from llamarack.model_shapes import hub_gguf_shape, local_gguf_shape, shape_from_config
from llamarack.planner import (AUTO_KV_TYPES, KV_TYPE_BYTES, MIB, Knobs, PlanError, check_shapes, context_cap,
                               cublas_prefill, largest_context, ledger, most_layers, plan)  # fmt: skip
from llamarack.roles.model.settings import QUANT_TYPES
from llamarack.roles.server.settings import DEFAULT_RESERVE_MIB
from llamarack.secrets import read_token
from llamarack.settings_fields import loopback_url, remote_url

GIB = 2**30


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


def kv_table(shape: dict, knobs: Knobs, card_mib: int, pairs: list, draft: Optional[dict] = None) -> list:
    """Per KV type: the largest per-slot context with every layer on the card and,
    when that is below the minimum, the most layers that fit the minimum and what they allow."""
    cap, _ = context_cap(shape, knobs)
    n_all = shape["n_layer"] + 1
    floor = min(knobs.min_ctx_size, cap)
    rows = []
    for k, v in pairs:
        row = {"kv": f"{k}/{v}", "all_layers": largest_context(shape, knobs, card_mib, n_all, k, v, cap, draft),
               "gpu_layers": n_all}  # fmt: skip
        if row["all_layers"] < floor:
            fit = most_layers(shape, knobs, card_mib, k, v, floor, draft)
            row.update(gpu_layers=fit,
                       with_fewer=largest_context(shape, knobs, card_mib, fit, k, v, cap, draft) if fit else 0)
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
@click.option("--gpu", required=True, help="a card from the table (e.g. 'V100 SXM2 16GB') or its memory in MiB")
@click.option("--gpus", default=1, show_default=True, type=click.IntRange(1),
              help="cards per host (layers split among them; planned as one card of their sum, "
                   "with a reserve and a prefill pool each)")
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
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def plan_command(gguf, hub_repo, revision, hub_file, hub_endpoint, hub_token_file, trusted_network, config_json,
                 quant, gpu, gpus,
                 kv_types, ctx_size, parallel, gpu_layers, min_ctx, rope_scaling, rope_scale, yarn_orig_ctx,
                 reserve_mib, no_flash_attn, draft_gguf, draft_config, draft_quant, draft_gpu_layers,
                 as_json):  # fmt: skip
    """What a model needs on a card and what the card allows: the ledger
    (weights, KV, compute, reserve), the largest context for each KV type, and
    whether every layer fits or only some. Give GGUF (a local file), or
    --hub-repo/--revision/--file, or --config with --quant."""
    sources = [bool(gguf), bool(hub_repo), bool(config_json)]
    if sum(sources) != 1:
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
            with open(config_json) as f:
                shape = shape_from_config(json.load(f), quant, config_json)
        draft = local_gguf_shape(draft_gguf) if draft_gguf else None
        if draft_config:
            with open(draft_config) as f:
                draft = shape_from_config(json.load(f), draft_quant, draft_config)
        check_shapes(shape, draft)
    except (ModelSourceError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    except PlanError as e:
        raise click.ClickException(e.failure.message("plan")) from None
    name, card_mib, compute_cap = card_memory(gpu)
    card_mib *= gpus
    chosen = kv_types[-1] if kv_types else "auto"
    knobs = Knobs(ctx_size=ctx_size, parallel=parallel, cache_type_k=chosen, cache_type_v=chosen,
                  flash_attn=not no_flash_attn, gpu_layers=gpu_layers, min_ctx_size=min_ctx,
                  rope_scaling=rope_scaling, rope_scale=rope_scale, rope_orig_ctx=yarn_orig_ctx,
                  reserve_mib=reserve_mib, draft_gpu_layers=draft_gpu_layers,
                  compute_cap=compute_cap, cards=gpus)  # fmt: skip
    pairs = [(t, t) for t in kv_types if t != "auto"] or [(t, t) for t in AUTO_KV_TYPES]
    if no_flash_attn:
        pairs = [(k, "f16") for k, _ in pairs]
    table = kv_table(shape, knobs, card_mib, list(dict.fromkeys(pairs)), draft)
    cap, rope = context_cap(shape, knobs)
    try:
        result, refusal = plan(shape, knobs, card_mib, draft), None
        book = result.ledger
    except PlanError as e:
        result, refusal = None, e.failure.message(name)
        k = chosen if chosen != "auto" else pairs[-1][0]
        v = "f16" if no_flash_attn else k
        book = ledger(shape, knobs, card_mib, gpu_layers if gpu_layers is not None else shape["n_layer"] + 1,
                      k, v, ctx_size or cap, draft)  # fmt: skip
    report = {
        "model": {k: shape.get(k) for k in ("path", "architecture", "n_layer", "n_ctx_train", "n_head_kv",
                                            "head_dim_k", "head_dim_v", "n_swa", "size", "tied_embeddings",
                                            "estimated_from", "header_requests") if shape.get(k) is not None},
        "draft": {k: draft.get(k) for k in ("path", "architecture", "n_layer", "n_head_kv", "size",
                                            "estimated_from") if draft.get(k) is not None} if draft else None,
        "card": {"name": name, "count": gpus, "planned_mib": card_mib, "compute_cap": compute_cap,
                 "cublas_prefill": cublas_prefill(compute_cap) if compute_cap else None},
        "ctx_cap_per_slot": cap, "rope": list(rope),
        "ledger": book.as_dict(), "kv": table,
        "plan": result.as_dict() if result else None, "refused": refusal,
        "hub_token_sent_to": sent_to,
    }  # fmt: skip
    if as_json:
        click.echo(json.dumps(report, indent=1, sort_keys=True))
    else:
        click.echo((f"hub:   the token of {hub_token_file} was sent to {sent_to} only\n" if sent_to else "")
                   + _text(shape, name, gpus, card_mib, compute_cap, cap, rope, book, table, result, refusal))
    if refusal:
        raise SystemExit(1)


def _text(shape, name, gpus, card_mib, compute_cap, cap, rope, book, table, result, refusal) -> str:
    n_all = shape["n_layer"] + 1
    rope_text = f", {rope[0]} x{rope[1]:g} from {rope[2]}" if rope else ""
    where = shape.get("estimated_from") or shape["path"]
    lines = [
        f"model: {where}: {shape['architecture']}, {shape['n_layer']} layers, {shape['n_head_kv']} KV heads, "
        f"trained {shape['n_ctx_train']}{rope_text}: at most {cap} per slot",
        f"card:  {name}{f' x{gpus}' if gpus > 1 else ''}: planned at {card_mib} MiB, "
        + (f"compute capability {compute_cap}" + (": prompts through cuBLAS" if cublas_prefill(compute_cap) else "")
           if compute_cap else "compute capability unknown (a V100's or P100's prefill pool is counted only "
           "for a card named from the table)"),
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
        "largest context per slot:",
        f"  {'KV':<12}{'all ' + str(n_all) + ' layers':>16}   with fewer layers",
    ]
    for row in table:
        fewer = "" if "with_fewer" not in row else (
            f"{row['with_fewer']} with --n-gpu-layers {row['gpu_layers']}" if row["gpu_layers"] else "nothing fits")
        lines.append(f"  {row['kv']:<12}{row['all_layers']:>16}   {fewer}")
    lines.append(f"plan: {result.note}; --ctx-size {result.ctx_size} --parallel {result.parallel} "
                 f"--n-gpu-layers {result.gpu_layers}" if result else f"plan refused: {refusal}")  # fmt: skip
    return "\n".join(lines)
