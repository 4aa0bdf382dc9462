"""The model role's compatibility rule: route awq's calibration fits the host's smallest
card (preflight runs it, ``roles/preflight/rules.py``)."""

from __future__ import annotations

from typing import Optional

from llamarack.errors import Failure
from roles.settings import Settings

from ..preflight.facts import HostFacts
from .calibration import calibrates, card_shortfall


def rule_awq_card_memory(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """Route awq on a CUDA build: the host's smallest card holds what AutoAWQ puts on it while it calibrates
    one decoder layer, counted from the served GGUF of the same checkpoint, else from the checkpoint's
    config.json on the hub, and a bound of the calibration tokens (``roles/model/calibration.py``). A CPU
    build calibrates on the CPU; counts not known (the audit, a hub that did not answer) leave the check
    to the AWQ step itself."""
    short = calibrates(s) and card_shortfall(s, facts.served_model, facts.served_shape, facts.gpus, facts.hub_config)
    return Failure("awq-card-memory", *short) if short else None


RULES = (rule_awq_card_memory,)
