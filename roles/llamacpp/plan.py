"""The llama.cpp build plan: every input that shapes the binaries, and its stamp.

A build is identified by a stamp, a hash of its inputs (``BUILD_INPUTS`` of
``files/build_seal.py``); how it is proven has its own id (``BuildPlan.proof_id``):
docs/ARCHITECTURE.md ("A build's stamp is what goes into it") says why. The driver version
is deliberately not an input: a driver upgrade alone needs a restart of the server, not a
rebuild (unless it came with a new toolkit, which is an input).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Optional

from llamarack import remote
from roles.preflight.facts import HostFacts
from roles.llamacpp.rules import build_archs
from roles.llamacpp.files.build_seal import inputs_stamp
from roles.settings import Settings

from ..toolchain.plan import plan_toolchain
from .settings import X86_FEATURES

# What we ship. llama-cli is cheap once ggml is built and handy for checks.
TARGETS = ("llama-server", "llama-quantize", "llama-bench", "llama-cli")
# Built beside them with model_quality: it measures a new model artifact's quality
# (roles/model/operations.py). A target of its own, so a rack without it keeps its builds.
QUALITY_TARGET = "llama-perplexity"

# Bump when the build steps change in a way that makes old builds unlike new ones.
BUILD_RECIPE = 2

# The smoke run's script: part of the proof's id, not of the build's stamp, so a
# new script re-proves every build in place and rebuilds none.
PROOF_SCRIPT_SHA256 = hashlib.sha256(remote.source("llamacpp_proof").encode()).hexdigest()

# Rebuilds the smoke run falls back to when the build as asked cannot compute
# (llamacpp_cpu_fallback): fewer x86 extensions each time. x86-64-v3 is what
# ggml builds without GGML_NATIVE (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX).
PORTABLE_CPU_VARIANTS = (
    ("x86-64-v3", ("sse42", "avx", "avx2", "bmi2", "fma", "f16c")),
    ("x86-64-v2", ("sse42",)),
)


@dataclass(frozen=True)
class BuildPlan:
    stamp: str
    commit: str
    backend: str
    cuda_archs: tuple
    cuda_home: Optional[str]
    cuda_version: Optional[str]
    host_compiler: Optional[str]
    cmake_args: tuple
    targets: tuple
    proof: dict = field(default_factory=dict)
    """What the smoke run proves the build with (see ``proof_inputs``); not part of the stamp."""

    @property
    def proof_id(self) -> str:
        """The proof's own version: a hash of ``proof`` (script, quant, serving flags, ladder)."""
        return hashlib.sha256(json.dumps(self.proof, sort_keys=True).encode()).hexdigest()[:16]

    def record(self) -> str:
        """The build-info.json written next to a verified build (the proof adds its result as ``proof``)."""
        inputs = {k: v for k, v in asdict(self).items() if k != "proof"}
        return json.dumps({"recipe": BUILD_RECIPE, **inputs, "proof_inputs": self.proof, "proof_id": self.proof_id},
                          indent=1, sort_keys=True)


def cpu_feature_args(features: Optional[tuple]) -> tuple:
    """ggml's x86 options for a feature list; None builds for the build host's CPU (-march=native)."""
    if features is None:
        return ()
    return ("-DGGML_NATIVE=OFF", *(f"-DGGML_{f.upper()}={'ON' if f in features else 'OFF'}" for f in X86_FEATURES))


def cpu_variant_name(features: Optional[tuple]) -> str:
    return "native" if features is None else "x86 " + ",".join(features or ("baseline",))


def with_cpu_features(args: tuple, features: Optional[tuple]) -> tuple:
    """``args`` with its CPU feature options replaced by those of ``features``."""
    feature_options = {"-DGGML_NATIVE"} | {f"-DGGML_{f.upper()}" for f in X86_FEATURES}
    kept = tuple(a for a in args if a.split("=", 1)[0] not in feature_options)
    return kept + cpu_feature_args(features)


def proof_kv_types(s: Settings) -> tuple:
    """The KV types the smoke run proves the build with: an ``auto`` side cannot be resolved
    before the model exists, and needs not be (docs/planning.md, "Choosing the context"), so
    it is proven with q4_0, whose quantized kernels are the ones that can be missing. One
    side auto and the other fixed can mix types: see cmake_args."""
    k, v = s.server.cache_type_k, s.server.cache_type_v
    # without flash attention the planner keeps an auto V at f16 (a quantized V needs it)
    return (k if k != "auto" else "q4_0", v if v != "auto" else "q4_0" if s.server.flash_attn else "f16")


def serving_inputs(s: Settings) -> dict:
    """The llama-server runtime flags the unit uses, as the smoke run must use them too.

    On a CUDA build every layer goes to the GPU, so the kernels for the card's
    arch really load; ``server_gpu_layers`` only shapes the served unit. The
    unit itself serves the KV types its plan chose (``proof_kv_types``)."""
    k, v = proof_kv_types(s)
    return {"cache_type_k": k, "cache_type_v": v, "flash_attn": s.server.flash_attn, "mmap": s.server.mmap,
            "repack": s.server.repack, "gpu_layers": 999 if s.llamacpp.backend == "cuda" else None}  # fmt: skip


