"""The planner over several cards (llama.cpp's layer split) and the layout of a host's cards."""

import dataclasses
import json
import struct
import time
from pathlib import Path

import pytest

from roles.model.shapes import shape_from_config
from roles.server.card_layout import cards_of, choose_layout, reach
from roles.server.planner import (MIB, N_UBATCH, PIPELINE_COPIES, Card, Knobs, Over, PlanError, check_split_mode,
                                  kv_layer_bytes, ledger, plan, prefill_pool_bytes, sliding_layers)  # fmt: skip
from tests.unit.test_planner_answers import _synthetic, cases

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures/configs"
GEMMA27B = shape_from_config(json.loads((CONFIGS / "gemma-3-27b-it.config.json").read_text()), "Q4_K_M")
GEMMA27B_F16 = shape_from_config(json.loads((CONFIGS / "gemma-3-27b-it.config.json").read_text()), "F16")
LLAMA8B = shape_from_config(json.loads((CONFIGS / "llama-3.1-8b-instruct.config.json").read_text()), "Q4_K_M")
LLAMA1B = shape_from_config(json.loads((CONFIGS / "llama-3.2-1b-instruct.config.json").read_text()), "Q8_0")
V100 = Card("Tesla V100 SXM2 16GB", 16130, "7.0")
P40 = Card("Tesla P40", 23040, "6.1")  # planned at the board's smallest known report
T4 = Card("Tesla T4", 15360, "7.5")


def _model_weights(shape: dict) -> int:
    output = shape["output_bytes"] + (shape["token_embd_bytes"] if shape["tied_embeddings"] else 0)
    return sum(shape["layer_bytes"]) + shape["token_embd_bytes"] + output


