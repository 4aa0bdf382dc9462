"""The roles' templates: each role keeps its own (``roles/<role>/templates/``), and an
operator's folder of overrides (the project's ``templates/``) replaces one of the same name."""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2


@functools.lru_cache(maxsize=None)
def _environment(dirs: tuple) -> jinja2.Environment:
    """One environment per template search path, kept: jinja2 compiles a template once per
    environment (4 to 5 ms here), and again only when its file changes (``auto_reload``),
    where a new environment for each host compiled it for each host of an audit or deploy."""
    return jinja2.Environment(loader=jinja2.FileSystemLoader(list(dirs)), keep_trailing_newline=True,
                              undefined=jinja2.StrictUndefined)  # fmt: skip


def template(name: str, own: Path, overrides: tuple = ()) -> jinja2.Template:
    """Template ``name``: from the first folder of ``overrides`` that holds it, else the role's ``own``."""
    dirs = tuple(str(d) for d in overrides if Path(d).is_dir()) + (str(own),)
    return _environment(dirs).get_template(name)
