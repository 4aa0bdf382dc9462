"""llama.cpp: pinned source, a build per input set, verified, then switched in.

docs/deploy.md ("The roles", "A build counts only after it computed") says how a build is
made, proven, sealed and switched; ``llamarack/layout.py`` where each lies. Old builds are
pruned by the server role (``prune_builds`` here), only once the unit that serves has
answered ``/health``.
"""
