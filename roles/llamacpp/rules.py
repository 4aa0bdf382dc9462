"""The llamacpp role's compatibility rules: the build's CUDA architectures against the
host's cards, its CPU code against the host's CPU (preflight runs them,
``roles/preflight/rules.py``)."""

from __future__ import annotations

from typing import Optional

from llamarack.errors import Failure
from llamarack.gpu_table import parse_compute_cap
from roles.settings import Settings

from ..preflight.facts import HostFacts


def arch_digits(arch: str) -> str:
    """The compute capability digits of a build arch: "90a" and "80-real" give "90" and "80"."""
    return arch.split("-")[0].rstrip("af")


def build_archs(s: Settings, facts: HostFacts) -> tuple[str, ...]:
    """The CUDA architectures the build targets: the setting, else the host's GPUs'."""
    return s.llamacpp.cuda_archs or tuple(sorted({gpu.arch for gpu in facts.gpus if gpu.arch}))


def rule_gpus_known(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """Every card has a compute capability (from the driver or the card table): else
    the build's arch list is empty and cmake refuses -DCMAKE_CUDA_ARCHITECTURES=."""
    unknown = [g for g in facts.gpus if parse_compute_cap(g.compute_cap) is None]
    if s.llamacpp.backend != "cuda" or s.llamacpp.cuda_archs or not unknown:
        return None
    names = ", ".join(f"{g.name} (PCI device id {g.pci_device_id or 'unknown'})" for g in unknown)
    return Failure(
        "gpu-known", f"GPU(s) of unknown compute capability: {names} (the driver gives no compute_cap and the card "
        "is not in llamarack's card table)", "a compute capability for every GPU",
        "set llamacpp_cuda_archs for this host's group (e.g. ['70'] for a V100), "
        "or add the card to llamarack/gpu_table.py",
    )


def rule_build_covers_gpus(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """Every GPU's architecture is in the build (else: no kernel image at run time)."""
    gpu_archs = {g.arch for g in facts.gpus if g.arch}
    missing = sorted(gpu_archs - {arch_digits(a) for a in s.llamacpp.cuda_archs or ()})
    if s.llamacpp.backend != "cuda" or not s.llamacpp.cuda_archs or not missing:
        return None
    return Failure("build-covers-gpus",
                   f"llamacpp_cuda_archs {list(s.llamacpp.cuda_archs)} with GPUs of arch {sorted(gpu_archs)}",
                   f"every GPU arch in the build (missing {missing})",
                   "add the missing archs to llamacpp_cuda_archs, or unset it to build for the host's GPUs")


# The /proc/cpuinfo flags each of ggml's x86 extensions (llamacpp_cpu_features) compiles for: its
# CMake's -m options (ggml/src/ggml-cpu/CMakeLists.txt), GGML_AVX512 being five of them.
CPUINFO_FLAGS = {
    "sse42": ("sse4_2",), "avx": ("avx",), "avx2": ("avx2",), "avx_vnni": ("avx_vnni",), "bmi2": ("bmi2",),
    "fma": ("fma",), "f16c": ("f16c",), "avx512": ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"),
    "avx512_vbmi": ("avx512vbmi",), "avx512_vnni": ("avx512_vnni",), "avx512_bf16": ("avx512_bf16",),
    "amx_tile": ("amx_tile",), "amx_int8": ("amx_int8",), "amx_bf16": ("amx_bf16",),
}  # fmt: skip


def rule_cpu_has_features(s: Settings, facts: HostFacts) -> Optional[Failure]:
    """The host's CPU has every x86 extension the build's CPU code is made for
    (``llamacpp_cpu_features``): a build shipped from another host would otherwise die
    of an illegal instruction here, and one built here would fail its smoke run."""
    features = s.llamacpp.cpu_features
    if not features or not facts.cpu_flags:
        return None
    flags = set(facts.cpu_flags.split())
    missing = [f for f in features if not set(CPUINFO_FLAGS.get(f, (f,))) <= flags]
    if not missing:
        return None
    lacking = sorted({flag for f in missing for flag in CPUINFO_FLAGS.get(f, (f,))} - flags)
    has = [f for f in features if f not in missing]
    return Failure("cpu-has-features",
                   f"a CPU without {', '.join(missing)} (its /proc/cpuinfo flags lack {', '.join(lacking)})",
                   f"every extension of llamacpp_cpu_features {list(features)} on the CPU",
                   f"set llamacpp_cpu_features to what the rack's oldest CPU has (here {has}), or unset it "
                   "to build on each CPU for itself")  # fmt: skip


RULES = (rule_gpus_known, rule_build_covers_gpus, rule_cpu_has_features)
