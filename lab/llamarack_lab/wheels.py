"""Wheelhouses (``pip download``, cached by requirement set) and a static PEP 503 index of them.

    house = wheelhouse(["torch==2.13.0", "transformers==4.44.2"], ["numpy<2"], cache=Path("/var/cache/llamarack"))
    write_index([house, ...], srv / "pypi")    # srv/pypi/simple/<project>/index.html, srv/pypi/files/*.whl

``wheelhouse`` runs ``pip download`` once per requirement set into
``<cache>/wheels/<hash>/`` (the machine's pip configuration applies, so torch
comes from the local wheel of these machines); a set is complete only once
its ``.done`` marker exists. Only wheels: nothing is ever built on a host.

The index is plain files, so any static file server serves it (the lab's
``python3 -m http.server``): ``<out>/simple/<project>/index.html`` links
each wheel as ``../../files/<wheel>#sha256=<digest>`` (pip checks the
digest), and ``<out>/files/`` holds hard links to the wheelhouses' files.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional
from urllib.parse import quote

from .cache import digest, locked, sha256_file  # noqa: F401 (sha256_file: also for tests)


def wheelhouse(
    requirements: Iterable[str], constraints: Iterable[str] = (), no_deps: bool = False, *,
    cache: Path, log: Optional[Callable[[str], None]] = None,
) -> Path:  # fmt: skip
    """A directory of the wheels ``requirements`` resolve to, downloaded once and cached."""
    requirements, constraints = list(requirements), list(constraints)
    key = digest(requirements, constraints, no_deps, sys.version_info[:2])
    house = Path(cache) / "wheels" / key
    done = house / ".done"
    if done.exists():
        return house
    with locked(house):
        if done.exists():
            return house
        shutil.rmtree(house, ignore_errors=True)
        house.mkdir(parents=True)
        started = time.monotonic()
        if log:
            log(f"downloading wheels: {' '.join(requirements)}" + (" (no deps)" if no_deps else ""))
        args = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:",
                "-d", str(house)]  # fmt: skip
        if no_deps:
            args.append("--no-deps")
        if constraints:
            (house / "constraints.txt").write_text("".join(c + "\n" for c in constraints))
            args += ["-c", str(house / "constraints.txt")]
        subprocess.run(args + requirements, check=True)
        done.write_text(f"{' '.join(requirements)}\n{time.monotonic() - started:.1f} s\n")
    return house


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project(filename: str) -> str:
    """The PEP 503 project name of a wheel file (``typing_extensions-4.12...`` -> ``typing-extensions``)."""
    return canonical(filename.split("-", 1)[0])


def root_page(projects: Iterable[str]) -> str:
    links = "".join(f'<a href="{n}/">{n}</a>\n' for n in sorted(set(projects)))
    return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"


def project_page(wheels: Mapping[str, str]) -> str:
    """The page of one project: ``wheels`` maps file name -> sha256; files live in ``../../files/``."""
    links = "".join(
        f'<a href="../../files/{quote(n)}#sha256={sha}">{html.escape(n)}</a>\n'
        for n, sha in sorted(wheels.items())
    )
    return f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"


def house_wheels(houses: Iterable[Path]) -> dict[str, Path]:
    """File name -> path of every wheel of ``houses`` (the first house wins a name)."""
    files: dict[str, Path] = {}
    for house in houses:
        for wheel in sorted(Path(house).glob("*.whl")):
            files.setdefault(wheel.name, wheel)
    return files


def write_index(houses: Iterable[Path], out: Path) -> Path:
    """Write the static index of ``houses`` to ``out`` (``simple/``, ``files/``); return ``out/simple``.

    Rewritten only when the set of wheels changed (``out/.stamp``), atomically:
    a server reading ``out`` never sees half an index.
    """
    files = house_wheels(houses)
    stamp = digest(sorted((n, p.stat().st_size) for n, p in files.items()))
    out = Path(out)
    if (out / ".stamp").is_file() and (out / ".stamp").read_text().strip() == stamp:
        return out / "simple"
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (staging / "files").mkdir()
        by_project: dict[str, dict[str, str]] = {}
        for name, path in files.items():
            target = staging / "files" / name
            try:
                os.link(path, target)  # same disk: no copy of a 190 MB torch wheel
            except OSError:
                shutil.copyfile(path, target)
            by_project.setdefault(project(name), {})[name] = sha256_file(path)
        simple = staging / "simple"
        simple.mkdir()
        (simple / "index.html").write_text(root_page(by_project))
        for name, wheels in by_project.items():
            (simple / name).mkdir()
            (simple / name / "index.html").write_text(project_page(wheels))
        (staging / "manifest.json").write_text(json.dumps(
            {p: sorted(w) for p, w in sorted(by_project.items())}, indent=1) + "\n")  # fmt: skip
        (staging / ".stamp").write_text(stamp + "\n")
        os.chmod(staging, 0o755)
        old = None
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
        os.rename(staging, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out / "simple"
