"""A model file's header and the shape made from it are untrusted: each crafted GGUF,
shape or config.json below ends in a refusal that names what is wrong (the host's
``{"error": ...}`` answer, the planner's "model-shape" refusal, ``llamarack plan``'s
message), never a traceback; and a claimed layer count costs neither time nor a long answer."""

import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from pyinfra.api.exceptions import FactProcessError

from llamarack import remote
from llamarack.errors import ModelSourceError
from roles.model.shapes import local_gguf_shape, shape_from_config
from roles.server.plan_cli import plan_command
from roles.server.planner import MIB, Card, Knobs, PlanError, plan
from roles.llamacpp.files.llamacpp_proof import _gguf_kv, _gguf_string
from roles.model.files.gguf_header import MAX_LAYERS, read_shape
from roles.model.reads import GgufShape
from roles.server.plan import knobs
from roles.settings import load_settings
from tests.unit.test_planner_answers import _synthetic
from tests.unit.test_server_plan import _gguf_header

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "gguf/tiny-llama-Q4_K_M.head.gguf"
LLAMA8B_CONFIG = json.loads((FIXTURES / "configs/llama-3.1-8b-instruct.config.json").read_text())
META = [("general.architecture", "str", "llama"), ("llama.block_count", "u32", 2),
        ("llama.context_length", "u32", 4096), ("llama.embedding_length", "u32", 256),
        ("llama.attention.head_count", "u32", 4), ("llama.attention.head_count_kv", "u32", 2)]  # fmt: skip
TENSORS = [("token_embd.weight", (256, 1000), 12), ("output.weight", (256, 1000), 14)]
TENSORS += [(f"blk.{i}.attn_q.weight", (256, 256), 12) for i in range(2)]
_ARRAY, _U32 = 9, 4


def nested(key: str, depth: int) -> bytes:
    """A key holding arrays nested ``depth`` deep, the innermost an empty one of u32."""
    return _gguf_string(key) + struct.pack("<I", _ARRAY) + struct.pack("<IQ", _ARRAY, 1) * (depth - 1) \
        + struct.pack("<IQ", _U32, 0)  # fmt: skip


def crafted(changes: dict = None, tensors: list = TENSORS, raw: bytes = b"", n_tensors: int = None) -> bytes:
    """A llama header with ``changes`` ({key: (kind, value)}, in place of the key's own),
    ``raw`` key-value bytes after the others, and ``n_tensors`` claimed in place of the count."""
    changes = changes or {}
    meta = [(k, *changes.get(k, (kind, v))) for k, kind, v in META]
    meta += [(k, *kv) for k, kv in changes.items() if k not in {m[0] for m in META}]
    data = bytearray(_gguf_header(meta, tensors))
    keys_end = len(_gguf_header(meta, []))
    data[keys_end:keys_end] = raw
    struct.pack_into("<Q", data, 16, len(meta) + (1 if raw else 0))
    if n_tensors is not None:
        struct.pack_into("<Q", data, 8, n_tensors)
    return bytes(data)


def versioned(version: int) -> bytes:
    """The sound crafted header, claiming GGUF ``version``."""
    data = bytearray(crafted())
    struct.pack_into("<I", data, 4, version)
    return bytes(data)


