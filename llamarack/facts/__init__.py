"""Custom pyinfra facts: one small class per probed thing, each with fixture tests.

OS release comes from pyinfra's own ``server.LinuxDistribution``.
"""

from .gpu import (
    CharDevice,
    CharDevices,
    DriverState,
    Gpu,
    GpuProcess,
    GpuProcesses,
    KernelModule,
    NvidiaKernelModule,
    NvidiaSmi,
    RecordedGpus,
    gpus_record,
)
from .llamacpp import (BenchRecord, BuildFlags, BuildRecord, Builds, BuildSeals, GitHead, LlamacppBuilds,
                       LlamaServerFlags, Seals, ServerFlags, parse_build_help, parse_server_help)
from .packages import DebianSources, DebPackage, NvidiaDriverPackages
from .python import PythonEnv, PythonEnvPackages, RequirementsFile
from .model import ArtifactState, CachedBlobs, GgufShape, ModelArtifact, shape_record_name
from .reading import FactRead, read, read_together
from .system import FreeDiskBytes, HttpStatus, PasswdEntry, SystemUser, UnitState, active_since
from .toolchain import (
    CmakeVersion,
    CudaToolkit,
    CudaToolkits,
    GccInstall,
    GccVersions,
    InstallableGccMajors,
)

__all__ = [
    "CharDevice",
    "CharDevices",
    "FactRead",
    "read",
    "read_together",
    "PasswdEntry",
    "SystemUser",
    "UnitState",
    "HttpStatus",
    "BuildRecord",
    "BenchRecord",
    "GpuProcess",
    "GpuProcesses",
    "ArtifactState",
    "CachedBlobs",
    "Builds",
    "BuildSeals",
    "Seals",
    "GitHead",
    "LlamacppBuilds",
    "LlamaServerFlags",
    "BuildFlags",
    "ServerFlags",
    "parse_build_help",
    "parse_server_help",
    "CmakeVersion",
    "CudaToolkit",
    "CudaToolkits",
    "DebianSources",
    "DebPackage",
    "DriverState",
    "FreeDiskBytes",
    "GccInstall",
    "GccVersions",
    "InstallableGccMajors",
    "Gpu",
    "KernelModule",
    "ModelArtifact",
    "GgufShape",
    "NvidiaKernelModule",
    "NvidiaDriverPackages",
    "NvidiaSmi",
    "PythonEnv",
    "PythonEnvPackages",
    "RequirementsFile",
    "RecordedGpus",
    "gpus_record",
    "shape_record_name",
]
