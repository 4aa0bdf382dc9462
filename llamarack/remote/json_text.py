# Runs on the host (standard library only, imports nothing from llamarack; included by other host modules).
"""JSON text without the ``json`` module, for the host modules that every audit runs.

``import json`` imports ``re``, and ``re`` imports ``enum``, ``functools`` and
``collections``: 15 ms of a lab host's CPU (Debian 12's python3.11, started
with ``-I -S``), a third of what the audit's one python3 costs each host,
for a few hundred bytes of JSON read and written.

``dumps`` writes what ``json.dumps`` writes (its default separators, ASCII
only, keys sorted where asked) for what host modules print: dicts with str
keys, lists and tuples, str, int, float (NaN and Infinity as json writes
them), bool and None; anything else is a TypeError. ``loads`` reads what
``json.loads`` reads, to the same values, and raises ValueError where it
does. ``tests/unit/test_json_text.py`` holds both to the json module.

Not run alone: a host module names it on its ``# Includes:`` line, and
``llamarack.remote.source`` puts this source first; read together, the
shared python3 runs it once for every module that includes it
(``host_runs.py``). A module run as a file takes json's own functions.
"""

# json's escapes for the characters that have a short one; every other one outside
# printable ASCII is written \uXXXX (lower-case hex, a surrogate pair above U+FFFF).
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_READ_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_WORDS = (("true", True), ("false", False), ("null", None), ("NaN", float("nan")),
          ("Infinity", float("inf")), ("-Infinity", float("-inf")))  # fmt: skip
_WHITESPACE = " \t\n\r"
_DIGITS = "0123456789"


def _string_text(s: str) -> str:
    if s.isascii() and s.isprintable() and '"' not in s and "\\" not in s:
        return f'"{s}"'
    out = []
    for ch in s:
        if ch in _SHORT_ESCAPES:
            out.append(_SHORT_ESCAPES[ch])
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            n = ord(ch)
            if n > 0xFFFF:
                n -= 0x10000
                out.append("\\u%04x\\u%04x" % (0xD800 | (n >> 10), 0xDC00 | (n & 0x3FF)))
            else:
                out.append("\\u%04x" % n)
    return '"' + "".join(out) + '"'


def _float_text(x: float) -> str:
    if x != x:
        return "NaN"
    if x in (float("inf"), float("-inf")):
        return "Infinity" if x > 0 else "-Infinity"
    return float.__repr__(x)


def _parts(value, sort_keys: bool, out: list) -> None:
    if isinstance(value, str):
        out.append(_string_text(value))
    elif value is None or value is True or value is False:
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_float_text(value))
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(", ")
            _parts(item, sort_keys, out)
        out.append("]")
    elif isinstance(value, dict):
        items = sorted(value.items()) if sort_keys else value.items()
        out.append("{")
        for i, (key, item) in enumerate(items):
            if not isinstance(key, str):
                raise TypeError(f"a key of a dict written as JSON must be a str, not {type(key).__name__}")
            out.append(", " if i else "")
            out.append(_string_text(key))
            out.append(": ")
            _parts(item, sort_keys, out)
        out.append("}")
    else:
        raise TypeError(f"{type(value).__name__} is not written as JSON here")


def dumps(value, sort_keys: bool = False) -> str:
    """``json.dumps(value, sort_keys=sort_keys)``."""
    out: list = []
    _parts(value, sort_keys, out)
    return "".join(out)


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WHITESPACE:
        i += 1
    return i


