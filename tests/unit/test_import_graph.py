"""The import graph of the product, read with ``ast`` over ``llamarack/`` (the core) and
``roles/``: the core imports no role, a role imports another's public names only, and no
module imports itself back through others. Every import counts, at a module's top, in a
function or under ``TYPE_CHECKING``, and so does a lazy import's ``"module:attribute"``
string: an import moved into a function cannot hide a cycle, nor a string an edge."""

import ast
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("llamarack", "roles")
LAZY = re.compile(r"((?:llamarack|roles)(?:\.\w+)+):\w+")


def modules() -> dict:
    """{module name: its file} of both packages, as the tree on disk names them."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _known(name: str, mods: dict):
    """The module of the graph that ``name`` is, or is inside (a name imported from it)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, mods: dict):
    """(target module, the names taken from it, line) of each import in ``module``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if target := _known(alias.name, mods):
                    yield target, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in mods:  # a module of the package, imported by name
                    yield sub, (), node.lineno
                elif target := _known(base, mods):
                    yield target, (alias.name,), node.lineno
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (lazy := LAZY.fullmatch(node.value)):
            if target := _known(lazy.group(1), mods):
                yield target, (), node.lineno


def graph() -> tuple:
    mods = modules()
    edges = {(m, t, names, line) for m, path in mods.items() for t, names, line in imports(m, path, mods) if t != m}
    return mods, edges


def role(module: str) -> str:
    """The role a module is of (``roles.server.plan``: server), else its own name (the core's
    modules, and the roles' compositions: ``roles.audit``, ``roles.cli``...)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "roles" and len(parts) > 2 else module


def cycles(mods: dict, edges: set) -> list:
    """The strongly connected groups of more than one module (Tarjan's, without recursion)."""
    after = {m: sorted({t for s, t, _, _ in edges if s == m}) for m in mods}
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in mods:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = counter[0]
                counter[0] += 1
                stack.append(node)
                on.add(node)
            if i < len(after[node]):
                work.append((node, i + 1))
                nxt = after[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                group = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    group.append(top)
                    if top == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return found


def test_the_core_imports_no_role():
    _, edges = graph()
    up = sorted(f"{m}:{line} imports {t}" for m, t, _, line in edges
                if m.startswith("llamarack") and t.startswith("roles"))  # fmt: skip
    assert up == [], "the core (llamarack/) reaches into the roles:\n" + "\n".join(up)


def test_a_role_takes_no_private_name_of_another():
    _, edges = graph()
    private = sorted(f"{m}:{line} takes {t}.{n}" for m, t, names, line in edges for n in names
                     if t.startswith("roles.") and role(m) != role(t) and n.startswith("_"))  # fmt: skip
    private += sorted(f"{m}:{line} imports {t}" for m, t, _, line in edges
                      if role(m) != role(t) and any(p.startswith("_") and p != "__init__" for p in t.split(".")))
    assert private == [], "private names taken across roles:\n" + "\n".join(private)


def test_no_module_imports_itself_back():
    mods, edges = graph()
    found = cycles(mods, edges)
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_link_stands_in_for_a_package():
    links = [str(Path(folder, name).relative_to(ROOT)) for package in PACKAGES
             for folder, dirs, files in os.walk(ROOT / package) for name in dirs + files
             if Path(folder, name).is_symlink()]  # fmt: skip
    assert links == []


def test_the_core_finds_the_roles_commands_where_they_declare_them():
    """The core's command group names no subcommand: each is an entry point of pyproject.toml
    (``llamarack.commands``), a click command of the roles."""
    import pkgutil
    import tomllib

    import click

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["llamarack.commands"]
    assert set(declared) == {"settings", "audit", "plan", "plan-upgrade", "rollback", "rollout"}
    assert all(where.startswith("roles.") and isinstance(pkgutil.resolve_name(where), click.Command)
               for where in declared.values())  # fmt: skip


def test_the_graph_is_read_whole(tmp_path):
    """The walk sees what it must: both packages, an edge up from every role, a lazy
    ``"module:attribute"`` string and an import in a function, and a cycle where there is one."""
    mods, edges = graph()
    assert {"llamarack.settings", "roles.server.planner", "roles.cli"} <= set(mods) and len(mods) > 90
    assert {role(m) for m, t, _, _ in edges if t.startswith("llamarack") and m.startswith("roles.")} >= {
        "driver", "toolchain", "python_env", "llamacpp", "model", "server", "gateway", "preflight"}
    probe = tmp_path / "probe.py"
    probe.write_text('COMMAND = "roles.server.plan_cli:plan_command"\n\n\ndef f():\n    from roles import audit\n')
    assert set(imports("llamarack.probe", probe, mods)) == {("roles.server.plan_cli", (), 1), ("roles.audit", (), 5)}
    assert cycles({"a": 0, "b": 0, "c": 0}, {("a", "b", (), 1), ("b", "c", (), 1), ("c", "a", (), 1)}) == [
        ["a", "b", "c"]]
