"""The model pipeline as one pyinfra operation: fetch, convert, quantize, seal, move into place.

Everything happens in ``<root>/models/.staging/<stamp16>/`` (mode 700) and
only a sealed artifact is renamed to ``<root>/models/<stamp16>``: a failed or
interrupted run leaves the staging to resume from (partial downloads resume
with HTTP Range; each step skips when its output exists) and never touches a
finished artifact. ``models/current`` then switches atomically.
"""

from __future__ import annotations

import json
import shlex
from io import StringIO
from pathlib import Path
from typing import Optional

from pyinfra import host
from pyinfra.api import FileUploadCommand, StringCommand, operation
from pyinfra.facts.files import Link

from .facts import FreeDiskBytes, ModelArtifact
from .hub import read_token
from .model_plan import ModelPlan
from .operations import refusal

FETCHER = Path(__file__).with_name("model_fetch.py")


def tools(root: str) -> dict:
    """Where the other roles put what this one runs (python env, llama.cpp roles)."""
    return {
        "python": "python3",  # the host's own: the fetcher needs only the standard library
        "convert_python": f"{root}/envs/convert/bin/python",
        "convert_script": f"{root}/src/llama.cpp/convert_hf_to_gguf.py",
        "quantize": f"{root}/builds/current/bin/llama-quantize",
    }


def _json(data: dict) -> StringIO:
    return StringIO(json.dumps(data, indent=1, sort_keys=True) + "\n")


@operation()
def artifact(plan: ModelPlan, token_file: Optional[str] = None, tool_paths: Optional[dict] = None):
    """
    Make the plan's GGUF artifact on the host unless it is already there, sealed and whole.

    + plan: the ``ModelPlan`` (llamarack.model_plan.plan_model)
    + token_file: file on the control machine holding the hub token, or None
    + tool_paths: override ``tools(plan.root)`` (python, convert_python, convert_script, quantize)

    The token goes to the host as a mode-600 file inside the mode-700 staging
    directory and is removed as soon as the fetch ends, whatever its result.
    """
    t = {**tools(plan.root), **(tool_paths or {})}
    q = shlex.quote
    d, s, name = plan.dir, plan.staging, plan.name
    current = f"{plan.models_dir}/current"

    state = host.get_fact(ModelArtifact, path=d)
    if state is not None and state.complete_for(plan.stamp):
        host.noop(f"model {name} is in place ({plan.source}, {plan.quant if plan.converts else 'as fetched'})")
    else:
        free = host.get_fact(FreeDiskBytes, path=plan.models_dir)
        need = plan.disk_needed()
        if free is not None and free < need:
            reason = (f"{host.name}: model-disk: found {free} bytes free under {plan.models_dir}; "
                      f"needed {need} (checkpoint, unquantized GGUF, quantized GGUF and 1 GiB). "
                      "Fix: free space or move llamarack_root to a bigger disk")  # fmt: skip
            yield refusal(reason)
            return
        if state is not None:
            # A directory with this name but no sealed, whole GGUF was never moved
            # here by us (the move is the last step): not a good output, so not kept.
            yield f"rm -rf {q(d)}"
        yield (f"install -d -m 755 {q(plan.models_dir)} && "
               f"install -d -m 700 {q(plan.models_dir + '/.staging')} {q(s)}")  # fmt: skip
        yield FileUploadCommand(str(FETCHER), f"{s}/model_fetch.py")
        yield FileUploadCommand(_json(plan.manifest()), f"{s}/manifest.json")
        yield FileUploadCommand(_json(plan.record()), f"{s}/stamp.plan.json")

        token = read_token(token_file)
        fetch = [t["python"], f"{s}/model_fetch.py", "fetch", "--manifest", f"{s}/manifest.json",
                 "--dest", f"{s}/hf" if plan.converts else s, "--retries", str(plan.retries)]  # fmt: skip
        cleanup = ""
        if token:
            yield FileUploadCommand(StringIO(token + "\n"), f"{s}/hub-token")
            yield f"chmod 600 {q(s + '/hub-token')}"
            fetch += ["--token-file", f"{s}/hub-token"]
            cleanup = f"; rc=$?; rm -f {q(s + '/hub-token')}; exit $rc"
        fetch_cmd = " ".join(q(a) for a in fetch)

        if not plan.converts:
            yield f"{fetch_cmd}{cleanup}"
        else:
            unquantized = f"{s}/model.gguf" if not plan.quantizes else f"{s}/model-{plan.outtype}.gguf"
            # Each step skips when its output exists, so a rerun resumes where one failed.
            yield f"if [ ! -f {q(unquantized)} ] && [ ! -f {q(s + '/model.gguf')} ]; then {fetch_cmd}{cleanup}; fi"
            yield (f"[ -f {q(unquantized)} ] || [ -f {q(s + '/model.gguf')} ] || "
                   f"{{ {q(t['convert_python'])} {q(t['convert_script'])} {q(s + '/hf')} "
                   f"--outtype {plan.outtype} --outfile {q(unquantized + '.tmp')} && "
                   f"mv {q(unquantized + '.tmp')} {q(unquantized)}; }}")  # fmt: skip
            if plan.quantizes:
                yield (f"[ -f {q(s + '/model.gguf')} ] || "
                       f"{{ {q(t['quantize'])} {q(unquantized)} {q(s + '/model.gguf.tmp')} {plan.quant} && "
                       f"mv {q(s + '/model.gguf.tmp')} {q(s + '/model.gguf')}; }}")  # fmt: skip
        yield (f"{q(t['python'])} {q(s + '/model_fetch.py')} seal --stamp {q(s + '/stamp.plan.json')} "
               f"--gguf {q(s + '/model.gguf')} --out {q(s + '/stamp.json')}")  # fmt: skip
        scratch = [f"{s}/model_fetch.py", f"{s}/manifest.json", f"{s}/stamp.plan.json"]
        if plan.converts and not plan.keep_intermediates:
            scratch += [f"{s}/hf"] + ([f"{s}/model-{plan.outtype}.gguf"] if plan.quantizes else [])
        yield "rm -rf " + " ".join(q(p) for p in scratch)
        # rename(2) of the whole directory: the artifact appears complete or not at all.
        # mv -T refuses to move into an existing non-empty directory: never overwrite.
        yield f"chmod 755 {q(s)} && mv -T {q(s)} {q(d)}"

    link = host.get_fact(Link, path=current)
    if not link or link.get("link_target") != name:
        yield (f"ln -sfn {q(name)} {q(current + '.new')} && "
               f"mv -T {q(current + '.new')} {q(current)}")  # fmt: skip
    else:
        host.noop(f"{current} already points at {name}")
