"""Facts about llamarack's Python environments."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from .value import FactValue

# Runs with the env's own interpreter: what importlib.metadata sees is exactly
# what `import` will load, and no pip process is started to find out.
_LIST_SCRIPT = (
    "import json, platform, importlib.metadata as m; "
    "print(json.dumps({'python': platform.python_version(), 'packages': "
    "{d.metadata['Name']: d.version for d in m.distributions() if d.metadata['Name']}}))"
)


def canonical(name: str) -> str:
    """PEP 503 name: ``Jinja2``, ``typing_extensions`` -> ``jinja2``, ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class PythonEnv(FactValue):
    python_version: str
    packages: dict
    """``{canonical name: installed version}``."""


class PythonEnvPackages(FactBase[Optional[PythonEnv]]):
    """
    Returns the Python version of the env at ``env`` and every distribution
    installed in it, or None when the env has no interpreter yet.

    .. code:: python

        PythonEnv(python_version="3.11.2",
                  packages={"torch": "2.13.0+cpu", "transformers": "4.44.2", ...})
    """

    def command(self, env: str) -> str:
        python = shlex.quote(f"{env}/bin/python")
        return f"if [ -x {python} ]; then {python} -c {shlex.quote(_LIST_SCRIPT)}; fi"

    def process(self, output) -> Optional[PythonEnv]:
        text = "\n".join(output).strip()
        if not text:
            return None
        try:
            data = json.loads(text)
            packages = {canonical(k): v for k, v in data["packages"].items()}
            return PythonEnv(data["python"], packages)
        except (ValueError, KeyError, AttributeError) as e:
            raise FactProcessError(f"unreadable env listing: {text[:200]!r}") from e


# Flattens a pip requirements file with its -r/-c includes. Options lines
# (--extra-index-url and the like) are dropped on purpose: every outside
# source is a llamarack setting, never a line in someone else's file.
_FLATTEN_SCRIPT = r"""
import os, sys
def read(path, seen):
    path = os.path.normpath(path)
    if path in seen:
        return
    seen.add(path)
    with open(path) as f:
        for raw in f:
            line = raw.split(" #")[0].strip()
            if not line or line.startswith("#"):
                continue
            for flag in ("-r ", "--requirement "):
                if line.startswith(flag):
                    yield from read(os.path.join(os.path.dirname(path), line[len(flag):].strip()), seen)
                    break
            else:
                if not line.startswith("-"):
                    yield line
for line in read(sys.argv[1], set()):
    print(line)
"""


class RequirementsFile(FactBase[Optional[tuple]]):
    """
    Returns the requirement lines of a pip requirements file, ``-r`` includes
    followed and option lines dropped; None when the file does not exist.

    .. code:: python

        ("numpy~=2.2.6", "sentencepiece>=0.1.98,<0.3.0", "transformers==4.57.6",
         "gguf>=0.1.0", "protobuf>=4.21.0,<5.0.0", "torch==2.11.0")
    """

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (
            f"if [ -f {quoted} ]; then python3 -c {shlex.quote(_FLATTEN_SCRIPT)} {quoted}; "
            "else echo 'llamarack: no such file'; fi"
        )

    def process(self, output) -> Optional[tuple]:
        if output == ["llamarack: no such file"]:
            return None
        return tuple(line.strip() for line in output if line.strip())
