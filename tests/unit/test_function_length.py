"""Every function of the product and its benchmarks is at most 80 lines, from its ``def``
to its last line (docstring included, decorators not): a longer one is split into
helpers, one concern each."""

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 80
CHECKED = ("llamarack", "roles", "lab", "bench", "deploy.py", "rollback.py", "config.py")


def python_files():
    for name in CHECKED:
        path = ROOT / name
        if path.is_file():
            yield path
            continue
        # os.walk does not follow links: each file is walked once.
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            yield from (Path(folder) / f for f in sorted(files) if f.endswith(".py"))


def lengths(path: Path):
    """(qualified name, lines) of each function and method in ``path``, nested ones too."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{child.name}", child.end_lineno - child.lineno + 1
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(path.read_text(), filename=str(path)), "")


def test_no_function_is_longer_than_80_lines():
    files = list(python_files())
    assert len(files) > 20  # the walk found the product
    too_long = [f"{p.relative_to(ROOT)}:{name}:{n}" for p in files for name, n in lengths(p) if n > MAX_LINES]
    assert not too_long, f"functions over {MAX_LINES} lines (split them): " + ", ".join(too_long)
