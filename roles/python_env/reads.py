"""Facts about llamarack's Python environments."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError

from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File
from llamarack import remote
from llamarack.facts.value import FactValue
from llamarack.facts import FactRead


def canonical(name: str) -> str:
    """PEP 503 name: ``Jinja2``, ``typing_extensions`` -> ``jinja2``, ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class PythonEnv(FactValue):
    python_version: str
    packages: dict
    """``{canonical name: installed version}``."""


class PythonEnvPackages(FactBase[Optional[PythonEnv]]):
    """Returns the Python version of the env at ``env`` and every distribution
    installed in it, or None when the env has no interpreter yet."""

    def host_run(self, env: str) -> tuple:
        return ("env_packages", env)

    def command(self, env: str) -> str:
        return remote.command(*self.host_run(env))

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


class RequirementsFile(FactBase[Optional[tuple]]):
    """Returns the requirement lines of a pip requirements file, ``-r`` includes
    followed and option lines dropped; None when the file does not exist."""

    def host_run(self, path: str) -> tuple:
        return ("requirements_flatten", path)

    def command(self, path: str) -> str:
        return remote.command(*self.host_run(path))

    def process(self, output) -> Optional[tuple]:
        if output == ["llamarack: no such file"]:
            return None
        return tuple(line.strip() for line in output if line.strip())


def reads(settings) -> tuple:
    """What the python_env role reads on a converged host (the AWQ env, and the converter's
    when the model role converts): its part of preflight's one read."""
    layout = settings.layout
    found: list = []
    for role, env in (("python_env", "awq"), ("converter_env", "convert")):
        if settings.general.runs(role):
            found.append(FactRead.of(PythonEnvPackages, env=layout.env(env)))
            if settings.python_env.backend == "venv":
                found.append(FactRead.of(DebPackages))
            else:
                found += [FactRead.of(File, path=f"{layout.conda}/bin/conda"),
                          FactRead.of(File, path=f"{layout.env(env)}/bin/python")]  # fmt: skip
    if settings.general.runs("converter_env"):
        found.append(FactRead.of(RequirementsFile, path=layout.converter_requirements))
    return tuple(found)
