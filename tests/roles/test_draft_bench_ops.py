"""The draft model in the unit, and the bench after a new build or model: facts in, commands out."""

import json
import shlex

from pyinfra.facts.files import Link

from roles.llamacpp.reads import BenchRecord, LlamaServerFlags
from roles.llamacpp.reads import BuildFlags
from llamarack.layout import UNIT_NAME
from roles.server.operations import bench, service
from roles.driver.reads import Gpu
from roles.model.reads import GgufShape
from tests.roles.test_server_ops import ROOT, SHAPE, V100, facts, settings, unit_of
from tests.support.ophost import fact_key, run_op

# As nvidia-smi names it, with its PCI id: the card table knows its bandwidth.
V100_PCI = Gpu(0, "Tesla V100-SXM2-16GB", "GPU-1", 16160, "7.0", "550.127.05", "0x1DB110DE")

DRAFT = {"model_draft_repo": "org/tiny-draft", "model_draft_revision": "a" * 40}
SPEC = BuildFlags(("--load-mode", "none"), True, True, True, has_rope_scaling=True, has_spec_draft=True)
NO_SPEC = BuildFlags(("--load-mode", "none"), True, True, True, has_rope_scaling=True)


def draft_facts(flags=SPEC, draft="d1", **kw):
    f = facts(**kw)
    f[fact_key(Link, path=f"{ROOT}/models/draft")] = {"link_target": draft} if draft else None
    f[fact_key(LlamaServerFlags, root=ROOT)] = flags
    if draft:
        f[fact_key(GgufShape, path=f"{ROOT}/models/{draft}/model.gguf")] = SHAPE
    return f


def test_the_unit_runs_the_draft_with_the_plans_kv_and_layers():
    s = settings(**DRAFT, server_draft_max=8, server_draft_min=2)
    commands, _ = run_op(service, draft_facts(), settings=s, gpus=(V100,))
    unit = unit_of(commands)
    assert ("--spec-type draft-simple --spec-draft-model /opt/lr/models/d1/model.gguf --spec-draft-n-max 8 "
            "--spec-draft-n-min 2 --spec-draft-type-k f16 --spec-draft-type-v f16 --spec-draft-ngl 3") in unit
    assert "Description=llamarack llama-server: m1, draft d1 (llama" in unit


def test_draft_gpu_layers_reach_the_unit_and_a_cpu_build_gets_none():
    commands, _ = run_op(service, draft_facts(), settings=settings(**DRAFT, server_draft_gpu_layers=1), gpus=(V100,))
    assert "--spec-draft-ngl 1" in unit_of(commands)
    commands, _ = run_op(service, draft_facts(), settings=settings(**DRAFT, llamacpp_backend="cpu"), gpus=(V100,))
    assert "--spec-draft-model" in unit_of(commands) and "--spec-draft-ngl" not in unit_of(commands)


def test_a_build_without_the_spec_flags_is_refused_before_the_unit_is_touched():
    commands, _ = run_op(service, draft_facts(flags=NO_SPEC), settings=settings(**DRAFT), gpus=(V100,))
    assert len(commands) == 1 and "spec-draft" in commands[0] and "exit 1" in commands[0]


def test_a_missing_draft_artifact_is_refused():
    commands, _ = run_op(service, draft_facts(draft=None), settings=settings(**DRAFT), gpus=(V100,))
    assert len(commands) == 1 and "no draft model under models/draft" in commands[0]


def test_no_draft_asked_no_spec_flags():
    commands, _ = run_op(service, draft_facts(), settings=settings(), gpus=(V100,))
    assert "--spec" not in unit_of(commands)


# -- the bench --

def bench_facts(record=None, **kw):
    f = draft_facts(**kw)
    f[fact_key(BenchRecord, path=f"{ROOT}/state/bench.json")] = record
    return f


