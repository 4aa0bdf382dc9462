# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Run several host modules in this one interpreter, each as ``python3 -c SOURCE ARGS`` runs it
alone, their outputs in sections marked as ``FactsTogether`` marks its shell sections.

    python3 -c SOURCE MARKER K NAME SOURCE... N NAME SOURCE... INDEX NAME COUNT ARG...

K pairs of an included module's name and source (``# Includes:``, ``llamarack.remote``),
then N pairs of a module's name and its own source, then the runs: each an INDEX, the NAME
of a module given above and its COUNT arguments. It prints, for each run, ``MARKER
INDEX``, the module's output, then ``MARKER rc STATUS``. Each run executes as
``__main__`` in a namespace of its own, with the included modules' names in it (each
included module compiled and run once, not once per module that includes it) and
``sys.argv`` = [NAME, ARG...]; its status is what it gave ``sys.exit`` (0 when it
returned, 1 when it raised), as the interpreter's would be.

Starting python3 costs a host 15-40 ms of CPU, and a fact read together used to start one
per module. Only modules that read, and change nothing of the process (working directory,
environment, signals), are run so: the facts that opt in. The runs come as plain
arguments, not JSON: importing json (and re under it) was a third of this python3's CPU.
"""

import sys


def run(source: str, name: str, args: list, compiled: dict, included: dict) -> int:
    sys.argv = [name, *args]
    try:
        if name not in compiled:  # a module run twice (one env each) is compiled once
            compiled[name] = compile(source, name, "exec")
        exec(compiled[name], {**included, "__name__": "__main__", "__builtins__": __builtins__})
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


def pairs(argv: list) -> tuple:
    """({name: source} of the count of pairs ``argv`` starts with, the arguments after them)."""
    count = int(argv[0])
    return dict(zip(argv[1:1 + 2 * count:2], argv[2:2 + 2 * count:2])), argv[1 + 2 * count:]


def main(argv: list) -> int:
    marker = argv[1]
    includes, rest = pairs(argv[2:])
    sources, rest = pairs(rest)
    included: dict = {}
    for name, source in includes.items():  # they define names and run nothing
        exec(compile(source, name, "exec"), included)
    included.pop("__builtins__", None)
    compiled: dict = {}
    while rest:
        index, name, count = rest[0], rest[1], int(rest[2])
        args, rest = rest[3:3 + count], rest[3 + count:]
        print(f"{marker} {index}", flush=True)
        status = run(sources[name], name, args, compiled, included)
        sys.stdout.flush()
        print(f"{marker} rc {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
