"""The host modules' JSON (llamarack/remote/json_text.py) against the json module: the same
text written, the same values read, the same texts refused."""

import json
import math
import random
import subprocess
import sys

import pytest

from llamarack import remote


def codec() -> dict:
    """json_text's functions, from its source as a host runs it."""
    namespace: dict = {}
    exec(compile(remote.path("json_text").read_text(), "json_text", "exec"), namespace)
    return namespace


JSON_TEXT = codec()
CHARACTERS = ['"', "\\", "/", "\n", "\r", "\t", "\b", "\f", "\x00", "\x1f", " ", "~", "\x7f", "\x80", "é", "\u2028",
              "\ud800", "\udfff", "\uffff", "😀", "𝄞", "a", "Z", "0", "{", "]", ",", ":"]  # fmt: skip


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(10 if depth < 4 else 7)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, -1, 7, 2**63, -(2**80), rng.randrange(-10**9, 10**9)])
    if kind == 3:
        return rng.choice([0.0, -0.0, 1.5, 1e300, 5e-324, 1 / 3, -2.5e-7, rng.uniform(-1e6, 1e6), math.inf, -math.inf])
    if kind in (4, 5, 6):
        return "".join(rng.choice(CHARACTERS) for _ in range(rng.randrange(12)))
    if kind in (7, 8):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {"".join(rng.choice(CHARACTERS) for _ in range(rng.randrange(6))): random_value(rng, depth + 1)
            for _ in range(rng.randrange(5))}  # fmt: skip


def same(a, b) -> bool:
    """Equal, NaN included, and -0.0 told from 0.0 (json keeps the sign)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("seed", range(8))
def test_writes_what_json_writes_and_reads_it_back(seed):
    rng = random.Random(seed)
    for _ in range(400):
        value = random_value(rng)
        for sort_keys in (False, True):
            text = JSON_TEXT["dumps"](value, sort_keys=sort_keys)
            assert text == json.dumps(value, sort_keys=sort_keys)
            assert same(JSON_TEXT["loads"](text), json.loads(text))
        indented = json.dumps(value, indent=2, ensure_ascii=False)  # another writer's spacing, raw non-ASCII
        assert same(JSON_TEXT["loads"](indented), json.loads(indented))


def test_nan_and_tuples_are_written_as_json_writes_them():
    assert JSON_TEXT["dumps"]({"x": math.nan, "t": (1, "a")}) == json.dumps({"x": math.nan, "t": (1, "a")})
    assert math.isnan(JSON_TEXT["loads"]("NaN"))


@pytest.mark.parametrize("text", [
    "", " ", "{", "}", "[1,]", "[1 2]", '{"a" 1}', '{"a":1,}', "{1: 2}", '{"a":1}}', "01", "1.", ".5", "1e", "+1",
    "-", "--1", "tru", "nul", "True", '"abc', '"a\\x"', '"\\u12"', '"\\u12g4"', '"a\nb"', '"\x00"', '"\\', "\ufeff1",
    "1 2", "[]]", "nan", "inf", "-Inf", '"\\ud800\\u00zz"',
])  # fmt: skip
def test_refuses_what_json_refuses(text):
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        JSON_TEXT["loads"](text)


@pytest.mark.parametrize("text", [
    ' \t\n\r{ "a" : [ 1 , 2.5e3 , -0 , 1E-2 , true , null ] }\n', '"\\ud83d\\ude00"', '"\\ud83d"', '"\\ude00\\ud83d"',
    '"\\u00E9\\/"', "-Infinity", "[Infinity,NaN]", '{"a":1,"a":2}', "1e400", "-0.0", "123456789012345678901234567890",
])  # fmt: skip
def test_reads_what_json_reads(text):
    assert same(JSON_TEXT["loads"](text), json.loads(text))


def test_writes_keys_that_are_not_str_as_json_writes_them():
    value = {1: 2, None: 1, 1.5: True, False: "x"}
    assert JSON_TEXT["dumps"](value) == json.dumps(value)


@pytest.mark.parametrize("value", [b"x", {1.5}, object(), {(1, 2): 3}])
def test_refuses_to_write_what_json_refuses(value):
    with pytest.raises(TypeError):
        json.dumps(value)
    with pytest.raises(TypeError):
        JSON_TEXT["dumps"](value)


def test_a_value_that_holds_itself_is_refused_as_json_refuses_it():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular reference"):
        JSON_TEXT["dumps"](loop)


def _fresh_python(code: str) -> str:
    """What ``code`` prints, run by a fresh interpreter started as a host starts it (-I -S)."""
    source = remote.path("json_text").read_text()
    run = subprocess.run([sys.executable, "-I", "-S", "-c", code, source], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_imports_neither_json_nor_re_where_json_has_its_c_accelerator():
    imported = _fresh_python(
        "import sys; exec(compile(sys.argv[1], 'json_text', 'exec'), {}); "
        "print(sorted(m for m in ('json', 're', 'json.decoder') if m in sys.modules))")
    assert imported == "[]"


def test_takes_jsons_own_functions_where_there_is_no_c_accelerator():
    found = _fresh_python(
        "import sys; sys.modules['_json'] = None; namespace = {}; "
        "exec(compile(sys.argv[1], 'json_text', 'exec'), namespace); import json; "
        "print(namespace['dumps'] is json.dumps, namespace['loads'] is json.loads)")
    assert found == "True True"