def _read_string(text: str, i: int) -> tuple:
    """The string whose opening quote is just before ``i``, and the index after its closing one."""
    out = []
    while True:
        quote = text.find('"', i)
        if quote < 0:
            raise ValueError(f"unterminated string at {i - 1}")
        backslash = text.find("\\", i, quote)
        end = quote if backslash < 0 else backslash
        chunk = text[i:end]
        if chunk and not chunk.isprintable() and min(chunk) < " ":
            raise ValueError(f"control character in a string at {i + chunk.index(min(chunk))}")
        out.append(chunk)
        if backslash < 0:
            return "".join(out), quote + 1
        kind = text[end + 1:end + 2]
        if kind in _READ_ESCAPES:
            out.append(_READ_ESCAPES[kind])
            i = end + 2
            continue
        if kind != "u":
            raise ValueError(f"invalid escape at {end}")
        n = _hex4(text, end + 2)
        i = end + 6
        if 0xD800 <= n <= 0xDBFF and text[i:i + 2] == "\\u":  # a surrogate pair is one character
            low = _hex4(text, i + 2)
            if 0xDC00 <= low <= 0xDFFF:
                n = 0x10000 + ((n - 0xD800) << 10) + (low - 0xDC00)
                i += 6
        out.append(chr(n))


def _hex4(text: str, i: int) -> int:
    digits = text[i:i + 4]
    if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
        raise ValueError(f"invalid \\u escape at {i - 2}")
    return int(digits, 16)


def _read_number(text: str, i: int) -> tuple:
    """The number at ``i`` (JSON's grammar: an int, else a float), and the index after it."""
    start = i
    if text[i:i + 1] == "-":
        i += 1
    if text[i:i + 1] == "0":
        i += 1
    elif text[i:i + 1] and text[i] in "123456789":
        while i < len(text) and text[i] in _DIGITS:
            i += 1
    else:
        raise ValueError(f"expected a value at {start}")
    whole = i
    if text[i:i + 1] == "." and text[i + 1:i + 2] and text[i + 1] in _DIGITS:
        i += 1
        while i < len(text) and text[i] in _DIGITS:
            i += 1
    if text[i:i + 1] in ("e", "E"):
        j = i + 1
        if text[j:j + 1] in ("+", "-"):
            j += 1
        if text[j:j + 1] and text[j] in _DIGITS:
            while j < len(text) and text[j] in _DIGITS:
                j += 1
            i = j
    return (int(text[start:i]) if i == whole else float(text[start:i])), i


def _after_item(text: str, i: int, close: str) -> tuple:
    """After an object's or an array's item: (True, past ``close``) where it closes, else
    (False, the next item's start) past its comma."""
    i = _skip_space(text, i)
    if text[i:i + 1] == close:
        return True, i + 1
    if text[i:i + 1] != ",":
        raise ValueError(f"expected ',' or {close!r} at {i}")
    return False, _skip_space(text, i + 1)


def _read_value(text: str, i: int) -> tuple:
    """The value at ``i`` (no space before it), and the index after it."""
    ch = text[i:i + 1]
    if ch == '"':
        return _read_string(text, i + 1)
    if ch == "{":
        found: dict = {}
        i = _skip_space(text, i + 1)
        if text[i:i + 1] == "}":
            return found, i + 1
        while True:
            if text[i:i + 1] != '"':
                raise ValueError(f"expected a key at {i}")
            key, i = _read_string(text, i + 1)
            i = _skip_space(text, i)
            if text[i:i + 1] != ":":
                raise ValueError(f"expected ':' at {i}")
            found[key], i = _read_value(text, _skip_space(text, i + 1))
            closed, i = _after_item(text, i, "}")
            if closed:
                return found, i
    if ch == "[":
        items: list = []
        i = _skip_space(text, i + 1)
        if text[i:i + 1] == "]":
            return items, i + 1
        while True:
            item, i = _read_value(text, i)
            items.append(item)
            closed, i = _after_item(text, i, "]")
            if closed:
                return items, i
    for word, value in _WORDS:
        if text.startswith(word, i):
            return value, i + len(word)
    return _read_number(text, i)


def loads(text: str):
    """``json.loads(text)`` for a str."""
    value, end = _read_value(text, _skip_space(text, 0))
    if _skip_space(text, end) != len(text):
        raise ValueError(f"extra data at {end}")
    return value
