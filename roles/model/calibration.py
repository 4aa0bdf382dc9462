"""What route awq's calibration needs of the host's cards, told before anything is fetched:
preflight's ``awq-card-memory`` rule (``llamarack/rules.py``).

The arithmetic is the AWQ step's own (``files/awq_apply.py``: ``calibration_bytes``), which
the step runs again on the host before the model loads, with the tokenizer's count of the
calibration tokens: the backstop. Here nothing is fetched and no tokenizer runs:

- the checkpoint's counts (hidden and MLP width, heads, vocabulary) come from the GGUF the
  host serves (``GgufShape``), when its artifact was made from the same checkpoint (same
  repository and revision: the route, an AWQ field, the quant or the llama.cpp commit
  changed) and is not the artifact wanted now; a checkpoint the host never served is
  checked by the step alone, once fetched;
- the calibration tokens are bounded from the text's bytes (``awq_apply.tokens_at_most``:
  at most one token per byte of each paragraph, plus the few a tokenizer adds, and never
  more than AutoAWQ's 128 x 512), so the figure is never below what the step counts;
- the card is the host's smallest, AutoAWQ's device being one of them.

A CPU build hides the cards from the step (it calibrates on the CPU): nothing to check.
"""

from __future__ import annotations

from typing import Optional

from llamarack.errors import ModelSourceError
from llamarack.facts import FactRead
from llamarack.settings import Settings

from .files import awq_apply
from .plan import calibration_file, plan_from_record
from .reads import ArtifactState, GgufShape, ModelArtifact

# The counts awq_apply.calibration_bytes cannot do without (config.json's keys).
NEEDED = ("hidden_size", "intermediate_size", "num_attention_heads")


def calibrates(settings: Settings) -> bool:
    """Route awq on a CUDA build, with the model role: AutoAWQ would calibrate on a card."""
    m = settings.model
    return (m.route == "awq" and m.source == "hf" and settings.llamacpp.backend == "cuda"
            and settings.general.runs("model"))  # fmt: skip


def reads(settings: Settings) -> tuple[FactRead, ...]:
    """What the rule looks at, for preflight's one read: the served artifact and its GGUF's shape."""
    if not calibrates(settings):
        return ()
    current = settings.layout.current_model
    return FactRead.of(ModelArtifact, path=current), FactRead.of(GgufShape, path=f"{current}/model.gguf")


def served(settings: Settings, read) -> tuple[Optional[ArtifactState], Optional[dict]]:
    """(the served artifact, its GGUF's shape) where the rule looks at them, else (None, None);
    the shape only of a GGUF that is the one sealed (another is made again, and may not read)."""
    if not calibrates(settings):
        return None, None
    state = read(ModelArtifact, path=settings.layout.current_model)
    whole = state is not None and state.untouched
    return state, read(GgufShape, path=f"{settings.layout.current_model}/model.gguf") if whole else None


def served_config(settings: Settings, state: Optional[ArtifactState], shape: Optional[dict]) -> Optional[dict]:
    """The ``config.json`` counts of the checkpoint route awq is about to calibrate, from
    ``shape`` (the served GGUF's), when ``state`` (its artifact) was made from that
    checkpoint and is not the artifact the settings ask for; None when nothing is
    calibrated (the wanted artifact is served) or the counts are not known here."""
    m = settings.model
    if not (m.repo and m.revision and state and state.record and isinstance(shape, dict)):
        return None
    record = state.record
    asked = record.get("asked") if isinstance(record.get("asked"), dict) else {}
    if record.get("repo") != m.repo or m.revision not in (record.get("revision"), asked.get("revision")):
        return None
    try:
        if plan_from_record(settings, state) is not None:
            return None
    except ModelSourceError:
        return None  # an unreadable calibration text: the model role names it
    from llamarack.model_shapes import CONFIG_KEYS  # here: it imports requests

    config = {key: shape[k] for k, key in CONFIG_KEYS.items()
              if isinstance(shape.get(k), int) and not isinstance(shape.get(k), bool) and shape[k] > 0}  # fmt: skip
    return config if all(k in config for k in NEEDED) else None


def card_shortfall(settings: Settings, state: Optional[ArtifactState], shape: Optional[dict],
                   gpus) -> Optional[tuple[str, str, str]]:  # fmt: skip
    """(found, needed, fix) when the smallest of ``gpus`` cannot hold what calibrating one
    decoder layer puts on it (``awq_apply.memory_shortfall``, on ``tokens_at_most`` of the
    calibration text); None when it can, or when no calibration is known to come."""
    config = served_config(settings, state, shape)
    cards = [g for g in gpus if isinstance(g.memory_mib, int)]
    if config is None or not cards:
        return None
    try:
        with open(calibration_file(settings), encoding="utf-8", errors="replace") as f:
            tokens = awq_apply.tokens_at_most(f.read())
    except OSError:
        return None  # the model role names it
    card = min(cards, key=lambda g: g.memory_mib)
    return awq_apply.memory_shortfall(config, tokens, card.memory_mib * 2**20,
                                      f"{card.name} (GPU {card.index}, the host's smallest card)", bound=True)
