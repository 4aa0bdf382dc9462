"""Python envs: the AWQ quantization env with the reference pins, and llama.cpp's converter env.

Backends: ``venv`` (the host's ``/usr/bin/python<version>`` and its venv
module) or ``conda`` (Miniforge under ``<root>/conda``, its installer pinned
by sha256; envs with ``python=<version>`` from the configured channels).
Envs live in ``<root>/envs/awq`` and ``<root>/envs/convert``.

The pins are resolved as a whole first, then installed in steps (``plan.py``
says why) and verified by an import test (``files/pyenv_check.py``). A
converged env costs no pip call; a drifted package is put back.
"""
