"""What route awq's calibration needs of the host's cards, told before anything is fetched:
preflight's ``awq-card-memory`` rule (``roles/model/rules.py``).

The arithmetic is the AWQ step's own (``files/awq_apply.py``: ``calibration_bytes``), which
the step runs again on the host, on the tokenizer's count: the backstop. Here no tokenizer
runs: the counts come from the served GGUF (``served_config``), else from the checkpoint's
``config.json`` on the hub (``hub_counts``), the tokens are bounded from the text's bytes,
and the card is the host's smallest. docs/quality.md ("The card's memory") says where each
count comes from and what a hub that cannot answer leaves.
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional

from llamarack.errors import ModelSourceError
from llamarack.facts import FactRead
from llamarack.secrets import read_token
from roles.settings import Settings

from .files import awq_apply
from .files.gguf_header import check_values
from .hub import CONFIG_MAX_BYTES, repo_config, repo_files
from .plan import calibration_file, plan_from_pinned_record, plan_from_record
from .reads import ArtifactState, GgufShape, ModelArtifact

# The counts awq_apply.calibration_bytes cannot do without (config.json's keys), and those
# it reads when given.
NEEDED = ("hidden_size", "intermediate_size", "num_attention_heads")
OPTIONAL = ("num_key_value_heads", "head_dim", "vocab_size")


@dataclass(frozen=True)
class HubCounts:
    """What preflight read of a checkpoint on the hub: its ``config.json``'s counts
    (``NEEDED`` and those of ``OPTIONAL`` it gives), or why there are none."""

    counts: Optional[Mapping[str, int]]
    problem: Optional[str] = None


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


def counts_of(config: Mapping) -> dict:
    """The counts ``awq_apply.calibration_bytes`` reads of a ``config.json`` (its
    ``text_config`` where it has one, as the step reads it): each of ``NEEDED`` a whole number
    of 1 or more, and each of ``OPTIONAL`` the config gives, in its range (``check_values``,
    as a GGUF's counts are checked); ValueError naming the first missing, or that is not."""
    from roles.model.shapes import CONFIG_KEYS  # here: it imports requests

    inner = config.get("text_config")
    if inner and not isinstance(inner, Mapping):
        raise ValueError(f"text_config is {type(inner).__name__}, not an object")
    c = inner or config
    missing = [key for key in NEEDED if c.get(key) is None]
    if missing:
        raise ValueError(f"no {', '.join(missing)}")
    counts = {key: c[key] for key in NEEDED} | {key: c[key] for key in OPTIONAL if c.get(key)}
    check_values({k: counts[key] for k, key in CONFIG_KEYS.items() if key in counts}, CONFIG_KEYS)
    small = [key for key in NEEDED if counts[key] < 1]
    if small:
        raise ValueError(f"{small[0]} {counts[small[0]]} is out of range (1 or more)")
    return counts


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
    from roles.model.shapes import CONFIG_KEYS

    try:
        if plan_from_record(settings, state) is None:
            return counts_of({key: shape.get(k) for k, key in CONFIG_KEYS.items()})
    except (ModelSourceError, ValueError):
        pass  # an unreadable calibration text (the model role names it), or counts out of range
    return None


# Several hosts' preflights run at once (pyinfra's greenlets): one asks the hub, the others
# wait for its answer, which ``_asked`` keeps. A lock of the kind threading makes now, per
# kind: pyinfra's CLI patches threading for gevent, and a lock made before the patch would
# stop the whole process while a greenlet holding it waits on the hub.
_ASKING: dict = {}


def _asking():
    return _ASKING.setdefault(threading.Lock, threading.Lock())


def hub_counts(settings: Settings, state: Optional[ArtifactState], shape: Optional[dict]) -> Optional[HubCounts]:
    """The counts of the checkpoint route awq is about to calibrate, from its ``config.json`` on
    the hub, where neither the served GGUF nor the served record gives them and the model role
    asks the hub anyway; else None, and nothing is asked. Preflight's deploy calls this (before
    any operation); the audit never asks the hub."""
    if not calibrates(settings) or served_config(settings, state, shape) is not None:
        return None
    m = settings.model
    try:
        if plan_from_record(settings, state) or plan_from_pinned_record(settings, state):
            return None
        token = read_token(m.hf_token_file)
    except ModelSourceError:
        return None  # a calibration text or token file it cannot read: the model role names it
    with _asking():
        return _asked(m.hf_endpoint, m.repo, m.revision, token)


@functools.lru_cache(maxsize=32)
def _asked(endpoint: str, repo: str, revision: str, token: Optional[str]) -> HubCounts:
    """Once per checkpoint for the run: the listing, asked as the model role asks it
    (``deploy.listing_for``: it then finds it cached), and ``config.json`` at the commit it
    names, by its blob id there."""
    try:
        listing = repo_files(endpoint, repo, revision, token)
    except ModelSourceError as e:
        return HubCounts(None, str(e))
    where = f"{repo}@{listing.sha}: config.json"
    entry = next((f for f in listing.files if f.path == "config.json"), None)
    if entry is None:
        return HubCounts(None, f"{repo}@{listing.sha}: the listing names no config.json")
    if entry.size > CONFIG_MAX_BYTES:
        return HubCounts(None, f"{where}: listed at {entry.size} bytes, more than {CONFIG_MAX_BYTES} read")
    answer = repo_config(endpoint, repo, listing.sha, token, entry.git_sha1)
    if answer.config is None:
        return HubCounts(None, answer.problem)
    try:
        return HubCounts(MappingProxyType(counts_of(answer.config)))
    except ValueError as e:
        return HubCounts(None, f"{where}: {e}")


def unchecked(hub: Optional[HubCounts]) -> Optional[str]:
    """What preflight warns of when the hub did not give the counts (``hub_counts``), else None."""
    if hub is None or hub.problem is None:
        return None
    return (f"cannot check before the fetch: {hub.problem}; the AWQ step checks the card once the "
            "checkpoint is fetched")  # fmt: skip


def card_shortfall(settings: Settings, state: Optional[ArtifactState], shape: Optional[dict],
                   gpus, hub: Optional[HubCounts] = None) -> Optional[tuple[str, str, str]]:  # fmt: skip
    """(found, needed, fix) when the smallest of ``gpus`` cannot hold what calibrating one
    decoder layer puts on it (``awq_apply.memory_shortfall``, on ``tokens_at_most`` of the
    calibration text), counted from the served GGUF (``served_config``) or else the hub's
    ``config.json`` (``hub``: ``hub_counts``); None when it can, or when no calibration is
    known to come or its counts are not known."""
    config = served_config(settings, state, shape) or (hub.counts if hub else None)
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
