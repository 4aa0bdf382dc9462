"""The benchmarks import the product where they run, often inside a function: every name a
script under ``bench/`` imports from llamarack, its roles or its lab must exist, so a
refactor that moves one breaks this test, not a bench run an hour into the lab."""

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("llamarack", "roles", "llamarack_lab")
SCRIPTS = sorted(p for p in (ROOT / "bench").rglob("*.py"))


def product_imports(path: Path) -> list:
    """(line, module, name) of each ``from MODULE import NAME`` of the product in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in PRODUCT:
            found += [(node.lineno, node.module, a.name) for a in node.names]
    return found


def test_the_benches_import_the_product():
    assert sum(len(product_imports(p)) for p in SCRIPTS) > 10  # the walk finds them (some inside functions)


@pytest.mark.parametrize("path", SCRIPTS, ids=[str(p.relative_to(ROOT)) for p in SCRIPTS])
def test_every_name_a_bench_imports_from_the_product_exists(path):
    missing = []
    for line, module, name in product_imports(path):
        try:
            found = importlib.import_module(module)
        except ImportError as e:
            missing.append(f"{path.name}:{line}: {module}: {e}")
            continue
        if not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")  # a submodule
            except ImportError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    assert not missing, missing