def proof_inputs(s: Settings) -> dict:
    return {"script_sha256": PROOF_SCRIPT_SHA256, "quant": s.model.quant, "serving": serving_inputs(s),
            "cpu_features": s.llamacpp.cpu_features, "cpu_fallback": s.llamacpp.cpu_fallback}  # fmt: skip


def cmake_args(s: Settings, archs: tuple, cuda_home: Optional[str], host_compiler: Optional[str]) -> tuple:
    args = ["-DCMAKE_BUILD_TYPE=Release",
            # Without these the build downloads the web UI (no internet on racks like ours).
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_UI=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            # The checkout is ours, not a llama.cpp clone with tags: say which commit it is.
            f"-DLLAMA_BUILD_COMMIT={s.llamacpp.commit[:9]}",
            # The binaries find their libraries beside them ($ORIGIN), not at the absolute
            # path of the build directory: a build shipped to another host (ship.py) runs
            # from wherever it is unpacked and proven.
            "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON"]
    if s.llamacpp.backend == "cuda":
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}",
                 f"-DCMAKE_CUDA_COMPILER={cuda_home}/bin/nvcc"]  # fmt: skip
        if host_compiler:
            args.append(f"-DCMAKE_CUDA_HOST_COMPILER={host_compiler}")
        # Flash-attention kernels for mixed K/V cache types exist only with this
        # (else the server silently falls back to slow paths). Two auto sides
        # always match; one auto side beside a fixed one may not.
        if s.server.cache_type_k != s.server.cache_type_v:
            args.append("-DGGML_CUDA_FA_ALL_QUANTS=ON")
    else:
        args.append("-DGGML_CUDA=OFF")
    return tuple(args) + cpu_feature_args(s.llamacpp.cpu_features)


def plan_build(s: Settings, archs: tuple = (), cuda_home: Optional[str] = None, cuda_version: Optional[str] = None,
               host_compiler: Optional[str] = None) -> BuildPlan:  # fmt: skip
    """The build for these settings and toolchain; ``stamp`` names its directory."""
    cuda = s.llamacpp.backend == "cuda"
    archs = tuple(sorted(archs)) if cuda else ()
    inputs = dict(commit=s.llamacpp.commit, backend=s.llamacpp.backend, cuda_archs=archs,
                  cuda_home=cuda_home if cuda else None, cuda_version=cuda_version if cuda else None,
                  host_compiler=host_compiler if cuda else None,
                  cmake_args=cmake_args(s, archs, cuda_home, host_compiler),
                  targets=TARGETS + ((QUALITY_TARGET,) if s.model.quality else ()))
    return BuildPlan(stamp=inputs_stamp({"recipe": BUILD_RECIPE, **inputs}), **inputs, proof=proof_inputs(s))


def same_build(name: Optional[str], stamp: str, seals=None) -> bool:
    """``builds/<name>`` holds a build of the inputs ``stamp`` names: the stamp itself, a
    rebuild of the same inputs beside it (``<stamp>-r<time>``: forced, or made because the
    first one's files no longer matched their seal or failed a new proof), or, with the
    ``BuildSeals`` fact, any build whose record has those inputs (one named when stamps
    also covered the proof)."""
    return bool(name) and (name == stamp or name.startswith(f"{stamp}-r")
                           or (seals is not None and seals.stamps.get(name) == stamp))


def build_dir_for(stamp: str, builds, seals, now: Optional[float] = None, proof_id: Optional[str] = None) -> str:
    """The directory under ``builds/`` that serves the build ``stamp`` (``builds``: the
    ``LlamacppBuilds`` fact, ``seals``: ``BuildSeals``): a proven one that matches its seal and
    did not fail the proof ``proof_id``, ``current`` first, else the newest; else a new
    directory beside a ``builds/<stamp>`` that did, which is never rebuilt in place
    (docs/ARCHITECTURE.md, "A proven build is sealed")."""
    good = [name for name in builds.newest_first()
            if same_build(name, stamp, seals) and not seals.tampered(name)
            and not (proof_id and seals.failed.get(name) == proof_id)]
    if good:
        return builds.current if builds.current in good else good[0]
    if stamp in builds.verified:
        return f"{stamp}-r{int(time.time() if now is None else now)}"
    return stamp


def plan_for_host(settings: Settings, facts: HostFacts) -> BuildPlan:
    """The build this host needs: archs from its GPUs, toolkit and host compiler
    from the run's toolchain plan (the one the toolchain role installs)."""
    t = plan_toolchain(settings, facts)
    toolchain = () if t is None else (build_archs(settings, facts), t.cuda_home, t.cuda_version, t.host_compiler)
    plan = plan_build(settings, *toolchain)
    if settings.llamacpp.force_rebuild:
        # A forced build gets its own directory: the one in service is never rebuilt in place.
        plan = replace(plan, stamp=f"{plan.stamp}-r{int(time.time())}")
    return plan