# (id, the file, what the refusal says)
FILES = [
    # what llama.cpp's gguf.cpp refuses, refused here too (not planned as if it would load)
    ("GGUF version 4", versioned(4), r"GGUF version 4 is not supported: llama.cpp reads versions 2 to 3"),
    ("GGUF version 2^32-1", versioned(2**32 - 1), r"GGUF version 4294967295 is not supported"),
    ("a big-endian v3 file", versioned(0x03000000),
     r"GGUF version 50331648 \(a big-endian file's version, read little-endian\) is not supported"),
    ("a key given twice", crafted(raw=_gguf_kv("llama.block_count", "u32", 2)),
     r"key 'llama.block_count' appears twice in the header; llama.cpp refuses such a file"),
    ("a key not kept given twice", crafted({"general.name": ("str", "a")}, raw=_gguf_kv("general.name", "str", "b")),
     r"key 'general.name' appears twice"),
    # llama.cpp takes a head size or KV head count the header gives as it is, 0 too; derived only when absent
    ("key_length 0", crafted({"llama.attention.key_length": ("u32", 0)}),
     r"head_dim_k \(attention.key_length\) 0 is out of range"),
    ("value_length 0", crafted({"llama.attention.value_length": ("u32", 0)}),
     r"head_dim_v \(attention.value_length\) 0 is out of range"),
    ("head_count_kv 0", crafted({"llama.attention.head_count_kv": ("u32", 0)}),
     r"n_head_kv \(attention.head_count_kv\) 0 is out of range"),
    ("string block_count", crafted({"llama.block_count": ("str", "32")}),
     r"n_layer \(block_count\) '32' is not an integer"),
    ("float block_count", crafted({"llama.block_count": ("f32", 2.0)}),
     r"n_layer \(block_count\) 2.0 is not an integer"),
    ("string head_count", crafted({"llama.attention.head_count": ("str", "4")}),
     r"n_head \(attention.head_count\) '4' is not an integer"),
    ("string embedding_length", crafted({"llama.embedding_length": ("str", "256")}),
     r"n_embd \(embedding_length\) '256' is not an integer"),
    ("list of strings as head_count_kv", crafted({"llama.attention.head_count_kv": ("[]str", ["2", "2"])}),
     r"n_head_kv \(attention.head_count_kv\) \['2', '2'\] is not an integer"),
    ("negative head_count", crafted({"llama.attention.head_count": ("i32", -4)}),
     r"n_head \(attention.head_count\) -4 is out of range"),
    ("zero block_count", crafted({"llama.block_count": ("u32", 0)}), r"n_layer \(block_count\) 0 is out of range"),
    ("string vocab_size", crafted({"llama.vocab_size": ("str", "x")}), r"n_vocab \(vocab_size\) 'x' is not an integer"),
    ("string context_length", crafted({"llama.context_length": ("str", "4096")}),
     r"n_ctx_train \(context_length\) '4096' is not an integer"),
    ("NaN rope scale", crafted({"llama.rope.scaling.factor": ("f32", float("nan"))}),
     r"rope_scale \(rope.scaling.factor\) nan is not a positive finite number"),
    ("string window pattern", crafted({"llama.attention.sliding_window_pattern": ("str", "every 6")}),
     r"swa_pattern \(attention.sliding_window_pattern\) 'every 6' is neither a count nor a list"),
    ("numeric architecture", crafted({"general.architecture": ("u32", 7)}),
     r"general.architecture 7 is not a name"),
    ("arrays 5000 deep, under a key not kept", crafted(raw=nested("general.junk", 5000)),
     r"key 'general.junk' holds an array of arrays, which llama.cpp does not read"),
    ("arrays 5000 deep, under a kept key", crafted(raw=nested("llama.attention.key_length", 5000)),
     r"key 'llama.attention.key_length' holds an array of arrays"),
    ("a kept array longer than any layer list", crafted({"llama.attention.head_count_kv": ("[]u32", [2] * 70000)}),
     rf"key 'llama.attention.head_count_kv' holds 70000 items, more than the {MAX_LAYERS}"),
    ("block_count 10^7", crafted({"llama.block_count": ("u32", 10**7)}),
     rf"n_layer \(block_count\) 10000000 is out of range \(1 to {MAX_LAYERS}\)"),
    ("block_count past the layer tensors", crafted({"llama.block_count": ("u32", 60000)}),
     r"block_count 60000 is more layers than the file's 2 layer tensors \(blk.N.\*\) make"),
    ("2^40 tensors claimed", crafted(n_tensors=2**40), r"a header of 1099511627776 tensors .* is no model's"),
    ("a tensor of 5 dimensions", crafted(tensors=TENSORS + [("blk.0.x", (1, 1, 1, 1, 1), 0)]),
     r"tensor 'blk.0.x' has 5 dimensions; llama.cpp reads at most 4"),
    ("a tensor of 2^80 values", crafted(tensors=TENSORS + [("blk.0.x", (2**40, 2**40), 0)]),
     r"tensor 'blk.0.x' of 1208925819614629174706176 values, more than llama.cpp can hold"),
]  # fmt: skip


