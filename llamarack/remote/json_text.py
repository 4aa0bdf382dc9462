# Runs on the host (standard library only, imports nothing from llamarack; included by other host modules).
"""JSON text through the json module's own C scanner and encoder, without importing ``json``.

``import json`` imports ``re`` (the patterns of json.decoder and json.scanner), and
``re`` imports ``enum``, ``functools`` and ``collections``: 15 ms of a lab host's
CPU (Debian 12's python3.11, started with ``-I -S``), a third of what the audit's
one python3 costs each host, for a few hundred bytes of JSON read and written.
The scanner and the encoder that ``json`` runs are ``_json``'s, which imports
nothing (0.6 ms to load there). ``loads`` and ``dumps`` below call them as
``json.loads`` and ``json.dumps`` do with their default settings, so they read
and write the same text, and refuse the same. ``tests/unit/test_json_text.py``
holds both to the json module. An interpreter without ``_json``, or whose
``_json`` is called another way, takes json's own functions.

Not run alone: a host module names it on its ``# Includes:`` line, and
``llamarack.remote.source`` puts this source first; read together, the
shared python3 runs it once for every module that includes it
(``host_runs.py``). A module run as a file takes json's own functions.
"""

class _Decoding:
    """What ``_json.make_scanner`` reads of a ``json.JSONDecoder()``: its default settings."""

    strict = True
    object_hook = object_pairs_hook = None
    parse_float, parse_int = float, int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


def _refuse(value):
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _encoders() -> tuple:
    """json.dumps's C encoder, unsorted and sorted: (markers, default, encoder, indent,
    key_separator, item_separator, sort_keys, skipkeys, allow_nan), as json.encoder makes it."""
    return tuple(_json.make_encoder({}, _refuse, _json.encode_basestring_ascii, None, ": ", ", ", sort, False, True)
                 for sort in (False, True))  # fmt: skip


try:
    import _json

    _scan, _ENCODE = _json.make_scanner(_Decoding()), _encoders()
    _scan("0", 0), _ENCODE[0](0, 0)  # called as json calls them
except (ImportError, AttributeError, TypeError):  # no C accelerator (PyPy), or another one: json's own
    from json import dumps, loads
else:
    _SPACE = " \t\n\r"  # json's whitespace

    def dumps(value, sort_keys: bool = False) -> str:
        """``json.dumps(value, sort_keys=sort_keys)``."""
        if isinstance(value, str):
            return _json.encode_basestring_ascii(value)
        return "".join(_ENCODE[bool(sort_keys)](value, 0))

    def loads(text: str):
        """``json.loads(text)`` for a str."""
        start = len(text) - len(text.lstrip(_SPACE))
        try:
            value, end = _scan(text, start)
        except StopIteration as e:
            raise ValueError(f"Expecting value: char {e.value}") from None
        if text[end:].strip(_SPACE):
            raise ValueError(f"Extra data: char {end}")
        return value
