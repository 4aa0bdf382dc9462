"""The toolchain role alone, for the local test against this machine's real CUDA toolkit."""

from pyinfra import host

from llamarack.settings import settings_for
from roles.toolchain import toolchain

toolchain(settings_for(host))