def test_one_cards_ledger_is_the_one_card_planners():
    """The per-card arithmetic (``Over``) over one card equals one model's (``planner.ledger``
    of one card), every byte, for every shape, knob set and card of the planner's recorded
    answers, at several layer counts, KV types and contexts."""
    compared = 0
    for _, shape, knobs, card, draft in cases():
        if card is None:
            continue
        knobs = dataclasses.replace(knobs, cards=1)
        cards = (Card("c", card, knobs.compute_cap),)
        over = Over(shape, knobs, cards, draft)
        for layers in {1, shape["n_layer"] // 2 + 1, shape["n_layer"] + 1}:
            for k, v, ctx in (("f16", "f16", 256), ("q8_0", "q8_0", 4096), ("q4_0", "f16", 32768)):
                one, split = ledger(shape, knobs, cards, layers, k, v, ctx, draft), over.ledger(layers, k, v, ctx)
                (c,) = split.cards
                assert (c.total, c.layers, c.weights, c.kv) == (one.total_on_card, layers, one.weights_on_card,
                                                                one.kv_on_card)  # fmt: skip
                assert (split.weights_on_host, split.kv_on_host, split.kv_bytes_per_token) == (
                    one.weights_on_host, one.kv_on_host, one.kv_bytes_per_token)
                assert one.fits() == split.fits() == over.fits(layers, k, v, ctx)
                compared += 1
    assert compared > 8000


def test_a_plan_over_one_card_is_the_one_card_plan():
    """The planner searches one card card by card (``Over``) and counts its plan as one model
    (``planner.ledger``): the plan it chooses fits by both counts, alike to the byte, and a
    refusal is the same whichever count made it."""
    for case_id, shape, knobs, card, draft in list(cases())[::7]:
        if card is None or knobs.cards != 1:
            continue
        cards = [Card("c", card, knobs.compute_cap)]
        try:
            got = plan(shape, knobs, cards, draft)
        except PlanError as e:
            assert e.failure.rule in ("memory", "context-trained"), case_id
            continue
        if got.gpu_layers == 0:
            continue
        book = Over(shape, knobs, tuple(cards), draft).ledger(got.gpu_layers, got.cache_type_k, got.cache_type_v,
                                                              got.ctx_per_slot)  # fmt: skip
        assert got.split_args() == [] and got.ledger.fits() and book.fits(), case_id
        assert book.cards[0].total == got.ledger.total_on_card == got.ledger.cards[0].total, case_id


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _llama_cpp_devices(shares: tuple, gpu_layers: int) -> list:
    """llama.cpp's load_tensors: the device of each offloaded layer, from --tensor-split, in
    float32 as it computes (running sums over their sum; std::upper_bound of j / gpu_layers)."""
    running, total = [], _f32(0.0)
    for s in shares:
        total = _f32(total + _f32(s))
        running.append(total)
    splits = [_f32(r / total) for r in running]
    devices = []
    for j in range(gpu_layers):
        x = _f32(_f32(j) / _f32(gpu_layers))
        devices.append(next(i for i, s in enumerate(splits) if s > x))
    return devices


@pytest.mark.parametrize("shares", [(33, 30), (1, 62), (62, 1), (21, 21, 21), (10, 0, 53), (8,) * 8, (7, 9, 11, 13, 23),
                                    (40, 41, 40), (5000, 4999, 1)])  # fmt: skip
def test_layer_counts_given_as_tensor_split_are_the_layers_each_card_gets(shares):
    devices = _llama_cpp_devices(shares, sum(shares))
    assert [devices.count(i) for i in range(len(shares))] == list(shares)
    assert devices == sorted(devices)  # in order: each card a run of layers, the output layer on the last
    assert devices[-1] == max(i for i, s in enumerate(shares) if s)


def test_the_cards_hold_the_model_every_byte_once():
    """Weights and KV over two cards and the host add up to the model's; each card's KV is its
    layers' own (sliding layers at their window); the output layer is on the last card."""
    for shape in (GEMMA27B, LLAMA8B, _synthetic(61, 5, "list"), _synthetic(40, 4, "arch")):
        knobs = Knobs(parallel=2)
        over = Over(shape, knobs, (V100, P40))
        for layers in (shape["n_layer"] + 1, shape["n_layer"] // 2):
            book = over.ledger(layers, "q8_0", "q8_0", 8192)
            a, b = book.cards
            assert a.first_layer + a.layers == b.first_layer and b.first_layer + b.layers == shape["n_layer"] + 1
            assert (a.output_layer, b.output_layer) == (False, True) and book.main_gpu == 1
            assert a.weights + b.weights + book.weights_on_host == _model_weights(shape)
            whole = ledger(shape, knobs, [], 0, "q8_0", "q8_0", 8192)  # every layer's KV, on the host
            assert a.kv + b.kv + book.kv_on_host == whole.kv_on_host
            slides, per_cell = sliding_layers(shape), kv_layer_bytes(shape, "q8_0", "q8_0")
            window = min(8192, -(-(shape["n_swa"] + N_UBATCH) // 256) * 256)
            own = sum(int(per_cell * 2 * (window if i in slides else 8192))
                      for i in range(b.first_layer, shape["n_layer"]))  # fmt: skip
            assert b.kv == own and book.tensor_split == (a.layers, b.layers)


def test_every_card_keeps_its_reserve_compute_and_its_own_prefill_pool():
    book = Over(GEMMA27B, Knobs(), (V100, T4, V100)).ledger(63, "q4_0", "q4_0", 16384)
    assert [c.reserve for c in book.cards] == [672 * MIB] * 3
    assert len({c.compute for c in book.cards}) == 1 and book.pipelined
    # a V100 multiplies prompts with cuBLAS (its pool), a T4 with MMQ (none)
    assert [c.prefill_pool for c in book.cards] == [prefill_pool_bytes(GEMMA27B, "7.0"), 0,
                                                    prefill_pool_bytes(GEMMA27B, "7.0")]  # fmt: skip
    assert book.cards[0].prefill_pool == 329.5 * MIB
    assert book.fits() and all(c.total <= c.card_mib * MIB for c in book.cards)


def test_pipelined_cards_keep_four_copies_of_their_inputs():
    """Every layer over two cards: llama.cpp pipelines, and each card's graph keeps 4 copies of
    its inputs (the masks, the hidden state, the positions) where one card keeps one."""
    one = ledger(GEMMA27B, Knobs(), [Card("c", 16130)], 63, "f16", "f16", 32768)
    book = Over(GEMMA27B, Knobs(), (V100, V100)).ledger(63, "f16", "f16", 32768)
    inputs = N_UBATCH * ((32768 + 1536) * 2 + 5376 * 4 + 4)  # f16 masks (dense and sliding), f32 hidden state, positions
    assert PIPELINE_COPIES == 4 and book.cards[0].pipeline_copies == 3 * inputs
    assert [c.compute for c in book.cards] == [one.compute_on_card + 3 * inputs] * 2
    # layers left on the host: no pipeline, each card's compute as one card's
    partial = Over(GEMMA27B, Knobs(), (V100, V100)).ledger(60, "f16", "f16", 32768)
    assert not partial.pipelined and [c.compute for c in partial.cards] == [one.compute_on_card] * 2
    assert partial.weights_on_host == sum(GEMMA27B["layer_bytes"][:3]) + GEMMA27B["token_embd_bytes"]


def test_the_layers_leave_every_card_the_same_spare_as_whole_layers_allow():
    over = Over(LLAMA8B, Knobs(), (V100, V100))
    book = over.ledger(33, "f16", "f16", 32768)
    spare = [c.card_mib * MIB - c.total for c in book.cards]
    assert book.tensor_split == (17, 16)
    # one layer moved either way leaves one card less than the smaller spare of the two
    layer = LLAMA8B["layer_bytes"][16] + 32 * 1024 * 32768  # weights and f16 KV of a layer
    assert min(spare) > min(spare[0] - layer, spare[1] + layer) and min(spare) > min(spare[0] + layer, spare[1] - layer)
    # mixed cards: the larger card takes more layers
    mixed = Over(GEMMA27B, Knobs(), (P40, V100)).ledger(63, "q8_0", "q8_0", 32768)
    assert mixed.tensor_split[0] > mixed.tensor_split[1] and mixed.fits()


def test_the_context_and_layers_are_binary_searches_that_stop_at_the_edge():
    over = Over(GEMMA27B, Knobs(), (V100, V100))
    top = over.largest_context(63, "f16", "f16", 262144)
    assert over.fits(63, "f16", "f16", top) and not over.fits(63, "f16", "f16", top + 256)
    small = Over(GEMMA27B_F16, Knobs(), (V100, V100))
    most = small.most_layers("q4_0", "q4_0", 4096)
    assert small.fits(most, "q4_0", "q4_0", 4096) and not small.fits(most + 1, "q4_0", "q4_0", 4096)


@pytest.mark.parametrize("swa", ["none", "every", "list"])
def test_fifty_thousand_layers_over_three_cards_plan_in_well_under_a_second(swa):
    shape = _synthetic(50_000, 7, swa)
    share = int(sum(shape["layer_bytes"]) / MIB / 4)
    cards = [Card("a", share), Card("b", share), Card("c", share)]
    started = time.process_time()
    p = plan(shape, Knobs(), cards)
    took = time.process_time() - started
    assert 0 < p.gpu_layers < 50_001 and sum(p.ledger.tensor_split) == p.gpu_layers and p.ledger.fits()
    assert took < 1.0, took


def test_the_write_ups_case_on_two_v100s():
    """Gemma-3-27B at Q4_K_M (62 blocks + the output layer: 63 layers, 16.5 GB) on one V100
    16 GB: 57 of 63 layers and 10,752 tokens with q8_0 KV, 58 and 13,056 with q4_0. On two:
    every layer, at the trained 131,072 tokens with either; with YaRN x2 (the write-up's
    256K) 194,048 tokens with q8_0 and all 262,144 with q4_0."""
    one = Over(GEMMA27B, Knobs(compute_cap="7.0"), (V100,))
    assert one.largest_context(63, "q8_0", "q8_0", 131072) == 0 and one.most_layers("q8_0", "q8_0", 4096) == 57
    assert one.largest_context(57, "q8_0", "q8_0", 131072) == 10752
    assert plan(GEMMA27B, Knobs(), [V100]).note.startswith("ctx 13056, q4_0/q4_0 KV (auto), 58 of 63 layers")
    for kv, yarn_ctx in (("q8_0", 194048), ("q4_0", 262144)):
        two = plan(GEMMA27B, Knobs(cache_type_k=kv, cache_type_v=kv), [V100, V100])
        assert (two.gpu_layers, two.ctx_per_slot, two.ledger.tensor_split) == (63, 131072, (33, 30))
        assert two.split_args() == ["--split-mode", "layer", "--tensor-split", "33,30", "--main-gpu", "1"]
        a, b = two.ledger.cards
        assert a.fits() and b.fits() and two.ledger.weights_on_host == GEMMA27B["token_embd_bytes"]
        yarn = Knobs(cache_type_k=kv, cache_type_v=kv, rope_scaling="yarn", rope_scale=2.0)
        assert plan(GEMMA27B, yarn, [V100, V100]).ctx_per_slot == yarn_ctx
    q8 = plan(GEMMA27B, Knobs(cache_type_k="q8_0", cache_type_v="q8_0"), [V100, V100]).ledger.cards
    assert [round(c.total / MIB) for c in q8] == [13289, 13480]  # of 16,130: docs/planning.md's table
    auto = plan(GEMMA27B, Knobs(), [V100, V100])
    assert (auto.cache_type_k, auto.ctx_per_slot) == ("f16", 131072)  # the most precise type that gives it


def test_a_context_the_cards_cannot_give_is_refused_with_each_cards_numbers():
    with pytest.raises(PlanError) as e:
        plan(GEMMA27B, Knobs(ctx_size=262144, rope_scaling="yarn", rope_scale=2.0, cache_type_k="q8_0",
                                   cache_type_v="q8_0"), [V100, V100])  # fmt: skip
    f = e.value.failure
    assert f.rule == "memory" and "at most 194048 tokens per slot on these 2 cards" in f.needed
    assert f.found.startswith("server_ctx_size 262144 x 1 slots: ") and "on cards of 16130+16130 MiB" in f.found
    with pytest.raises(PlanError) as e:
        plan(GEMMA27B_F16, Knobs(gpu_layers=63), [T4, T4])
    assert e.value.failure.found.startswith("2 cards of 15360+15360 MiB for ")
    assert "more cards for the unit" in e.value.failure.fix


def test_row_is_never_used_and_tensor_never_with_a_quantized_cache():
    with pytest.raises(PlanError) as e:
        check_split_mode("row", "f16", "f16")
    assert e.value.failure.rule == "split-mode"
    with pytest.raises(PlanError) as e:
        plan(LLAMA8B, Knobs(cache_type_k="q8_0", cache_type_v="q8_0"), [V100, V100], split_mode="tensor")
    assert "does not take a quantized one" in e.value.failure.needed
    tensor = plan(LLAMA8B, Knobs(), [V100, V100], split_mode="tensor")  # auto: f16 only
    assert (tensor.cache_type_k, tensor.cache_type_v) == ("f16", "f16") and tensor.split_args()[:2] == ["--split-mode",
                                                                                                        "tensor"]
    assert not tensor.ledger.pipelined  # llama.cpp pipelines the layer split only
    with pytest.raises(PlanError):
        choose_layout(LLAMA8B, Knobs(cache_type_k="q4_0", cache_type_v="q4_0"), [V100, V100], "split", None, "tensor")


def test_a_draft_model_is_planned_on_the_first_card():
    knobs = Knobs(parallel=2)
    book = Over(LLAMA8B, knobs, (V100, V100), LLAMA1B).ledger(33, "q8_0", "q8_0", 8192)
    one = ledger(LLAMA8B, knobs, [Card("c", 16130, "7.0")], 33, "q8_0", "q8_0", 8192, LLAMA1B)
    draft = one.draft_weights_on_card + one.draft_kv_on_card + one.draft_compute_on_card + one.draft_prefill_pool
    assert [c.draft for c in book.cards] == [draft, 0] and book.draft_gpu_layers == 17
    assert book.tensor_split[0] < book.tensor_split[1]  # the first card makes room for it


def test_auto_serves_one_model_per_card_when_one_card_holds_it():
    layout = choose_layout(LLAMA8B, Knobs(), [V100] * 8)
    assert layout.chosen == "per_card" and [u.cards for u in layout.units] == [(i,) for i in range(8)]
    assert all(u.plan == plan(LLAMA8B, Knobs(), [V100]) for u in layout.units)
    assert layout.reason.startswith("per_card: all 33 layers at 4,096 tokens (the minimum) fit one Tesla V100 SXM2 "
                                    "16GB alone (planned ")
    assert layout.reason.endswith(" MiB at 131,072 tokens, q8_0/q8_0 KV); 8 units") and layout.free == ()


def test_auto_splits_over_the_fewest_cards_and_makes_more_units_while_cards_remain():
    two = choose_layout(GEMMA27B, Knobs(), [V100] * 8)
    assert two.chosen == "split" and [u.cards for u in two.units] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert two.reason.startswith("split over 2 cards (0, 1): 58 of 63 layers fit one Tesla V100 SXM2 16GB at 4,096 "
                                 "tokens (the minimum); 2 cards hold all 63 at 131,072 tokens")  # fmt: skip
    # 8 cards, a model that needs 3: two units of 3, two cards left free
    three = choose_layout(GEMMA27B_F16, Knobs(), [P40] * 8)
    assert [u.cards for u in three.units] == [(0, 1, 2), (3, 4, 5)] and three.free == (6, 7)
    assert three.reason.endswith("; 2 units; cards 6, 7 left free: too few left for another unit that holds every "
                                 "layer at 4,096 tokens (the minimum)")  # fmt: skip
    assert all(u.plan.gpu_layers == 63 and len(u.plan.ledger.tensor_split) == 3 for u in three.units)


def test_the_wanted_context_decides_how_many_cards_a_unit_takes():
    at_32k = choose_layout(GEMMA27B, Knobs(ctx_size=32768), [V100] * 3)
    assert [u.cards for u in at_32k.units] == [(0, 1)] and at_32k.free == (2,)
    assert at_32k.units[0].plan.ctx_per_slot == 32768 and "at 32,768 tokens;" in at_32k.reason


def test_split_asked_splits_a_model_one_card_holds():
    layout = choose_layout(LLAMA8B, Knobs(), [V100] * 3, "split")
    assert [u.cards for u in layout.units] == [(0, 1)] and layout.free == (2,)
    assert layout.reason.startswith("(split asked) split over 2 cards (0, 1): all 33 layers fit one")
    assert "(a split takes two cards at least)" in layout.reason


def test_per_card_asked_plans_each_card_alone_and_names_a_card_that_serves_nothing():
    layout = choose_layout(GEMMA27B, Knobs(), [V100, P40], "per_card")
    assert [u.plan.gpu_layers for u in layout.units] == [58, 63] and layout.chosen == "per_card"
    assert layout.reason.startswith("per_card (asked): each card planned alone; card 0: ctx 13056")
    with pytest.raises(PlanError) as e:
        choose_layout(LLAMA8B, Knobs(), [V100, Card("small", 700)], "per_card")
    assert e.value.failure.found.startswith("card 1 (small): 700 MiB on the card")


def test_mixed_cards_largest_first():
    """A P40 holds the 27B alone; a V100 and a T4 hold it together."""
    layout = choose_layout(GEMMA27B, Knobs(), [T4, P40, V100])
    assert layout.chosen == "mixed" and [u.cards for u in layout.units] == [(1,), (2, 0)]
    assert layout.units[1].plan.ledger.cards[0].name == V100.name and layout.units[1].plan.ledger.fits()
    assert layout.reason.startswith("mixed: card 1 alone: ctx 131072") and "; split over 2 cards (2, 0): " in layout.reason


def test_when_no_group_holds_every_layer_one_unit_over_all_serves_the_most():
    layout = choose_layout(GEMMA27B_F16, Knobs(), [T4, T4])
    (unit,) = layout.units
    assert unit.cards == (0, 1) and 0 < unit.plan.gpu_layers < 63 and unit.plan.ctx_per_slot >= 4096
    assert layout.reason.startswith("split over 2 cards (0, 1): no group of the cards holds all 63 layers at 4,096")
    alone = choose_layout(GEMMA27B, Knobs(), [V100])  # one card: today's plan, 58 of 63
    assert alone.units[0].plan.gpu_layers == 58 and "the card does not hold all 63 layers" in alone.reason


def test_no_card_or_no_layers_serve_from_the_cpu():
    cpu = choose_layout(LLAMA8B, Knobs(), [])
    assert cpu.chosen == "cpu" and cpu.units[0].cards == () and cpu.units[0].plan.gpu_layers is None
    zero = choose_layout(LLAMA8B, Knobs(gpu_layers=0), [V100, V100])
    assert zero.chosen == "cpu" and zero.units[0].cards == (0,) and zero.free == (1,)
    with pytest.raises(PlanError) as e:
        choose_layout(LLAMA8B, Knobs(), [V100], "row")
    assert e.value.failure.rule == "layout"


def test_cards_from_a_hosts_gpu_facts_by_uuid():
    from roles.driver.reads import Gpu

    gpus = (Gpu(0, "Tesla V100-SXM2-16GB", "GPU-a", 16160, "7.0", "550.127.05", "0x1DB110DE"),
            Gpu(1, "Tesla P40", "GPU-b", 24451, "6.1", "550.127.05", "0x1B3810DE"))  # fmt: skip
    cards = cards_of(gpus)
    assert cards[0] == Card("Tesla V100-SXM2-16GB", 16130, "7.0", "GPU-a") and cards[1].id == "GPU-b"
    layout = choose_layout(GEMMA27B, Knobs(), cards)
    assert layout.as_dict()["units"][0]["card_ids"] == ["GPU-b"]
    assert reach(GEMMA27B, Knobs(), [cards[1]], None) == 131072


def test_a_bad_shape_is_a_refusal_before_any_layout_is_tried():
    bad = dict(GEMMA27B, layer_bytes="many")
    with pytest.raises(PlanError) as e:
        choose_layout(bad, Knobs(), [V100] * 4)
    assert e.value.failure.rule == "model-shape"
    with pytest.raises(PlanError):
        plan(bad, Knobs(), [V100, V100])
