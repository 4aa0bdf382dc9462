"""Toolchain: build packages, the CUDA toolkit (CUDA builds only) and nvcc's host compiler.

On every host: git, cmake, build-essential, ccache and pkg-config from apt
(apt's lists are refreshed only when a package is missing). On CUDA builds
the toolkit comes from ``toolchain_cuda_source``:

- ``system``: already installed (``/usr/local/cuda-X``); preflight checked it;
- ``debian``: Debian 12's non-free ``nvidia-cuda-toolkit`` (11.8), after a
  deb822 sources stanza for contrib and non-free with the same ``Signed-By``
  as the host's ``debian.sources`` (a ``.list`` line for the same archive
  makes apt fail: "Conflicting values set for option Signed-By");
- ``conda``: ``cuda-nvcc``, ``cuda-cudart-dev`` and ``libcublas-dev`` from
  ``toolchain_conda_channel`` into ``<root>/envs/cuda-<version>``.

Then the gcc guard: the toolkit's own ``crt/host_config.h`` says the newest
gcc it takes; a newer default gcc stays the default and a versioned gcc-N
is installed beside it. The choice is ``plan.plan_toolchain``, the same one
the llama.cpp role builds with.
"""
