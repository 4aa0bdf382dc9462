"""Python envs: the AWQ quantization env with the reference pins, and llama.cpp's converter env.

Backends: ``venv`` (the host's ``/usr/bin/python<version>`` and its venv
module) or ``conda`` (Miniforge under ``<root>/conda``, its installer pinned
by sha256; envs with ``python=<version>`` from the configured channels).
Envs live in ``<root>/envs/awq`` and ``<root>/envs/convert``.

The pins are installed deliberately (see ``plan.py`` for why):
resolve the whole set first and name each conflict, torch alone from its
index, the rest with torch and numpy held by constraints, autoawq with
``--no-deps`` plus what it really imports; then an import test. A converged
env costs no pip call; a drifted package is put back.
"""
