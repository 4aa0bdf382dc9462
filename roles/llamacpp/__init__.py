"""llama.cpp: pinned source, a build per input set, verified, then switched in.

The source sits in ``<root>/src/llama.cpp``, one directory per build in
``<root>/builds/<stamp>`` and ``builds/current`` links the one in service
(``llamarack/layout.py``). Same inputs: nothing runs. New inputs (commit,
archs, toolkit, flags; ``plan.py``): a new build directory, verified
(``--version`` runs, cubins for every arch), proven by its smoke run, sealed
(``files/build_seal.py``), then ``current`` is switched. A build whose files
differ from its seal is built again beside it (``<stamp>-r<time>``) and
switched in once proven; the previous build stays for rollback. A failed
build stops the host before the switch, so the serving build is untouched.
Old builds are pruned by the server role (``prune_builds`` here), only once
the unit that serves has answered ``/health``.
"""
