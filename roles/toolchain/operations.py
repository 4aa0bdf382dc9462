"""The toolchain role's operations."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.api.exceptions import OperationError

from llamarack import remote
from roles.toolchain.reads import CudaToolkits, GccVersions
from llamarack.facts import read
from llamarack.operations import executing
from roles.toolchain.rules import choose_host_compiler, find_toolkit

from .plan import ToolchainPlan


@operation()
def toolkit_takes_host_compiler(plan: ToolchainPlan, extra_homes: tuple = ()):
    """Check that a toolkit installed in this run is there and accepts the planned host compiler.

    + plan: the run's ``ToolchainPlan`` (planned from the ceiling such a toolkit is known to have)
    + extra_homes: more directories to look for the toolkit in (a conda env)

    The plan stands; this only fails the host, before anything is built,
    when the installed toolkit's own ``crt/host_config.h`` disagrees with it."""
    if not executing():
        yield StringCommand(remote.argv("true", "checked once CUDA", plan.cuda_version, "is installed"))
        return
    toolkits = read(CudaToolkits, extra_homes=tuple(extra_homes))
    toolkit = find_toolkit(toolkits, plan.cuda_version, plan.cuda_home)
    if toolkit is None:
        found = ", ".join(f"{t.version} in {t.home}" for t in toolkits) or "none"
        raise OperationError(f"no CUDA {plan.cuda_version} toolkit in {plan.cuda_home} (found: {found})")
    if toolkit.max_gcc != plan.max_gcc:
        try:
            major, _ = choose_host_compiler(toolkit.max_gcc, read(GccVersions))
        except LookupError:
            major = None
        if major != plan.gcc_major:
            raise OperationError(
                f"CUDA {toolkit.version} in {toolkit.home} takes gcc {toolkit.max_gcc} or older, "
                f"but the build was planned for gcc {plan.gcc_major or 'default'}; run the deploy again"
            )
    host.noop(f"CUDA {toolkit.version} in {toolkit.home} takes {plan.host_compiler or 'the default gcc'}")
