# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Print the requirement lines of a pip requirements file, its ``-r`` includes followed.

    python3 -c SOURCE REQUIREMENTS.txt     ("llamarack: no such file" when it is not there)

Options lines (``--extra-index-url`` and the like) are dropped on purpose:
every outside source is a llamarack setting, never a line in someone else's file.
"""

import os
import sys


def read(path, seen):
    path = os.path.normpath(path)
    if path in seen:
        return
    seen.add(path)
    with open(path) as f:
        for raw in f:
            line = raw.split(" #")[0].strip()
            if not line or line.startswith("#"):
                continue
            for flag in ("-r ", "--requirement "):
                if line.startswith(flag):
                    yield from read(os.path.join(os.path.dirname(path), line[len(flag):].strip()), seen)
                    break
            else:
                if not line.startswith("-"):
                    yield line


if __name__ == "__main__":
    if not os.path.isfile(sys.argv[1]):
        print("llamarack: no such file")
        sys.exit(0)
    for requirement in read(sys.argv[1], set()):
        print(requirement)
