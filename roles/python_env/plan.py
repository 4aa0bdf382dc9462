"""Plans for llamarack's Python environments: what is pinned, from where, in which order.

Pure functions of settings (and, for the converter, the requirement lines
read from the llama.cpp tree); the operations in ``llamarack.operations``
turn a plan into pip commands and ``llamarack/pyenv_check.py`` checks it on
the host. Why the AWQ env is installed in three steps: autoawq 0.2.7
declares ``torch>=2.5.1`` and intel-extension-for-pytorch, which the
reference torch 2.1.2 cannot meet, and torch < 2.3 breaks with numpy 2
(FIELD-NOTES, "The reference pins do not install together as written").
So torch goes in first from its own index, the rest with torch and numpy
held by constraints, and autoawq last with ``--no-deps`` plus the
requirements it really imports (``python_env_autoawq_requirements``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Optional

from packaging.requirements import Requirement

from llamarack.roles.python_env.reads import canonical
from llamarack.settings import Settings

AWQ_IMPORTS = ("import torch, transformers, accelerate", "from awq import AutoAWQForCausalLM")
# Distribution name -> import statement, for the converter env's import test.
CONVERTER_IMPORTS = {
    "torch": "import torch",
    "transformers": "import transformers",
    "numpy": "import numpy",
    "sentencepiece": "import sentencepiece",
    "gguf": "import gguf",
    "protobuf": "import google.protobuf",
}


@dataclass(frozen=True)
class PipStep:
    requirements: tuple
    index_url: str
    no_deps: bool = False


@dataclass(frozen=True)
class EnvPlan:
    env: str
    """Env prefix: ``<env>/bin/python`` is its interpreter."""
    steps: tuple
    """PipSteps, installed in this order."""
    constraints: tuple = ()
    """Lines of the constraints file every step is installed with (torch, numpy)."""
    imports: tuple = ()
    """Statements the verify step runs."""
    torch_cuda: Optional[str] = None
    """CUDA version torch must be built for (GPU hosts), else None."""
    gpu_archs: tuple = ()
    """``sm_XX`` torch must carry kernels for (the host's GPUs)."""

    @property
    def python(self) -> str:
        return f"{self.env}/bin/python"

    @property
    def require(self) -> tuple:
        """Every requirement the env must satisfy once installed."""
        return tuple(r for step in self.steps for r in step.requirements)

    def to_json(self) -> str:
        data = asdict(self)
        data["require"] = list(self.require)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))


def awq_plan(settings: Settings, env: str, gpu_archs: tuple = ()) -> EnvPlan:
    """The AWQ quantization env: the reference pins, installed the deliberate way."""
    s = settings.python_env
    torch = f"torch=={s.torch_version}"
    cuda = settings.llamacpp.backend == "cuda"
    return EnvPlan(
        env=env,
        steps=(
            PipStep((torch,), s.torch_index_url),
            PipStep(
                (f"transformers=={s.transformers_version}", f"accelerate=={s.accelerate_version}",
                 *s.autoawq_requirements),
                s.index_url,
            ),  # fmt: skip
            PipStep((f"autoawq=={s.autoawq_version}",), s.index_url, no_deps=True),
        ),
        constraints=(torch, s.numpy_requirement),
        imports=AWQ_IMPORTS,
        torch_cuda=settings.toolchain.cuda_version if cuda else None,
        gpu_archs=tuple(f"sm_{a}" for a in gpu_archs) if cuda else (),
    )


def converter_plan(settings: Settings, env: str, lines: tuple, python_version: str) -> EnvPlan:
    """The env for llama.cpp's convert_hf_to_gguf.py, from its requirements file.

    ``python_env_converter_overrides`` replace the file's lines of the same
    package; lines whose marker is false for the env's Python are dropped;
    torch comes from ``python_env_converter_torch_index_url`` and is held
    by a constraint while the rest installs.
    """
    s = settings.python_env
    overrides = {canonical(Requirement(o).name): o for o in s.converter_overrides}
    wanted: dict[str, str] = {}
    for line in lines:
        req = Requirement(line)
        if req.marker and not req.marker.evaluate(_marker_env(python_version)):
            continue
        wanted[canonical(req.name)] = line
    wanted.update(overrides)
    torch = tuple(v for k, v in wanted.items() if k == "torch")
    rest = tuple(v for k, v in wanted.items() if k != "torch")
    steps = []
    if torch:
        steps.append(PipStep(torch, s.converter_torch_index_url))
    steps.append(PipStep(rest, s.index_url))
    return EnvPlan(
        env=env,
        steps=tuple(steps),
        constraints=torch,
        imports=tuple(CONVERTER_IMPORTS[k] for k in wanted if k in CONVERTER_IMPORTS),
    )


def _marker_env(python_version: str) -> dict:
    major_minor = ".".join(python_version.split(".")[:2])
    return {"python_version": major_minor, "python_full_version": python_version, "extra": ""}


def unmet(plan: EnvPlan, packages: dict, python_version: str) -> list[str]:
    """What the installed ``packages`` (``{canonical name: version}``) lack; [] when converged."""
    problems = []
    for text in plan.require:
        req = Requirement(text)
        have = packages.get(canonical(req.name))
        if have is None:
            problems.append(f"{req.name} not installed")
        elif not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} {have} installed, wanted {req.specifier}")
    for text in plan.constraints:
        req = Requirement(text)
        have = packages.get(canonical(req.name))
        if have is not None and not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} {have} installed, held at {req.specifier}")
    return list(dict.fromkeys(problems))
