# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Run on a host with an env's own python: resolve a pinned set, install it step by step, verify.

    python pyenv_check.py resolve PLAN_JSON INDEXES_FILE
    python pyenv_check.py install PLAN_JSON INDEXES_FILE STEP
    python pyenv_check.py verify PLAN_JSON

PLAN_JSON is ``EnvPlan.to_json()`` (roles/python_env/plan.py): each step
names its indexes by their place in INDEXES_FILE, a JSON list of URLs that
only root reads. A URL may carry a password or a token: it reaches pip in
its environment (``PIP_INDEX_URL``), never on a command line, which every
user of the host sees. Standard library and pip only (pip's vendored
``packaging``): it runs before anything else is in the env. pip runs
without any pip configuration of the host (``PIP_CONFIG_FILE=/dev/null``,
every other ``PIP_*`` variable dropped): the plan names every index.

resolve: one ``pip install --dry-run --report`` of every step that follows
dependencies, torch and numpy held by the plan's constraints. If pip finds
no solution, each cause it names is printed as ``conflict:`` and the exit
status is 1: nothing has been installed yet. Then the declared requirements
of the ``--no-deps`` steps (autoawq 0.2.7: ``torch>=2.5.1``,
``intel-extension-for-pytorch``...) are compared with the resolved set and
each mismatch is printed as ``conflict:`` naming the package that declares
it; those are expected (that is why the step skips dependencies) and do not
fail. install: step STEP (from 0), with the constraints (``--no-deps``
steps without), hash-checked (``--require-hashes``) when the step has
hashes. verify: import test, installed versions against the pins, and with
``torch_cuda`` set, torch's CUDA version and GPU architectures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from urllib.parse import urlsplit


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_env(index_urls) -> dict:
    """This process's environment for pip: no pip configuration of the host's, the
    indexes (a plain-HTTP one, named in the settings, trusted: the operator's choice)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_INDEX_URL"] = index_urls[0]
    if index_urls[1:]:
        env["PIP_EXTRA_INDEX_URL"] = " ".join(index_urls[1:])
    trusted = [urlsplit(url).hostname for url in index_urls if url.startswith("http://")]
    if trusted:
        env["PIP_TRUSTED_HOST"] = " ".join(trusted)
    return env


def pip_args(tmp, requirements, constraints=(), no_deps=False, hashes=()):
    """pip install's arguments for ``requirements`` (files written under ``tmp``)."""
    args = ["--no-input"]
    if constraints:
        path = os.path.join(tmp, "constraints.txt")
        with open(path, "w") as f:
            f.write("".join(c + "\n" for c in constraints))
        args += ["-c", path]
    if no_deps:
        args.append("--no-deps")
    if not hashes:
        return args + list(requirements)
    path = os.path.join(tmp, "requirements.txt")
    with open(path, "w") as f:
        f.write("".join(" ".join([r, *(f"--hash={h}" for h in hs)]) + "\n" for r, hs in zip(requirements, hashes)))
    return args + ["--require-hashes", "-r", path]


def step_urls(step, urls) -> list:
    return [urls[i] for i in step["index"]]


