"""What llama-server runs with on one host: the context that fits the card,
and the unit that serves it. Pure functions of settings and facts.

Memory arithmetic (FIELD-NOTES, "Hardware and physics"):

    card memory >= weights on the card + KV cache + reserve
    KV cache     = context x KV bytes per token
    KV bytes/token = layers on the card x KV heads x
                     (K head size x bytes(K type) + V head size x bytes(V type))

with GGML block sizes: q4_0 stores 32 values in 18 bytes (4.5 bits), q8_0
32 in 34, f16 2 bytes each. The weights are the GGUF file's size (the
whole of it when every layer is offloaded); ``server_memory_reserve_mib``
covers the CUDA context and llama.cpp's compute buffers. Sliding-window
layers are counted at full context, so the plan errs on the safe side.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import jinja2

from llamarack import unitfile
from llamarack.facts.llamacpp import ServerFlags
from llamarack.layout import API_KEY_PATH
from llamarack.remote.llamacpp_proof import serving_args
from llamarack.rules import Failure
from llamarack.settings import Settings

from ..llamacpp.plan import serving_inputs

# Bytes per stored value of each KV cache type (GGML block size / values per block).
KV_TYPE_BYTES = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0,
    "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32, "iq4_nl": 18 / 32,
    "q5_0": 22 / 32, "q5_1": 24 / 32,
}  # fmt: skip
# The context is planned in steps of this many tokens (llama.cpp pads to 256).
CTX_STEP = 256
# Below this a server is not worth starting: refuse instead.
MIN_CTX = 512
MIB = 2**20

# The role's templates. A file of the same name in an override folder the
# deploy names (the project's top-level templates/, for deploy.py) replaces one.
TEMPLATES = Path(__file__).resolve().parent / "templates"
UNIT_TEMPLATE = "llama-server.service.j2"
# The unit names its own health URL: a rollback checks the previous unit's address.
HEALTH_MARK = "# llamarack health: "


@dataclass(frozen=True)
class ContextPlan:
    ctx_size: int
    kv_bytes_per_token: float
    weights_on_card: int  # bytes
    card_mib: Optional[int]  # the smallest card's memory; None: no card (CPU serving)
    note: str  # how the context was chosen, for the operation's name and the logs


class PlanError(Exception):
    """The plan cannot be met; ``failure`` says what was found and what is needed."""

    def __init__(self, failure: Failure):
        super().__init__(failure.rule)
        self.failure = failure


def layers_on_card(settings: Settings, shape: dict) -> int:
    return min(settings.server.gpu_layers, shape["n_layer"])


def kv_bytes_per_token(settings: Settings, shape: dict, layers: int) -> float:
    s = settings.server
    per_layer = shape["n_head_kv"] * (
        shape["head_dim_k"] * KV_TYPE_BYTES[s.cache_type_k]
        + shape["head_dim_v"] * KV_TYPE_BYTES[s.cache_type_v]
    )
    return layers * per_layer


def plan_context(settings: Settings, shape: dict, card_mib: Optional[int]) -> ContextPlan:
    """The context length to serve with: ``server_ctx_size`` when it fits, else
    the largest that fits the card (capped at the model's trained context).

    card_mib is the smallest GPU's memory; None plans for CPU serving, where
    only the trained context limits the choice. Raises PlanError naming the
    model, the card and what would fit.
    """
    s = settings.server
    trained = shape["n_ctx_train"]
    wanted = s.ctx_size
    if wanted is not None and wanted > trained:
        raise PlanError(Failure(
            "context-trained",
            f"server_ctx_size {wanted}",
            f"at most the model's trained context {trained} ({shape['architecture']})",
            f"set server_ctx_size <= {trained}, or None for the largest that fits",
        ))  # fmt: skip
    if card_mib is None:
        ctx = wanted or trained
        return ContextPlan(ctx, kv_bytes_per_token(settings, shape, shape["n_layer"]), 0, None,
                           f"ctx {ctx} (CPU; trained {trained})")  # fmt: skip

    layers = layers_on_card(settings, shape)
    weights = shape["size"] if layers >= shape["n_layer"] else shape["size"] * layers // shape["n_layer"]
    per_token = kv_bytes_per_token(settings, shape, layers)
    budget = card_mib * MIB - weights - s.memory_reserve_mib * MIB
    fits = int(budget // per_token) // CTX_STEP * CTX_STEP if per_token and budget > 0 else 0
    fits = min(fits, trained) if per_token else (trained if budget > 0 else 0)
    floor = min(MIN_CTX, trained)
    need_mib = (weights + floor * per_token) / MIB + s.memory_reserve_mib
    if fits < floor:
        raise PlanError(Failure(
            "memory",
            f"{card_mib} MiB on the card for {weights / MIB:.0f} MiB of weights "
            f"({layers} layers) + {s.memory_reserve_mib} MiB reserve",
            f"{need_mib:.0f} MiB for a {floor}-token context "
            f"({s.cache_type_k}/{s.cache_type_v} KV: {per_token / 1024:.1f} KiB per token)",
            "a smaller model_quant, fewer server_gpu_layers, or a bigger card",
        ))  # fmt: skip
    if wanted is None:
        return ContextPlan(fits, per_token, weights, card_mib,
                           f"ctx {fits}: the largest that fits {card_mib} MiB")  # fmt: skip
    if wanted > fits:
        raise PlanError(Failure(
            "memory",
            f"server_ctx_size {wanted}: {(weights + wanted * per_token) / MIB + s.memory_reserve_mib:.0f} MiB "
            f"on a {card_mib} MiB card",
            f"at most {fits} tokens on this card ({s.cache_type_k}/{s.cache_type_v} KV, "
            f"{per_token / 1024:.1f} KiB per token)",
            f"set server_ctx_size <= {fits} (or None), or quantize the KV cache further",
        ))  # fmt: skip
    return ContextPlan(wanted, per_token, weights, card_mib,
                       f"ctx {wanted} (fits {card_mib} MiB; largest {fits})")  # fmt: skip


def server_args(settings: Settings, flags: ServerFlags, build_dir: str, model_dir: str,
                ctx: ContextPlan, cuda: bool) -> list[str]:
    """llama-server's command line, spelled as the built binary's --help says.
    Raises PlanError when a setting needs a flag this build does not have."""
    s = settings.server
    if s.api_key_file and not flags.has_api_key_file:
        raise PlanError(Failure(
            "api-key-file",
            "server_api_key_file set, but this build's llama-server --help has no --api-key-file",
            "a llama.cpp build that reads the key from a file (never from the command line)",
            "pin a newer llamacpp_commit, or unset server_api_key_file",
        ))  # fmt: skip
    args = [f"{build_dir}/bin/llama-server", "--model", f"{model_dir}/model.gguf",
            "--host", s.listen, "--port", str(s.port), "--ctx-size", str(ctx.ctx_size),
            "--parallel", str(s.parallel)]  # fmt: skip
    # The same runtime flags the build's smoke run computed with, plus any it needed
    # (flags.proven_args, e.g. --no-repack on a CPU whose AMX faults).
    serving = {**serving_inputs(settings), "gpu_layers": s.gpu_layers if cuda else None}
    args += serving_args(flags, serving)
    if s.api_key_file:
        args += ["--api-key-file", API_KEY_PATH]
    if flags.has_metrics:
        args += ["--metrics"]
    return args


def health_url(settings: Settings) -> str:
    """Where llama-server's /health answers, seen from its own host."""
    listen = settings.server.listen
    addr = "127.0.0.1" if listen in ("0.0.0.0", "") else "::1" if listen == "::" else listen
    if ":" in addr:
        addr = f"[{addr}]"
    return f"http://{addr}:{settings.server.port}/health"


def render_unit(settings: Settings, args: list[str], description: str, overrides: tuple = ()) -> str:
    """The unit file; ``overrides``: folders whose templates win over the role's own.

    Every value is escaped for systemd by ``llamarack.unitfile`` (the template
    only places them): ``description`` holds the GGUF's own metadata.
    """
    dirs = [str(d) for d in overrides if Path(d).is_dir()] + [str(TEMPLATES)]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(dirs),
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined)  # fmt: skip
    return env.get_template(UNIT_TEMPLATE).render(
        description=unitfile.text(description),
        health_line=unitfile.comment(HEALTH_MARK + health_url(settings)),
        user=unitfile.value("User", settings.general.service_user),
        exec_start=unitfile.exec_line(args),
        working_directory=unitfile.value("WorkingDirectory", settings.general.root),
    )
