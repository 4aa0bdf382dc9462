"""Test support: a tiny real model, a local hub server, cached tool venvs and sources.

Nothing here reaches the network at test time except pip (PyPI and the local
wheel directory) when a cached venv or source is missing.
"""
