"""The planner's answers over a range of shapes, knobs and cards, against a record.

``tests/fixtures/planner/answers.json`` holds, per case, the plan (or the refusal) and
``llamarack plan``'s per-KV-type table: a digest of each, beside the layers, context and KV
types in words. How the planner searches (the context, the layers of a partial offload)
may change; what it answers may not, unless the arithmetic itself is meant to change:
then record again, and say why in the commit:

    python3 -m tests.unit.test_planner_answers --record
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from pathlib import Path

import pytest

from roles.model.files.gguf_header import read_shape
from roles.model.shapes import shape_from_config
from roles.server.plan_cli import kv_table
from roles.server.planner import AUTO_KV_TYPES, MIB, Card, Knobs, PlanError, plan

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
ANSWERS = FIXTURES / "planner/answers.json"
# What is asked: the operator's knobs, a fixed layer count, CPU only, slots, YaRN, old cards.
KNOBS = {
    "default": Knobs(),
    "slots4-min8192": Knobs(parallel=4, min_ctx_size=8192),
    "f16-no-flash": Knobs(cache_type_k="f16", cache_type_v="f16", flash_attn=False),
    "ctx16384-q8_0": Knobs(ctx_size=16384, cache_type_k="q8_0", cache_type_v="q8_0"),
    "yarn4-v100": Knobs(rope_scaling="yarn", rope_scale=4.0, compute_cap="7.0"),
    "layers12-q4_0-f16": Knobs(gpu_layers=12, cache_type_k="q4_0", cache_type_v="f16"),
    "p100-two-cards": Knobs(compute_cap="6.0", cards=2, reserve_mib=300, min_ctx_size=2048),
    "cpu-only": Knobs(gpu_layers=0),
}
# Cards as a share of the model's weights (plus the reserve): from nothing fits to everything does.
CARD_SHARES = (0.02, 0.25, 0.5, 0.8, 0.95, 1.2, 3.0)


def _synthetic(n_layer: int, seed: int, swa: str) -> dict:
    """A shape of ``n_layer`` layers of uneven sizes, dense, with a window on every Nth layer
    (``every``, or the architecture's own layout: ``arch``), or on the layers a list names."""
    rng = random.Random(seed)
    heads = rng.choice((8, 16, 32, 64))
    hd = rng.choice((64, 128, 256))
    pattern = {"none": None, "every": rng.choice((2, 4, 6)), "arch": None,
               "list": [rng.random() < 0.7 for _ in range(n_layer - seed % 3)]}[swa]  # fmt: skip
    vocab = rng.choice((32000, 128256, 262144))
    return {
        "path": f"synthetic-{n_layer}-{seed}-{swa}", "size": 0, "architecture": "gemma3" if swa == "arch" else "llama",
        "file_type": rng.choice((1, 15, 7)), "n_layer": n_layer, "n_ctx_train": rng.choice((4096, 32768, 131072)),
        "n_head": heads, "n_head_kv": heads // rng.choice((1, 2, 4, 8)), "head_dim_k": hd, "head_dim_v": hd,
        "n_embd": heads * hd, "n_ff": rng.choice((None, 4 * heads * hd)), "n_vocab": vocab,
        "n_swa": 0 if swa == "none" else rng.choice((512, 1024, 4096)), "swa_pattern": pattern,
        "rope_scaling": None, "rope_scale": None, "rope_orig_ctx": None,
        "layer_bytes": [rng.randrange(10**6, 4 * 10**8) for _ in range(n_layer)],
        "token_embd_bytes": vocab * heads * hd // 2, "output_bytes": rng.choice((4 * heads * hd, vocab * heads * hd)),
        "tied_embeddings": rng.random() < 0.3,
    }  # fmt: skip


def shapes() -> dict:
    configs, logs = FIXTURES / "configs", FIXTURES / "llama-server/gpu-load-logs"
    out = {f"{c}-{q}": shape_from_config(json.loads((configs / f"{c}.config.json").read_text()), q)
           for c, q in (("llama-3.1-8b-instruct", "Q4_K_M"), ("llama-3.2-1b-instruct", "Q8_0"),
                        ("gemma-3-27b-it", "Q4_K_M"), ("tiny-llama", "F16"))}  # fmt: skip
    out.update({p.name.split(".")[0]: json.loads(p.read_text()) for p in sorted(logs.glob("*.shape.json"))})
    out.update({p.name.split(".")[0]: read_shape(str(p)) for p in sorted((FIXTURES / "gguf").glob("*.gguf"))})
    for i, (n, swa) in enumerate([(1, "none"), (2, "list"), (5, "every"), (33, "none"), (40, "arch"),
                                  (61, "list"), (80, "every"), (150, "none")]):  # fmt: skip
        out[f"synthetic-{n}-{swa}"] = _synthetic(n, i, swa)
    return out


def cases():
    """(id, shape, knobs, card MiB or None, draft or None), in a fixed order."""
    all_shapes = shapes()
    draft = all_shapes["llama-3.2-1b-instruct-Q8_0"]
    for name, shape in all_shapes.items():
        weights = (sum(shape["layer_bytes"]) + shape["output_bytes"]) / MIB
        for kname, knobs in KNOBS.items():
            reserve = knobs.reserve_mib * knobs.cards
            yield f"{name}/{kname}/no-card", shape, knobs, None, None
            for share in CARD_SHARES:
                yield f"{name}/{kname}/x{share}", shape, knobs, int(weights * share) + reserve, None
        if name.startswith(("llama-3.1-8b", "synthetic-61", "synthetic-80")):
            for layers in (None, 5):
                knobs = Knobs(draft_gpu_layers=layers, parallel=2)
                for share in CARD_SHARES:
                    card = int(weights * share) + knobs.reserve_mib
                    yield f"{name}/draft-{layers}/x{share}", shape, knobs, card, draft


def answer(shape: dict, knobs: Knobs, card, draft) -> str:
    """The plan or its refusal, and the KV table, in words and as a digest of all of it."""
    cards = [Card("c", card, knobs.compute_cap)] if card is not None else []
    try:
        p = plan(shape, knobs, cards, draft)
        said, words = p.as_dict(), f"ctx {p.ctx_per_slot} {p.cache_type_k}/{p.cache_type_v} ngl {p.gpu_layers}"
    except PlanError as e:
        said, words = e.failure.message("h"), f"refused {e.failure.rule}"
    table = kv_table(shape, knobs, cards, [(t, t) for t in AUTO_KV_TYPES], draft) if card is not None else None
    text = json.dumps({"plan": said, "kv": table}, sort_keys=True)
    return f"{words} {hashlib.sha256(text.encode()).hexdigest()[:16]}"


@pytest.fixture(scope="module")
def recorded() -> dict:
    return json.loads(ANSWERS.read_text())


def test_every_case_is_recorded(recorded):
    assert sorted(recorded) == sorted(c[0] for c in cases())


@pytest.mark.parametrize("name", sorted(shapes()))
def test_the_planner_answers_as_recorded(recorded, name):
    for case_id, shape, knobs, card, draft in cases():
        if case_id.split("/")[0] == name:
            assert answer(shape, knobs, card, draft) == recorded[case_id], (case_id, dataclasses.asdict(knobs))


def record() -> None:
    ANSWERS.parent.mkdir(parents=True, exist_ok=True)
    answers = {case_id: answer(shape, knobs, card, draft) for case_id, shape, knobs, card, draft in cases()}
    ANSWERS.write_text(json.dumps(answers, indent=0, sort_keys=True) + "\n")
    print(f"{len(answers)} answers recorded in {ANSWERS}")


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    record()