def dry_run(step, index_urls, constraints=()):
    """(returncode, {name: version, ...} or pip's stderr, [install items])."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        args = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                "--report", report, *pip_args(tmp, step["requirements"], constraints, step["no_deps"],
                                              step.get("hashes", ()))]  # fmt: skip
        proc = subprocess.run(args, capture_output=True, text=True, env=pip_env(index_urls))
        if proc.returncode != 0:
            return proc.returncode, proc.stdout + proc.stderr, []
        with open(report) as f:
            items = json.load(f)["install"]
    resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in items}
    return 0, resolved, items


def pip_conflicts(text: str) -> list:
    """The causes pip lists under "The conflict is caused by:", else its ERROR lines."""
    lines = text.splitlines()
    causes = []
    if "The conflict is caused by:" in text:
        start = lines.index(next(l for l in lines if "The conflict is caused by:" in l)) + 1
        for line in lines[start:]:
            if not line.strip():
                break
            causes.append(line.strip())
    return causes or [l.strip() for l in lines if l.startswith("ERROR:")] or [text.strip()[-500:]]


def resolve(plan: dict, urls: list) -> int:
    from pip._vendor.packaging.requirements import Requirement

    follow = [s for s in plan["steps"] if not s["no_deps"]]
    requirements = [r for s in follow for r in s["requirements"]]
    resolved = {}
    if follow:
        # The dependency-following steps' indexes, last first: pip treats them alike.
        indexes = list(dict.fromkeys(url for s in reversed(follow) for url in step_urls(s, urls)))
        rc, resolved, _ = dry_run({"requirements": requirements, "no_deps": False}, indexes, plan["constraints"])
        if rc != 0:
            print(f"resolve failed: {' '.join(requirements)} with constraints {plan['constraints']}")
            for cause in pip_conflicts(resolved):
                print(f"conflict: {cause}")
            return 1
        print("resolved: " + ", ".join(f"{n} {v}" for n, v in sorted(resolved.items())))

    for step in plan["steps"]:
        if not step["no_deps"]:
            continue
        rc, out, items = dry_run(step, step_urls(step, urls))
        if rc != 0:
            print(f"resolve failed: {' '.join(step['requirements'])} (--no-deps): {out.strip()[-500:]}")
            return 1
        for item in items:
            meta = item["metadata"]
            resolved[canonical(meta["name"])] = meta["version"]
            for text in meta.get("requires_dist") or []:
                req = Requirement(text)
                if req.marker and not req.marker.evaluate({"extra": ""}):
                    continue
                have = resolved.get(canonical(req.name))
                who = f"{meta['name']} {meta['version']} requires {req.name}{req.specifier}"
                why = f"({meta['name']} goes in with --no-deps: pip does not follow this)"
                if have is None:
                    print(f"conflict: {who}, which is not in the set {why}")
                elif not req.specifier.contains(have, prereleases=True):
                    print(f"conflict: {who}; the set has {req.name} {have} {why}")
    if not follow:  # a lock: its packages are the set
        print("resolved (the lock): " + ", ".join(f"{n} {v}" for n, v in sorted(resolved.items())))
    return 0


def verify(plan: dict) -> int:
    import importlib.metadata as metadata

    from pip._vendor.packaging.requirements import Requirement

    problems = []
    for statement in plan["imports"]:
        try:
            exec(statement, {})
        except Exception as e:  # any import failure is the finding
            problems.append(f"{statement!r} failed: {type(e).__name__}: {e}")
    for text in plan["require"]:
        req = Requirement(text)
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{req.name} is not installed (wanted {req.specifier})")
            continue
        if not req.specifier.contains(have, prereleases=True):
            problems.append(f"{req.name} {have} installed, wanted {req.specifier}")
    summary = ""
    if plan.get("torch_cuda"):
        import torch

        summary = f"; torch CUDA {torch.version.cuda}, archs {torch.cuda.get_arch_list()}"
        if torch.version.cuda != plan["torch_cuda"]:
            problems.append(f"torch is built for CUDA {torch.version.cuda}, wanted {plan['torch_cuda']}")
        missing = [a for a in plan.get("gpu_archs", []) if a not in torch.cuda.get_arch_list()]
        if missing:
            problems.append(f"torch has no kernels for {missing} (it has {torch.cuda.get_arch_list()})")
    if problems:
        for problem in problems:
            print(f"verify failed: {problem}")
        return 1
    print(f"verified: {'; '.join(plan['imports'])}; {', '.join(plan['require'])}{summary}")
    return 0


def install(plan: dict, urls: list, number: str) -> int:
    """Install step ``number`` of the plan; pip's own output is the step's."""
    step = plan["steps"][int(number)]
    constraints = () if step["no_deps"] else plan["constraints"]
    with tempfile.TemporaryDirectory() as tmp:
        args = pip_args(tmp, step["requirements"], constraints, step["no_deps"], step.get("hashes", ()))
        return subprocess.run([sys.executable, "-m", "pip", "install", *args],
                              env=pip_env(step_urls(step, urls))).returncode  # fmt: skip


def main(argv) -> int:
    command, plan = argv[1], json.loads(argv[2])
    if command == "verify":
        return verify(plan)
    with open(argv[3]) as f:
        urls = json.load(f)
    return {"resolve": resolve, "install": install}[command](plan, urls, *argv[4:])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
