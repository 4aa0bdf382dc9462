"""The role's one ``@deploy`` entry point (the role is described in ``__init__.py``)."""

from packaging.version import Version
from pyinfra import host
from pyinfra.api import deploy
from pyinfra.api.exceptions import DeployError
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt

from roles.toolchain.reads import CmakeVersion
from llamarack.facts import DebianSources, read
from llamarack.operations import apt_install_missing, miniforge_env, put_file
from roles.preflight.facts import HostFacts
from roles.settings import Settings

from .operations import toolkit_takes_host_compiler
from .plan import BUILD_PACKAGES, conda_cuda_env, nonfree_sources, plan_toolchain, toolkit_search_homes

# The pinned llama.cpp's CMakeLists.txt: cmake_minimum_required(VERSION 3.14).
CMAKE_MIN = "3.14"
CUDA_SOURCES_FILE = "/etc/apt/sources.list.d/llamarack-cuda.sources"
CONDA_CUDA_PACKAGES = ["cuda-nvcc", "cuda-cudart-dev", "libcublas-dev"]


def _debian_toolkit(settings: Settings) -> None:
    """Debian's nvidia-cuda-toolkit, with the contrib and non-free sources it comes from."""
    distro = read(LinuxDistribution)
    if distro.get("name") != "Debian":
        raise DeployError(f"{host.name}: toolchain_cuda_source 'debian' needs Debian (found {distro.get('name')}). "
                          "Fix: use 'system' or 'conda' on this host")
    stanzas = read(DebianSources)
    if not stanzas:
        raise DeployError(f"{host.name}: no deb822 /etc/apt/sources.list.d/debian.sources to take the archive and "
                          "Signed-By from. Fix: add contrib non-free to the host's apt sources yourself, or use "
                          "toolchain_cuda_source 'system'")
    text = nonfree_sources(stanzas)
    if text:
        sources = put_file(name="apt sources: contrib and non-free for nvidia-cuda-toolkit", text=text,
                           dest=CUDA_SOURCES_FILE, mode="644")
        apt.update(name="apt update for the new sources", _if=sources.did_change)
    apt_install_missing(name="CUDA toolkit (Debian non-free)", packages=["nvidia-cuda-toolkit"],
                        cache_time=settings.toolchain.apt_cache_time)


def _conda_toolkit(settings: Settings) -> None:
    """The CUDA toolkit in a conda env of its own (Miniforge first)."""
    t, p = settings.toolchain, settings.python_env
    if not p.conda_installer_sha256:
        raise DeployError(f"{host.name}: toolchain_cuda_source 'conda' needs python_env_conda_installer_sha256 "
                          "(the Miniforge installer is pinned by its sha256)")
    env = conda_cuda_env(settings)
    miniforge_env(p, settings.layout.conda, env, CONDA_CUDA_PACKAGES, [t.conda_channel], marker=f"{env}/bin/nvcc",
                  name=f"CUDA {t.cuda_version} toolkit (conda)")


@deploy("llamarack toolchain")
def toolchain(settings: Settings, facts: HostFacts):
    """Install the build packages and, on CUDA builds, the toolkit and a host compiler it accepts.

    + settings: the host's settings (``toolchain_*``; ``llamacpp_backend``; the conda
      installer of ``python_env_*`` with source conda)
    + facts: what preflight read (toolkits, gcc)"""
    t = settings.toolchain
    cuda = settings.llamacpp.backend == "cuda"
    cmake = read(CmakeVersion)
    if cmake and Version(cmake) < Version(CMAKE_MIN):
        raise DeployError(f"{host.name}: cmake {cmake} is installed; llama.cpp needs cmake >= {CMAKE_MIN}. "
                          "Fix: install a newer cmake (Debian 12 has 3.25, Ubuntu 22.04 has 3.22)")
    apt_install_missing(name="Build packages", packages=BUILD_PACKAGES, cache_time=t.apt_cache_time)

    if cuda and t.cuda_source == "debian":
        _debian_toolkit(settings)
    elif cuda and t.cuda_source == "conda":
        _conda_toolkit(settings)

    plan = plan_toolchain(settings, facts)
    if plan is None:
        return
    if plan.install_gcc:
        apt_install_missing(name=f"gcc-{plan.gcc_major} for nvcc (CUDA {plan.cuda_version} takes gcc {plan.max_gcc} "
                            "or older)", packages=[f"gcc-{plan.gcc_major}", f"g++-{plan.gcc_major}"],
                            cache_time=t.apt_cache_time)
    if not plan.toolkit_installed:
        toolkit_takes_host_compiler(name=f"CUDA {plan.cuda_version} takes {plan.host_compiler or 'the default gcc'}",
                                    plan=plan, extra_homes=toolkit_search_homes(settings))
