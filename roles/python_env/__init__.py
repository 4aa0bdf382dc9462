"""Python envs: the AWQ quantization env with the reference pins, and llama.cpp's converter env.

Backends: ``venv`` (the host's ``/usr/bin/python<version>`` and its venv module) or
``conda`` (Miniforge under ``<root>/conda``, its installer pinned by sha256). Envs live in
``<root>/envs/awq`` and ``<root>/envs/convert``; docs/deploy.md ("The roles") says how the
pins are resolved, installed and checked (``plan.py``, ``files/pyenv_check.py``).
"""
