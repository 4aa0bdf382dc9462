"""Plans for llamarack's Python environments: what is pinned, from where, in which order.

Pure functions of settings (and, for the converter, the requirement lines read from the
llama.cpp tree); ``operations.pip_pins`` runs a plan with ``files/pyenv_check.py`` on the
host. The AWQ env goes in three steps (docs/deploy.md, "The roles", says why): torch from
its own index, the rest with torch and numpy held by constraints, autoawq last with
``--no-deps`` plus the requirements it really imports (``python_env_autoawq_requirements``).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from packaging.requirements import InvalidRequirement, Requirement

from roles.python_env.reads import canonical
from roles.settings import Settings

AWQ_IMPORTS = ("import torch, transformers, accelerate", "from awq import AutoAWQForCausalLM")
# With model_route = 'awq' the env loads the model's tokenizer too: a SentencePiece one
# (Llama 2 and its kin) needs these to be read (llama.cpp's converter's own ranges).
AWQ_TOKENIZER_REQUIREMENTS = ("sentencepiece>=0.1.98,<0.3.0", "protobuf>=4.21.0,<5.0.0")
# Distribution name -> import statement, for the converter env's import test.
CONVERTER_IMPORTS = {"torch": "import torch", "transformers": "import transformers", "numpy": "import numpy",
                     "sentencepiece": "import sentencepiece", "gguf": "import gguf",
                     "protobuf": "import google.protobuf"}


@dataclass(frozen=True)
class PipStep:
    requirements: tuple
    index_url: str
    no_deps: bool = False
    extra_index_urls: tuple = ()
    hashes: tuple = ()
    """Per requirement, the hashes (``sha256:...``) pip must find (``--require-hashes``);
    () installs without hash checking."""

    @property
    def index_urls(self) -> tuple:
        return (self.index_url, *self.extra_index_urls)


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

    @property
    def indexes(self) -> tuple:
        """Every index URL the steps name, once each, in order."""
        return tuple(dict.fromkeys(url for step in self.steps for url in step.index_urls))

    def to_json(self) -> str:
        """The plan as ``pyenv_check`` takes it on its command line: each step names its
        indexes by their place in ``indexes`` (a URL may carry a password or a token, and
        a command line is seen by every user of the host, and at ``-vvv``)."""
        data = asdict(self)
        for step, shown in zip(self.steps, data["steps"]):
            del shown["index_url"], shown["extra_index_urls"]
            shown["index"] = [self.indexes.index(url) for url in step.index_urls]
        data["require"] = list(self.require)
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def indexes_json(self) -> str:
        """The index URLs, for the file ``pyenv_check`` reads them from (uploaded, mode 600)."""
        return json.dumps(list(self.indexes))


def awq_plan(settings: Settings, env: str, gpu_archs: tuple = (), locked: Optional[tuple] = None) -> EnvPlan:
    """The AWQ quantization env: the reference pins, installed the deliberate way; with
    ``locked`` (``locked_requirements``: ``python_env_awq_lock_file``), exactly the lock's
    packages, hash-checked, in one step without dependencies (the lock is the resolution)."""
    s = settings.python_env
    torch = f"torch=={s.torch_version}"
    cuda = settings.llamacpp.backend == "cuda"
    extra = tuple(u for u in (s.torch_index_url,) if u != s.index_url)
    steps = (
        PipStep((torch,), s.torch_index_url),
        PipStep((f"transformers=={s.transformers_version}", f"accelerate=={s.accelerate_version}",
                 *s.autoawq_requirements, *(AWQ_TOKENIZER_REQUIREMENTS if settings.model.route == "awq" else ())),
                s.index_url),  # fmt: skip
        PipStep((f"autoawq=={s.autoawq_version}",), s.index_url, no_deps=True),
    ) if locked is None else (
        PipStep(tuple(r for r, _ in locked), s.index_url, no_deps=True, extra_index_urls=extra,
                hashes=tuple(h for _, h in locked)),
    )  # fmt: skip
    return EnvPlan(env=env, steps=steps, constraints=(torch, s.numpy_requirement), imports=AWQ_IMPORTS,
                   torch_cuda=settings.toolchain.cuda_version if cuda else None,
                   gpu_archs=tuple(f"sm_{a}" for a in gpu_archs) if cuda else ())


# A hash of a lock line (pip's --hash option, either spelling) and the values pip accepts.
LOCK_HASH = re.compile(r"--hash[= ](\S+)")
LOCK_HASH_VALUE = re.compile(r"(sha256|sha384|sha512):[0-9a-f]+")


class LockError(ValueError):
    """A lock file (``python_env_awq_lock_file``) llamarack cannot install from."""


def _lock_lines(text: str) -> list[str]:
    """The logical lines of a requirements file: continuations joined, comments dropped."""
    joined = re.sub(r"\\\r?\n", " ", text)
    lines = (re.sub(r"(^|\s)#.*", "", line).strip() for line in joined.splitlines())
    return [line for line in lines if line]


def _lock_line_problem(requirement: str, hashes: tuple) -> Optional[str]:
    """What keeps one lock line (its ``--hash`` options taken out) from being installed
    hash-checked, or None."""
    if requirement.startswith("-") or re.search(r"\s-", requirement):
        return ("an option line: every index is a setting (python_env_index_url, "
                "python_env_torch_index_url), never a line of the lock")  # fmt: skip
    try:
        req = Requirement(requirement)
    except InvalidRequirement:
        return "not a pip requirement"
    specs = list(req.specifier)
    if req.url or len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
        return "not pinned to one version from the index (name==version)"
    if not hashes:
        return "no --hash (pip-compile --generate-hashes writes them)"
    bad = [h for h in hashes if not LOCK_HASH_VALUE.fullmatch(h)]
    return f"hash {bad[0]!r} is not sha256:, sha384: or sha512: and hex digits" if bad else None


def locked_requirements(settings: Settings, text: str, source: str) -> tuple:
    """Each package of the AWQ env's lock file (``python_env_awq_lock_file``: what
    ``pip-compile --generate-hashes`` writes) as ``(requirement, hashes)``, lines whose
    marker is false for the env's Python left out. Raises ``LockError`` naming every line
    that is not ``name==version`` with hashes, and every pin of the settings (torch,
    transformers, accelerate, autoawq and what it imports, numpy's constraint) the
    lock does not meet: the env must still be the reference set."""
    s = settings.python_env
    entries, problems = [], []
    for line in _lock_lines(text):
        hashes = tuple(LOCK_HASH.findall(line))
        requirement = LOCK_HASH.sub("", line).strip()
        problem = _lock_line_problem(requirement, hashes)
        if problem:
            problems.append(f"{requirement or line!r}: {problem}")
            continue
        if _applies(Requirement(requirement), s.python_version):
            entries.append((requirement, hashes))
    if not entries:
        problems.append("no requirement that applies to the env's Python")
    locked = {canonical(Requirement(r).name): next(iter(Requirement(r).specifier)).version for r, _ in entries}
    pins = (f"torch=={s.torch_version}", f"transformers=={s.transformers_version}",
            f"accelerate=={s.accelerate_version}", f"autoawq=={s.autoawq_version}", *s.autoawq_requirements)
    for text_pin in (*pins, s.numpy_requirement) if entries else ():
        pin = Requirement(text_pin)
        have = locked.get(canonical(pin.name))
        if have is None and text_pin in pins:
            problems.append(f"no {pin.name}: the settings pin {text_pin}")
        elif have is not None and not pin.specifier.contains(have, prereleases=True):
            problems.append(f"{pin.name}=={have}: the settings want {text_pin}")
    if problems:
        raise LockError(f"python_env_awq_lock_file: {source}: " + "; ".join(problems)
                        + ". Fix: write the lock with pip-compile --generate-hashes from the settings' pins "
                        "(every package name==version with its --hash), or unset python_env_awq_lock_file")
    return tuple(entries)


def awq_lock(settings: Settings) -> Optional[tuple]:
    """The AWQ env's lock (``python_env_awq_lock_file``, read on the control machine) as
    ``locked_requirements`` gives it, or None when none is set; raises ``LockError``."""
    path = settings.python_env.awq_lock_file
    if not path:
        return None
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise LockError(f"python_env_awq_lock_file: cannot read {path}: {e.strerror}") from None
    return locked_requirements(settings, text, path)


def converter_plan(settings: Settings, env: str, lines: tuple, python_version: str) -> EnvPlan:
    """The env for llama.cpp's convert_hf_to_gguf.py, from its requirements file.

    ``python_env_converter_overrides`` replace the file's lines of the same
    package; lines whose marker is false for the env's Python are dropped;
    torch comes from ``python_env_converter_torch_index_url`` and is held
    by a constraint while the rest installs."""
    s = settings.python_env
    wanted: dict[str, str] = {}
    for line in lines:
        req = Requirement(line)
        if _applies(req, python_version):
            wanted[canonical(req.name)] = line
    wanted.update({canonical(Requirement(o).name): o for o in s.converter_overrides})
    torch = tuple(v for k, v in wanted.items() if k == "torch")
    rest = tuple(v for k, v in wanted.items() if k != "torch")
    steps = ((PipStep(torch, s.converter_torch_index_url),) if torch else ()) + (PipStep(rest, s.index_url),)
    return EnvPlan(env=env, steps=steps, constraints=torch,
                   imports=tuple(CONVERTER_IMPORTS[k] for k in wanted if k in CONVERTER_IMPORTS))


def _applies(req: Requirement, python_version: str) -> bool:
    """The requirement has no marker, or one that is true for the env's Python."""
    major_minor = ".".join(python_version.split(".")[:2])
    env = {"python_version": major_minor, "python_full_version": python_version, "extra": ""}
    return not req.marker or req.marker.evaluate(env)


def unmet(plan: EnvPlan, packages: dict, python_version: str) -> list[str]:
    """What the installed ``packages`` (``{canonical name: version}``) lack; [] when converged."""
    problems = []
    for texts, verb in ((plan.require, "wanted"), (plan.constraints, "held at")):
        for text in texts:
            req = Requirement(text)
            have = packages.get(canonical(req.name))
            if have is None and verb == "wanted":
                problems.append(f"{req.name} not installed")
            elif have is not None and not req.specifier.contains(have, prereleases=True):
                problems.append(f"{req.name} {have} installed, {verb} {req.specifier}")
    return list(dict.fromkeys(problems))
