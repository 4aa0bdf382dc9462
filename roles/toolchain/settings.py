"""The toolchain role's settings section (host-data keys ``toolchain_*``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from llamarack.settings_fields import Section, conda_channel_name, dotted_version, host_path, setting


@dataclass(frozen=True)
class ToolchainSettings(Section):
    """The CUDA toolkit and host compiler llama.cpp is built with."""

    prefix = "toolchain"

    cuda_version: str = setting("11.8", "CUDA toolkit version to build with (13+ cannot build for Volta/Pascal)",
                                dotted_version)
    cuda_source: Literal["system", "conda", "debian"] = setting(
        "system", "where the toolkit comes from: system (/usr/local/cuda-X), conda env, or Debian non-free")
    cuda_home: Optional[str] = setting(None, "toolkit directory; None searches /usr/local/cuda-<version> and /usr",
                                       host_path)
    install_gcc: bool = setting(True, "install gcc-N/g++-N when the default gcc is newer than the toolkit accepts")
    conda_channel: str = setting("nvidia/label/cuda-11.8.0", "conda channel the toolkit (cuda-nvcc, cudart, cublas) "
                                 "comes from with source conda", conda_channel_name)
    apt_cache_time: int = setting(86400, "seconds apt's package lists count as fresh; apt-get update runs only when a "
                                  "package is missing and the lists are older", between=(1, 31 * 86400))