def host_answer(path: Path) -> str:
    """What the host prints for ``GgufShape`` (this interpreter standing in for python3)."""
    r = subprocess.run(remote.command(*GgufShape().host_run(str(path)), python=sys.executable), shell=True,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    return r.stdout


def test_the_crafted_header_without_changes_reads(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(crafted())
    shape = GgufShape().process(host_answer(path).splitlines())
    assert (shape["n_layer"], shape["n_head_kv"], shape["head_dim_k"]) == (2, 2, 64)
    assert plan(shape, Knobs(), [Card("c", 8192)]).gpu_layers == 3


def test_odd_tensor_names_are_no_layer_and_no_crash(tmp_path):
    """A tensor named like a block but without a layer number (or a negative one) is
    counted outside the blocks, as any other tensor there."""
    path = tmp_path / "model.gguf"
    path.write_bytes(crafted(tensors=TENSORS + [("blk.x.w", (32,), 0), ("blk.-1.w", (32,), 0), ("blk.", (32,), 0)]))
    shape = read_shape(str(path))
    assert shape["layer_bytes"] == [256 * 256 // 256 * 144] * 2
    assert shape["output_bytes"] == 256 * 1000 // 256 * 210 + 3 * 32 * 4


@pytest.mark.parametrize("data, said", [f[1:] for f in FILES], ids=[f[0] for f in FILES])
def test_a_crafted_gguf_is_refused_on_the_host_with_what_is_wrong(tmp_path, data, said):
    path = tmp_path / "model.gguf"
    path.write_bytes(data)
    started = time.process_time()
    answer = host_answer(path)
    assert len(answer) < 1000  # an error, not a size per claimed layer
    error = json.loads(answer)["error"]
    assert json.loads(answer)["path"] == str(path)
    assert re.search(said, error), error
    # the control side's per-host answer: the fact says what the host said
    with pytest.raises(FactProcessError, match=said):
        GgufShape().process(answer.splitlines())
    # and llamarack plan, reading the same file here
    with pytest.raises(ModelSourceError, match=said):
        local_gguf_shape(str(path))
    assert time.process_time() - started < 5


def _tiny(**changes) -> dict:
    """The tiny model's shape, as a host sends it, with ``changes``."""
    shape = read_shape(str(TINY))
    shape.update(changes)
    return shape


# (id, the shape that reaches the planner, what the refusal says): what an older reader,
# an altered record or a bad estimate could send, each a TypeError in the arithmetic unchecked.
SHAPES = [
    ("string n_layer", _tiny(n_layer="2"), r"n_layer \(block_count\) '2' is not an integer"),
    ("float n_layer", _tiny(n_layer=2.0), r"n_layer \(block_count\) 2.0 is not an integer"),
    ("n_layer 10^7", _tiny(n_layer=10**7), r"n_layer \(block_count\) 10000000 is out of range"),
    ("more layers than sizes", _tiny(n_layer=3), r"layer_bytes \[.*\] is not a byte count for each of the 3 layers"),
    ("string trained context", _tiny(n_ctx_train="2048"), r"n_ctx_train \(context_length\) '2048' is not an integer"),
    ("zero trained context", _tiny(n_ctx_train=0), r"n_ctx_train \(context_length\) 0 is out of range"),
    ("string head size", _tiny(head_dim_k="64"), r"head_dim_k \(attention.key_length\) '64' is not an integer"),
    ("no KV heads", _tiny(n_head_kv=None), r"n_head_kv \(attention.head_count_kv\) None is not an integer"),
    ("2^40 KV heads", _tiny(n_head_kv=2**40), r"n_head_kv \(attention.head_count_kv\) 1099511627776 is out of range"),
    ("string window pattern", _tiny(n_swa=1024, swa_pattern="abc"), r"swa_pattern .* 'abc' is neither a count"),
    ("string window", _tiny(n_swa="1024"), r"n_swa \(attention.sliding_window\) '1024' is not an integer"),
    ("string layer size", _tiny(layer_bytes=["1", 2]), r"layer_bytes \['1', 2\] is not a byte count"),
    ("negative layer size", _tiny(layer_bytes=[-1, 2]), r"layer_bytes \[-1, 2\] is not a byte count"),
    ("infinite rope scale", _tiny(rope_scale=float("inf")), r"rope_scale \(rope.scaling.factor\) inf is not a positive"),
    ("string tied flag", _tiny(tied_embeddings="no"), r"tied_embeddings 'no' is not true or false"),
    ("no architecture", _tiny(architecture=None), r"architecture None is not a name"),
    ("a key missing", {k: v for k, v in _tiny().items() if k != "n_vocab"}, r"the shape lacks n_vocab"),
    ("not a mapping", [], r"a shape is a mapping, not list"),
]  # fmt: skip


@pytest.mark.parametrize("shape, said", [s[1:] for s in SHAPES], ids=[s[0] for s in SHAPES])
def test_a_crafted_shape_is_the_hosts_refusal_not_a_crash(shape, said):
    settings = load_settings("gpu01", {"python_env_backend": "venv"})
    for card in (16384, None):
        with pytest.raises(PlanError) as e:
            plan(shape, knobs(settings), [Card("c", card)] if card else [])
        assert e.value.failure.rule == "model-shape"
        assert re.search(said, e.value.failure.message("gpu01")), e.value.failure.message("gpu01")
    # as a draft model too, beside a sound model
    with pytest.raises(PlanError, match="model-shape") as e:
        plan(_tiny(), Knobs(), [Card("c", 16384)], shape)
    assert "found draft model" in e.value.failure.message("gpu01")


CONFIGS = [
    ("string layer count", {"num_hidden_layers": "32"}, r"n_layer \(num_hidden_layers\) '32' is not an integer"),
    ("10^9 layers", {"num_hidden_layers": 10**9}, r"n_layer \(num_hidden_layers\) 1000000000 is out of range"),
    ("float width", {"hidden_size": 4096.0}, r"n_embd \(hidden_size\) 4096.0 is not an integer"),
    ("no heads", {"num_attention_heads": 0}, r"n_head \(num_attention_heads\) 0 is out of range"),
    # the converter writes a head_dim or num_key_value_heads given (0 too), and llama.cpp takes it
    ("head_dim 0", {"head_dim": 0}, r"head_dim_k \(head_dim\) 0 is out of range"),
    ("no KV heads", {"num_key_value_heads": 0}, r"n_head_kv \(num_key_value_heads\) 0 is out of range"),
    ("string rope scaling", {"rope_scaling": "yarn"}, r"rope_scaling is not an object"),
    ("string rope factor", {"rope_scaling": {"rope_type": "yarn", "factor": "4"}},
     r"rope_scale \(rope.scaling.factor\) '4' is not a positive finite number"),
    ("string window", {"sliding_window": "4096"}, r"n_swa \(attention.sliding_window\) '4096' is not an integer"),
]  # fmt: skip


@pytest.mark.parametrize("changes, said", [c[1:] for c in CONFIGS], ids=[c[0] for c in CONFIGS])
def test_a_crafted_config_json_is_refused_before_anything_is_counted(changes, said):
    with pytest.raises(ModelSourceError, match=said):
        shape_from_config({**LLAMA8B_CONFIG, **changes}, "Q4_K_M")


def test_not_a_config_at_all_is_refused():
    with pytest.raises(ModelSourceError, match="not a model's config"):
        shape_from_config([1, 2], "Q4_K_M")
    with pytest.raises(ModelSourceError, match="not a model's config"):
        shape_from_config({"text_config": "llama"}, "Q4_K_M")


@pytest.mark.parametrize("source", ["gguf", "draft", "config"])
def test_llamarack_plan_says_what_is_wrong_and_exits_1(tmp_path, source):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(crafted({"llama.block_count": ("str", "32")}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**LLAMA8B_CONFIG, "num_hidden_layers": "32"}))
    args = {"gguf": [str(bad)], "draft": [str(TINY), "--draft", str(bad)], "config": ["--config", str(config)]}[source]
    result = CliRunner().invoke(plan_command, args + ["--gpu", "16384"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert re.search(r"n_layer \((block_count|num_hidden_layers)\) '32' is not an integer", result.output)


@pytest.mark.parametrize("swa", ["none", "every", "list"])
def test_fifty_thousand_layers_plan_in_well_under_a_second(swa):
    """A partial offload over 50,000 layers: the planner tries log2(n) layer counts, each
    ledger two sums over the layers, not n ledgers of n layers each."""
    from roles.server.plan_cli import kv_table
    from roles.server.planner import ledger

    shape = _synthetic(50_000, 7, swa)
    card = [Card("c", int(sum(shape["layer_bytes"]) / MIB * 0.6))]
    started = time.process_time()
    p = plan(shape, Knobs(), card)
    table = kv_table(shape, Knobs(), card, [("f16", "f16"), ("q4_0", "q4_0")])
    took = time.process_time() - started
    assert 0 < p.gpu_layers < 50_001 and p.ctx_per_slot >= 4096
    k, v = p.cache_type_k, p.cache_type_v
    assert ledger(shape, Knobs(), card, p.gpu_layers, k, v, 4096).fits()
    assert not ledger(shape, Knobs(), card, p.gpu_layers + 1, k, v, 4096).fits()
    assert all(0 < row["gpu_layers"] < 50_001 for row in table)
    assert took < 1.0, took


def test_the_most_layers_a_shape_may_have_plan_in_well_under_a_second():
    shape = _synthetic(MAX_LAYERS, 5, "list")
    started = time.process_time()
    plan(shape, Knobs(), [Card("c", int(sum(shape["layer_bytes"]) / MIB * 0.3))])
    assert time.process_time() - started < 1.0
    with pytest.raises(PlanError) as e:
        plan(_synthetic(MAX_LAYERS + 1, 5, "none"), Knobs(), [Card("c", 16384)])
    assert f"n_layer (block_count) {MAX_LAYERS + 1} is out of range" in e.value.failure.found
