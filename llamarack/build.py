"""The llama.cpp build plan: every input that shapes the binaries, and its stamp.

A build is identified by a stamp, a hash of all its inputs (commit, backend,
CUDA archs, toolkit, host compiler, cmake flags, targets). Same inputs, same
stamp: nothing to build. Any input changed: a new build directory. The
driver version is deliberately not an input: a driver upgrade alone needs a
restart of the server, not a rebuild (unless it came with a new toolkit,
which is an input).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Optional

from .settings import Settings

# What we ship. llama-cli is cheap once ggml is built and handy for checks.
TARGETS = ("llama-server", "llama-quantize", "llama-bench", "llama-cli")

# Bump when the build steps change in a way that makes old builds unlike new ones.
BUILD_RECIPE = 1


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

    def record(self) -> str:
        """The build-info.json written next to a verified build."""
        return json.dumps({"recipe": BUILD_RECIPE, **asdict(self)}, indent=1, sort_keys=True)


def cmake_args(
    s: Settings,
    archs: tuple,
    cuda_home: Optional[str],
    host_compiler: Optional[str],
) -> tuple:
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        # Without these the build downloads the web UI (no internet on racks like ours).
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        # The checkout is ours, not a llama.cpp clone with tags: say which commit it is.
        f"-DLLAMA_BUILD_COMMIT={s.llamacpp.commit[:9]}",
    ]
    if s.llamacpp.backend == "cuda":
        args += [
            "-DGGML_CUDA=ON",
            f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}",
            f"-DCMAKE_CUDA_COMPILER={cuda_home}/bin/nvcc",
        ]
        if host_compiler:
            args.append(f"-DCMAKE_CUDA_HOST_COMPILER={host_compiler}")
        # Flash-attention kernels for mixed K/V cache types exist only with this
        # (else the server silently falls back to slow paths).
        if s.server.cache_type_k != s.server.cache_type_v:
            args.append("-DGGML_CUDA_FA_ALL_QUANTS=ON")
    else:
        args.append("-DGGML_CUDA=OFF")
    return tuple(args)


def plan_build(
    s: Settings,
    archs: tuple = (),
    cuda_home: Optional[str] = None,
    cuda_version: Optional[str] = None,
    host_compiler: Optional[str] = None,
) -> BuildPlan:
    """The build for these settings and toolchain; ``stamp`` names its directory."""
    cuda = s.llamacpp.backend == "cuda"
    archs = tuple(sorted(archs)) if cuda else ()
    inputs = dict(
        commit=s.llamacpp.commit,
        backend=s.llamacpp.backend,
        cuda_archs=archs,
        cuda_home=cuda_home if cuda else None,
        cuda_version=cuda_version if cuda else None,
        host_compiler=host_compiler if cuda else None,
        cmake_args=cmake_args(s, archs, cuda_home, host_compiler),
        targets=TARGETS,
    )
    digest = hashlib.sha256(
        json.dumps({"recipe": BUILD_RECIPE, **inputs}, sort_keys=True).encode()
    ).hexdigest()
    return BuildPlan(stamp=digest[:16], **inputs)
