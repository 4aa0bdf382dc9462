"""The settings machinery: one host's data becomes one frozen, checked object of sections.

A setting is a field of a section (a frozen dataclass of ``settings_fields.setting``
fields); its host-data key is ``<section prefix>_<field name>`` (``server_port``). ``load``
rejects bad data before any host is touched, every problem of a host at once, naming the
host, the key, what was given and what is allowed (docs/ARCHITECTURE.md, "Every role takes
the whole Settings").

The sections stay plain dataclasses rather than pydantic models: pydantic is
pyinfra's own dependency, not ours, and its errors would have to be rewritten
into what this loader already reports ("did you mean", how to write a value).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Optional

from .errors import SettingsError
from .settings_fields import number_range, out_of_range


def sections(settings_type: type) -> dict:
    """Each section of a host's settings: its name there and its class, in the order of the
    fields (every field but ``host`` and ``groups``)."""
    return {name: tp for name, tp in typing.get_type_hints(settings_type).items() if name not in ("host", "groups")}


@dataclass(frozen=True)
class SettingInfo:
    """One setting as documentation and checks see it."""

    key: str
    role: type
    name: str
    type: Any
    default: Any
    doc: str
    check: Optional[Callable[[Any], Optional[str]]]
    choices: Optional[tuple]
    between: Optional[tuple] = None  # a number's (lowest, highest) value; every int and float setting has one
    formerly: Optional[tuple] = None  # (an earlier llamarack's value, the value it is now) pairs


@functools.cache
def all_settings(settings_type: type) -> tuple[SettingInfo, ...]:
    """Every setting of every section, in declaration order. Made once per process: the
    sections' type hints cannot change, and each host's settings are loaded from it (3 ms a host)."""
    infos = []
    for role in sections(settings_type).values():
        hints = typing.get_type_hints(role)
        for f in dataclasses.fields(role):
            tp = hints[f.name]
            literal = typing.get_args(tp) if typing.get_origin(tp) is Literal else None
            info = SettingInfo(key=f"{role.prefix}_{f.name}", role=role, name=f.name, type=tp, default=f.default,
                               **{**f.metadata, "choices": f.metadata["choices"] or literal})
            if (_unwrap_optional(info.type)[0] in (int, float)) != (info.between is not None):
                raise TypeError(f"{info.key}: every int or float setting, and only those, has between=(low, high)")
            infos.append(info)
    return tuple(infos)


def describe_type(info: SettingInfo) -> str:
    """A short human form of a setting's type, for errors and docs."""
    if info.choices:
        former = ", ".join(f"{old!r} (now {new!r})" for old, new in info.formerly or ())
        return "one of " + ", ".join(repr(c) for c in info.choices) + (f"; still taken: {former}" if former else "")
    tp, optional = _unwrap_optional(info.type)
    if typing.get_origin(tp) is tuple:
        text = f"a list of {typing.get_args(tp)[0].__name__}"
    elif info.between:
        text = number_range(info.between, tp is int)
    else:
        text = {str: "a string", int: "an integer", bool: "true or false", float: "a number"}[tp]
    return text + (" or None" if optional else "")


def _unwrap_optional(tp):
    if typing.get_origin(tp) is typing.Union:
        return next(a for a in typing.get_args(tp) if a is not type(None)), True
    return tp, False


# The longest text and the longest list any setting takes (a path, a URL or a pattern list
# is far shorter; each has its own bound too).
MAX_TEXT_CHARS = 4096
MAX_LIST_ITEMS = 256


def _text_problem(value: str) -> Optional[str]:
    # No setting is a multi-line text: a newline or other control character in one is an
    # injection (a unit's next line, a shell's next command), never a value.
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        return "a single line of text (no newline, tab or other control character)"
    if len(value) > MAX_TEXT_CHARS:
        return f"a text of at most {MAX_TEXT_CHARS} characters (given {len(value)})"
    return None


def shown(value: Any) -> str:
    """A value as an error shows it: its repr, cut after 200 characters (a hostile value
    of 100,000 characters is named, not printed)."""
    text = repr(value)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters in all)"


def _current(info: SettingInfo, value: Any) -> Any:
    """``value``, or what it is now where an earlier llamarack took it (``setting(formerly=)``):
    of the same type and equal, so that 1 never stands for True."""
    return next((new for old, new in info.formerly or () if type(value) is type(old) and value == old), value)


