"""The toolchain a CUDA build uses, chosen once per run: toolkit, its gcc ceiling, nvcc's host compiler.

Pure functions of settings and preflight's facts; the toolchain role installs what
``plan_toolchain`` chose and the llama.cpp role builds with the same ``ToolchainPlan``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from roles.preflight.facts import HostFacts
from roles.toolchain.rules import choose_host_compiler, toolkit_for
from roles.settings import Settings

# gcc ceilings (crt/host_config.h) of the toolkits the toolchain role can
# install (Debian 12's nvidia-cuda-toolkit, conda's cuda-nvcc), for a first
# run that plans before the toolkit is there to be read.
GCC_CEILING_OF_INSTALLABLE_TOOLKITS = {"11.8": 11}
# What every build needs from apt, whatever its backend.
BUILD_PACKAGES = ["git", "cmake", "build-essential", "ccache", "pkg-config"]


@dataclass(frozen=True)
class ToolchainPlan:
    cuda_home: str
    cuda_version: str
    max_gcc: Optional[int]
    """The newest gcc major the toolkit accepts (its crt/host_config.h), None: no limit known."""
    gcc_major: Optional[int]
    """The gcc-N nvcc uses; None: the host's default gcc is accepted."""
    install_gcc: bool
    """gcc-N/g++-N must be installed (by the toolchain role)."""
    toolkit_installed: bool
    """False: the toolchain role installs the toolkit in this run (debian, conda)."""

    @property
    def host_compiler(self) -> Optional[str]:
        return f"/usr/bin/g++-{self.gcc_major}" if self.gcc_major else None


def conda_cuda_env(settings: Settings) -> str:
    return settings.layout.env(f"cuda-{settings.toolchain.cuda_version}")


def toolkit_search_homes(settings: Settings) -> tuple:
    """Directories beyond the standard ones where the wanted toolkit may be (a conda env)."""
    return (conda_cuda_env(settings),) if settings.toolchain.cuda_source == "conda" else ()


def plan_toolchain(settings: Settings, facts: HostFacts) -> Optional[ToolchainPlan]:
    """The CUDA toolchain for this host; None for a CPU build."""
    t = settings.toolchain
    if settings.llamacpp.backend != "cuda":
        return None
    toolkit = toolkit_for(settings, facts)
    if toolkit is not None:
        home, version, max_gcc = toolkit.home, toolkit.version, toolkit.max_gcc
    else:
        # Installed later in this run (debian, conda): its header cannot be read
        # yet, so use the ceiling that toolkit is known to have.
        home = t.cuda_home or (conda_cuda_env(settings) if t.cuda_source == "conda" else "/usr")
        version, max_gcc = t.cuda_version, GCC_CEILING_OF_INSTALLABLE_TOOLKITS.get(t.cuda_version)
    installable = facts.gcc_installable if t.install_gcc else ()
    try:
        major, install = choose_host_compiler(max_gcc, facts.gcc, installable)
    except LookupError:
        # apt had no lists to say what it can install (a fresh host): the toolchain
        # role refreshes them and installs gcc-<ceiling>, or stops the host there.
        major, install = max_gcc, True
    return ToolchainPlan(home, version, max_gcc, major, install, toolkit is not None)


def nonfree_sources(stanzas: tuple) -> str:
    """deb822 stanzas adding contrib and non-free to each Debian archive the host uses.

    Same URIs, suites and Signed-By as the host's own stanzas (security
    included: the toolkit's libraries get security updates there too).
    Returns "" when every stanza already has both components."""
    out = []
    for stanza in stanzas:
        components = set(stanza.get("Components", "").split())
        if "deb" not in stanza.get("Types", "").split() or {"contrib", "non-free"} <= components:
            continue
        lines = ["Types: deb", f"URIs: {stanza['URIs']}", f"Suites: {stanza['Suites']}",
                 "Components: contrib non-free"]  # fmt: skip
        # the host's own choice of architectures (a host with i386 may fetch amd64 only here)
        lines += [f"{key}: {stanza[key]}" for key in ("Architectures", "Signed-By") if key in stanza]
        out.append("\n".join(lines) + "\n")
    header = "# Written by llamarack (toolchain_cuda_source = 'debian'): nvidia-cuda-toolkit\n"
    return header + "\n".join(out) if out else ""
