"""Custom pyinfra facts: one small class per probed thing, each with fixture tests.

OS release comes from pyinfra's own ``server.LinuxDistribution``.
"""

from .gpu import (
    DriverState,
    Gpu,
    KernelModule,
    NvidiaKernelModule,
    NvidiaSmi,
    RecordedGpus,
    gpus_record,
)
from .llamacpp import Builds, GitHead, LlamacppBuilds, LlamaServerFlags, ServerFlags, parse_server_help
from .system import FreeDiskBytes
from .toolchain import (
    CmakeVersion,
    CudaToolkit,
    CudaToolkits,
    GccInstall,
    GccVersions,
    InstallableGccMajors,
)

__all__ = [
    "Builds",
    "GitHead",
    "LlamacppBuilds",
    "LlamaServerFlags",
    "ServerFlags",
    "parse_server_help",
    "CmakeVersion",
    "CudaToolkit",
    "CudaToolkits",
    "DriverState",
    "FreeDiskBytes",
    "GccInstall",
    "GccVersions",
    "InstallableGccMajors",
    "Gpu",
    "KernelModule",
    "NvidiaKernelModule",
    "NvidiaSmi",
    "RecordedGpus",
    "gpus_record",
]
