"""The llamacpp role's settings section (host-data keys ``llamacpp_*``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Optional

from llamarack.settings_fields import (HOST_NAME, URL_FORBIDDEN, Section, git_revision, host_path, remote_url,
                                       setting)  # fmt: skip

# ggml's x86 CPU extensions (its GGML_<NAME> cmake options), for llamacpp_cpu_features.
X86_FEATURES = (
    "sse42", "avx", "avx2", "avx_vnni", "bmi2", "fma", "f16c",
    "avx512", "avx512_vbmi", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16",
)  # fmt: skip

# Real CUDA architectures (compute capabilities) nvcc builds for, Maxwell on.
CUDA_ARCHS = ("50", "52", "53", "60", "61", "62", "70", "72", "75", "80", "86", "87", "89", "90",
              "100", "101", "103", "110", "120", "121")  # fmt: skip


def _cuda_arch(value: str) -> Optional[str]:
    m = re.fullmatch(r"(\d{2,3})([af]?)(-real)?", value)
    if m and m.group(1) in CUDA_ARCHS:
        return None
    return ("a CUDA architecture (" + ", ".join(CUDA_ARCHS) + "), such as 70 (V100), 75 (T4), "
            "60 (P100), 61 (P40), 90 (H100/H200); NN-real leaves out the PTX that newer cards "
            "could compile at load time")


def _x86_feature(value: str) -> Optional[str]:
    return None if value in X86_FEATURES else "x86 extensions of ggml: " + ", ".join(X86_FEATURES)


def _git_url(value: str) -> Optional[str]:
    """What ``git clone`` may fetch from: a URL, user@host:path, or an absolute path
    or file:// URL (a local mirror, as bench/ uses); never an option (-... where the
    host belongs: ssh would take it as one) or a transport helper (ext::, fd::); an ssh
    login name but no password."""
    allowed = ("a git repository URL (https://, http://, ssh://, git://, file:///path), user@host:path, "
               "or an absolute path; not an option (-...) nor a remote helper (ext::, fd::...)")
    if value.startswith("-") or "::" in value or set(value) & URL_FORBIDDEN:
        return allowed
    if re.fullmatch(r"https?://\S+", value):
        return remote_url(value) and allowed
    user, local = r"[A-Za-z0-9_][A-Za-z0-9._-]*", value.removeprefix("file://")
    if (re.fullmatch(rf"(ssh://({user}@)?|git://)({HOST_NAME})(:\d+)?/\S+", value)
            or re.fullmatch(rf"{user}@({HOST_NAME}):[A-Za-z0-9._/~+-]+", value)
            or (local.startswith("/") and not host_path(local.rstrip("/")))):
        return None
    return allowed


def local_git_path(value: str) -> Optional[str]:
    """The directory a local ``llamacpp_git_url`` (an absolute path or a file:// URL) names,
    else None: root builds what the clone takes from there, so preflight checks who may
    write to it (``settings.private_dirs``)."""
    local = value.removeprefix("file://")
    return local.rstrip("/") if local.startswith("/") else None


@dataclass(frozen=True)
class LlamacppSettings(Section):
    """The llama.cpp source and build."""

    prefix = "llamacpp"

    git_url: str = setting("https://github.com/ggml-org/llama.cpp.git", "llama.cpp git repository (or a mirror)",
                           _git_url)
    commit: str = setting("0c1e57098bba43ac29e6e3b677cdceebdd22334f", "pinned llama.cpp commit", git_revision)
    backend: Literal["cuda", "cpu"] = setting("cuda", "cuda for GPU hosts; cpu builds without CUDA (hosts with no GPU, "
                                              "like the lab)")
    cuda_archs: Optional[tuple[str, ...]] = setting(None, "CUDA architectures to build for; None means those of the "
                                                    "host's GPUs", _cuda_arch)
    ccache_dir: Optional[str] = setting(None, "ccache directory, e.g. one shared by the rack over NFS", host_path)
    build_jobs: Optional[int] = setting(None, "parallel compile jobs; None means nproc", between=(1, 1024))
    force_rebuild: bool = setting(False, "rebuild even when the build inputs are unchanged")
    ship_builds: bool = setting(
        True, "make each build once in a run and ship it, sealed, through the control machine to the other "
        "hosts that need the same build (same inputs; for -march=native also the same CPU flags); "
        "False compiles on every host")
    keep_builds: int = setting(2, "builds kept for rollback, the current one included", between=(1, 100))
    cpu_features: Optional[tuple[str, ...]] = setting(
        None, "x86 extensions ggml's CPU code is built with, each named (they build on each other: "
        "avx512 needs sse42, avx, avx2, bmi2, fma, f16c too); None builds for the host's own CPU "
        "(-march=native)", _x86_feature)
    cpu_fallback: bool = setting(
        True, "when the build as asked fails its smoke run, try it without weight repacking "
        "(--no-repack), then rebuilt for x86-64-v3, then x86-64-v2, and keep the first that "
        "computes; False refuses the build")
