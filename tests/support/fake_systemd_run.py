"""A stand-in for ``systemd-run`` on a machine without a running systemd (this one, CI).

The model role runs fetch, convert and quantize through ``systemd-run``
(``roles/model/sandbox.py``). Tests that run those real commands here put this
script first on ``PATH`` (``install``): it takes the options the model role
gives and refuses any other, checks that the user exists, then runs the
command as systemd would hand it over: with the ``--setenv`` variables, in the
``--working-directory``, and each ``$$`` of a word made ``$`` (systemd's
expansion of a transient unit's command line; a lone ``$`` would expand a
variable, and is refused). It neither changes user nor applies the sandbox:
the lab's tests check those on a real systemd.

``steps(shell)`` reads the ``systemd-run`` commands back out of a shell command
line, as the shell and then systemd would hand them over.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT = r'''#!/usr/bin/env python3
import os, pwd, re, sys
FLAGS = {"--quiet", "--wait", "--pipe", "--collect"}
args, env, seen, cwd, user = sys.argv[1:], dict(os.environ), set(), None, None
while args and args[0] != "--":
    a = args.pop(0)
    if a in FLAGS:
        seen.add(a)
    elif a.startswith("--uid="):
        user = a[len("--uid="):]
        pwd.getpwnam(user)
    elif a == "-p" and args and re.fullmatch(r"[A-Za-z]+=.*", args[0]):
        args.pop(0)
    elif a.startswith("--setenv=") and "=" in a[len("--setenv="):]:
        key, value = a[len("--setenv="):].split("=", 1)
        env[key] = value
    elif a.startswith("--working-directory="):
        cwd = a[len("--working-directory="):]
    elif a.startswith("--description="):
        pass
    else:
        sys.exit(f"fake systemd-run: unexpected option {a!r}")
if seen != FLAGS or not user or not cwd or not args:
    sys.exit(f"fake systemd-run: missing options: {sorted(FLAGS - seen)} uid={user} cwd={cwd} {args[:1]}")
words = args[1:]
for w in words:
    if "$" in w.replace("$$", ""):
        sys.exit(f"fake systemd-run: {w!r} would expand a variable")
words = [w.replace("$$", "$") for w in words]
os.chdir(cwd)
os.execvpe(words[0], words, env)
'''


def install(directory: Path) -> Path:
    """Write the stand-in as ``directory/systemd-run`` (executable); return the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "systemd-run"
    path.write_text(SCRIPT)
    path.chmod(0o755)
    return directory


def path_with(directory: Path) -> str:
    """``PATH`` with ``directory`` first."""
    return f"{directory}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"


# The options with a value, by the Step field that holds it.
OPTIONS = {"--uid": "uid", "--description": "description", "--working-directory": "workdir"}


@dataclass
class Step:
    """One ``systemd-run`` of a shell command line."""

    flags: list = field(default_factory=list)
    uid: str = ""
    description: str = ""
    workdir: str = ""
    properties: list = field(default_factory=list)  # (name, value), in order
    env: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)  # as the command runs: systemd's $$ made $
    words: list = field(default_factory=list)  # as systemd-run received them

    def values(self, name: str) -> list:
        return [v for k, v in self.properties if k == name]


def steps(shell: str) -> list:
    """Every ``systemd-run`` in ``shell``, its words as the shell splits them; a step's
    command ends at the first operator (``<``, ``;``, ``>>``...)."""
    lex = shlex.shlex(shell, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    tokens = list(lex)
    found = []
    for i, token in enumerate(tokens):
        if token != "systemd-run":
            continue
        end = next((j for j in range(i + 1, len(tokens)) if tokens[j] and set(tokens[j]) <= set("();<>|&")),
                   len(tokens))
        found.append(_step(tokens[i + 1:end]))
    return found


def _step(words: list) -> Step:
    step, rest = Step(), list(words)
    while rest and rest[0] != "--":
        w = rest.pop(0)
        if w == "-p":
            step.properties.append(tuple(rest.pop(0).split("=", 1)))
        elif w.startswith("--setenv="):
            key, value = w[len("--setenv="):].split("=", 1)
            step.env[key] = value
        elif "=" in w:
            name, value = w.split("=", 1)
            setattr(step, OPTIONS[name], value)
        else:
            step.flags.append(w)
    step.words = rest[1:]
    step.argv = [w.replace("$$", "$") for w in step.words]
    return step
