"""The python_env role's audit items: the AWQ env and the converter's env against their pins."""

from __future__ import annotations

from llamarack.audit import Item, Seen
from llamarack.facts import FactRead
from roles.llamacpp.rules import build_archs
from roles.settings import Settings

from .plan import awq_lock, awq_plan, converter_plan, unmet
from .reads import PythonEnvPackages, RequirementsFile

ENV_PACKAGES = ("torch", "transformers", "accelerate", "autoawq", "numpy")


def reads(settings: Settings, verify: bool = False) -> tuple[FactRead, ...]:
    layout = settings.layout
    return (FactRead.of(PythonEnvPackages, env=layout.env("awq")),
            FactRead.of(PythonEnvPackages, env=layout.env("convert")),
            FactRead.of(RequirementsFile, path=layout.converter_requirements))  # fmt: skip


def items(seen: Seen) -> dict[str, Item]:
    settings, fact, layout = seen.settings, seen.fact, seen.settings.layout
    archs = build_archs(settings, seen.facts) if settings.llamacpp.backend == "cuda" else ()
    awq_env = fact(PythonEnvPackages, env=layout.env("awq"))
    convert_env = fact(PythonEnvPackages, env=layout.env("convert"))
    lines = fact(RequirementsFile, path=layout.converter_requirements)
    python = convert_env.python_version if convert_env else settings.python_env.python_version
    convert = converter_plan(settings, layout.env("convert"), lines, python) if lines is not None else None
    awq = awq_plan(settings, layout.env("awq"), archs, locked=awq_lock(settings))
    return {"awq_env": env_item(awq_env, awq),
            "converter_env": env_item(convert_env, convert)}  # fmt: skip


def env_item(env, plan) -> Item:
    """An env's packages against its plan's pins (no plan: drift only when the env is missing)."""
    found = {"python": env.python_version, **{p: env.packages.get(p) for p in ENV_PACKAGES if p in env.packages}} \
        if env else None  # fmt: skip
    if plan is None:
        return Item(found, None, drift=env is None)
    problems = unmet(plan, env.packages, env.python_version) if env else ["no env"]
    return Item(found, {"require": list(plan.require), "unmet": problems}, drift=bool(problems))