def measured(command: str, n: int = 0) -> dict:
    """What the control machine gives the n-th llama-bench run to record beside its figures."""
    return json.loads(command.split(f"{ROOT}/state/bench.{n}.json ", 1)[1].split("' ", 1)[0].lstrip("'"))


def joined(command: str) -> dict:
    """The units the join command makes the record of."""
    assert command.startswith("python3 -c ") and f" join {ROOT}/state/bench.json " in command
    return json.loads(shlex.split(command)[-1])


def test_a_record_of_the_served_build_and_model_is_a_noop():
    record = {"key": {"build": "b1", "model": "m1"}, "pp512": {"tokens_per_second": 900.5},
              "tg128": {"tokens_per_second": 61.2}}
    commands, noops = run_op(bench, bench_facts(record), settings=settings(), gpus=(V100,))
    assert commands == []
    assert noops == ["llama-bench has measured build b1 with model m1: pp512 900.5 t/s, tg128 61.2 t/s"]


def test_a_new_build_stops_the_server_benches_with_the_served_flags_and_starts_it_again():
    old = {"key": {"build": "b0", "model": "m1"}}
    commands, noops = run_op(bench, bench_facts(old), settings=settings(), gpus=(V100_PCI,))
    assert noops == [] and len(commands) == 2
    command, join = commands
    assert command.startswith(f"systemctl stop {UNIT_NAME}; ")
    assert f"systemctl start {UNIT_NAME} && " in command and "exit $rc" in command
    assert (f"{ROOT}/builds/b1/bin/llama-bench -m {ROOT}/models/m1/model.gguf -p 512 -n 128 "
            "-ctk f16 -ctv f16 -fa on -ngl 3 -lm none") in command
    # the record's inputs: the key, the mode, the roofline of the V100 (900 GB/s over the
    # bytes a token reads: both layers and the output layer)
    entry = measured(command)
    assert entry["key"] == {"build": "b1", "model": "m1"} and entry["mode"] == "stopped" and entry["on_card"]
    weights = sum(SHAPE["layer_bytes"]) + SHAPE["output_bytes"]
    assert entry["roofline"] == {"card": "Tesla V100 SXM2 16GB", "bandwidth_gbs": 900, "weight_bytes": weights,
                                 "tokens_per_second": round(900e9 / weights, 1)}  # fmt: skip
    # the record: the one unit, its measurement the run's
    assert joined(join) == {"units": [{"name": UNIT_NAME, "index": 0, "port": 8080, "cards": ["GPU-1"],
                                       "card_names": ["Tesla V100-SXM2-16GB"], "served": entry["served"],
                                       "split_args": [], "roofline": entry["roofline"],
                                       "part": f"{ROOT}/state/bench.0.json"}], "alternative": []}  # fmt: skip


def test_beside_keeps_the_server_and_off_does_nothing():
    commands, _ = run_op(bench, bench_facts(), settings=settings(server_bench="beside"), gpus=(V100,))
    assert len(commands) == 2 and "systemctl" not in commands[0] and "llama-bench" in commands[0]
    commands, noops = run_op(bench, bench_facts(), settings=settings(server_bench="off"), gpus=(V100,))
    assert commands == [] and noops == ["llama-bench is off (server_bench = 'off')"]


def test_the_bench_spells_repack_off_and_cpu_builds_place_no_layers():
    s = settings(server_repack=False, llamacpp_backend="cpu", server_flash_attn=False, server_cache_type_v="f16")
    commands, _ = run_op(bench, bench_facts(), settings=s, gpus=(V100,))
    assert "-fa off -lm none --repack 0" in commands[0] and "-ngl" not in commands[0]


def test_a_card_the_table_does_not_know_has_no_roofline():
    commands, _ = run_op(bench, bench_facts(), settings=settings(), gpus=(V100,))  # no PCI id
    entry = measured(commands[0])
    assert entry["roofline"]["card"] is None and entry["roofline"]["tokens_per_second"] is None
