# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Run several host modules in this one interpreter, each as ``python3 -c SOURCE ARGS`` runs it
alone, their outputs in sections marked as ``FactsTogether`` marks its shell sections.

    python3 -c SOURCE MARKER RUNS   (RUNS, JSON: {"sources": {NAME: SOURCE}, "runs": [[INDEX, NAME, [ARG, ...]], ...]})

prints, for each run, ``MARKER INDEX``, the module's output, then ``MARKER rc STATUS``. Each
run executes as ``__main__`` in a namespace of its own, with ``sys.argv`` = [NAME, ARG...];
its status is what it gave ``sys.exit`` (0 when it returned, 1 when it raised), as the
interpreter's would be. Starting python3 costs a host 15-40 ms of CPU, and a fact read
together used to start one per module. Only modules that read, and change nothing of the
process (working directory, environment, signals), are run so: the facts that opt in.
"""

import json
import sys


def run(source: str, name: str, args: list, compiled: dict) -> int:
    sys.argv = [name, *args]
    try:
        if name not in compiled:  # a module run twice (one env each) is compiled once
            compiled[name] = compile(source, name, "exec")
        exec(compiled[name], {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except Exception:
        import traceback  # only on a failure: 3 ms of a host's CPU otherwise

        traceback.print_exc()
        return 1
    return 0


def main(argv: list) -> int:
    marker, spec = argv[1], json.loads(argv[2])
    compiled: dict = {}
    for index, name, args in spec["runs"]:
        print(f"{marker} {index}", flush=True)
        status = run(spec["sources"][name], name, args, compiled)
        sys.stdout.flush()
        print(f"{marker} rc {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