def _coerce(info: SettingInfo, value: Any) -> tuple[Any, Optional[str]]:
    """Check one value against its setting; return (value, problem or None)."""
    tp, optional = _unwrap_optional(info.type)
    value = _current(info, value)
    if value is None:
        return value, None if optional else describe_type(info)
    if isinstance(value, (list, tuple)) and len(value) > MAX_LIST_ITEMS:
        return value, f"a list of at most {MAX_LIST_ITEMS} items (given {len(value)})"
    texts = value if isinstance(value, (list, tuple)) else (value,)
    problem = next(filter(None, (_text_problem(text) for text in texts if isinstance(text, str))), None)
    if problem:
        return value, problem
    if info.choices is not None:
        return value, None if value in info.choices else describe_type(info)
    if typing.get_origin(tp) is tuple:
        if isinstance(value, str):
            # From the command line: --data llamarack_roles=server,model
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            return value, describe_type(info)
        problem = next(filter(None, map(info.check, value)), None) if info.check else None
        return (value, problem) if problem else (tuple(value), None)
    return value, _scalar_problem(info, tp, value)


# The Python types a value of each scalar setting type may have.
_ACCEPTED = {bool: bool, int: int, float: (int, float), str: str}


def _scalar_problem(info: SettingInfo, tp: type, value: Any) -> Optional[str]:
    """What is wrong with one bool, int, float or str value, or None."""
    # bool is an int in Python: never let True stand for 1 or 1 for True.
    if not isinstance(value, _ACCEPTED[tp]) or (isinstance(value, bool) and tp is not bool):
        if tp is str and isinstance(value, (int, float)):
            # pyinfra's --data turns 13.0 into a number, and 11.10 would become 11.1.
            return (f"a string; quote it: {info.key} = '{value}' in Python, "
                    f"--data '{info.key}=\"{value}\"' on the command line")  # fmt: skip
        return describe_type(info)
    problem = out_of_range(value, info.between, tp is int) if info.between else None
    return problem or (info.check(value) if info.check else None)


def setting_values(s: Any):
    """(info, value) of every setting of the host's settings ``s``."""
    names = {role: name for name, role in sections(type(s)).items()}
    for info in all_settings(type(s)):
        yield info, getattr(getattr(s, names[info.role]), info.name)


_WARNED: set = set()


def unknown_keys(keys, known) -> list[tuple[str, str]]:
    """(key, the setting it looks like) for each host data key that no role knows but
    that is close to a setting's name: ``server-port``, ``llama_root``. Other keys
    (pyinfra's ``ssh_user``, the user's own) are not compared with anything."""
    found = []
    for key in keys:
        normal = key.strip().lower().replace("-", "_")
        close = [normal] if normal in known else difflib.get_close_matches(normal, known, n=1, cutoff=0.8)
        if close:
            found.append((key, close[0]))
    return found


def _warn_unknown(host_name: str, keys, known) -> None:
    """Warn once per host and key about data that looks like a setting but is none (it is ignored)."""
    for key, like in unknown_keys(keys, known):
        if (host_name, key) not in _WARNED:
            _WARNED.add((host_name, key))
            logging.getLogger("pyinfra").warning(
                f"{host_name}: {key!r} is no llamarack setting and is ignored; did you mean {like!r}?")


def load(settings_type: type, host_name: str, data: Mapping[str, Any], groups: tuple = ()) -> Any:
    """Build one host's settings of ``settings_type`` from its data (inventory + group data);
    ``groups``: its inventory groups. A key without a section's prefix is pyinfra's or the
    user's, ignored (a warning when it looks like a setting); one with a prefix that names no
    setting is an error. Each section's ``problems()`` and those of the whole (``problems()``
    of ``settings_type``) are refused with the rest."""
    infos = all_settings(settings_type)
    by_key = {info.key: info for info in infos}
    parts = sections(settings_type)
    prefixes = tuple(f"{role.prefix}_" for role in parts.values())
    problems: list[str] = []

    for key in data:
        if not isinstance(key, str):
            problems.append(f"key {key!r}: a host data key is a string (a setting name such as 'server_port')")
        elif key.startswith(prefixes) and key not in by_key:
            close = difflib.get_close_matches(key, by_key, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            problems.append(f"unknown setting {key!r}{hint}")
    _warn_unknown(host_name, [k for k in data if isinstance(k, str) and not k.startswith(prefixes)], by_key)

    values: dict[type, dict[str, Any]] = {role: {} for role in parts.values()}
    for info in (info for info in infos if info.key in data):
        value, problem = _coerce(info, data[info.key])
        if problem:
            problems.append(f"{info.key}: given {shown(data[info.key])}; allowed: {problem}")
        else:
            values[info.role][info.name] = value

    made = {name: role(**values[role]) for name, role in parts.items()}
    settings = settings_type(host=host_name, groups=tuple(groups), **made)
    problems += [problem for section in made.values() for problem in section.problems()]
    problems += settings.problems()
    if problems:
        raise SettingsError(host_name, problems)
    return settings
