"""Toolchain: build packages, the CUDA toolkit (CUDA builds only) and nvcc's host compiler.

docs/deploy.md ("The roles") says what it installs. With ``toolchain_cuda_source =
'debian'``, the contrib and non-free sources go in as a deb822 stanza with the same
``Signed-By`` as the host's ``debian.sources`` (a ``.list`` line for the same archive makes
apt fail: "Conflicting values set for option Signed-By"). The host compiler is chosen once,
``plan.plan_toolchain``, the same plan the llama.cpp role builds with.
"""
