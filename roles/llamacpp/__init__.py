"""llama.cpp: pinned source, a build per input set, verified, then switched in.

    <root>/src/llama.cpp          the source at the pinned commit
    <root>/builds/<stamp>/        one build per input set (see plan.py)
    <root>/builds/current         link to the build in service

Same inputs: nothing runs. New inputs (commit, archs, toolkit, flags): a new
build directory, verified (``--version`` runs, cubins for every arch), proven
by its smoke run, sealed (``manifest.json``: every file under ``build/bin``
and the records, with size, mtime, inode and sha256), then ``current`` is
switched. A build whose files differ from its seal is built again beside it
(``<stamp>-r<time>``) and switched in once proven; the previous build stays for rollback. A failed
build stops the host before the switch, so the serving build is untouched.
Old builds are pruned by the server role (``prune_builds`` here), only once
the unit that serves has answered ``/health``.
"""
