"""The model pipeline as one pyinfra operation: fetch, convert, quantize, seal, move into place.

Everything happens in ``<root>/models/.staging/<stamp16>/`` (mode 700) and
only a sealed artifact is renamed to ``<root>/models/<stamp16>``: a failed or
interrupted run leaves the staging to resume from (partial downloads resume
with HTTP Range; each step skips when its output exists) and never touches a
finished artifact. ``models/current`` then switches atomically.

Downloads go through the host's blob cache (``<root>/cache/blobs``, keyed by
the hub's content hashes): a file the cache holds is hardlinked, not fetched
again, so an artifact remade for a new llama.cpp commit or quant converts
from the checkpoint already on the host. Once an artifact is made, the blobs
that no artifact's record names any more are pruned.
"""

from __future__ import annotations

import json
import shlex
from io import StringIO
from typing import Optional

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, operation
from pyinfra.facts.files import File
from pyinfra.facts.files import Link

from llamarack import remote
from llamarack.roles.model.reads import CachedBlobs, ModelArtifact, shape_record_name
from llamarack.facts import FreeDiskBytes, read
from llamarack.layout import Layout
from llamarack.operations import executing, refusal, secret_upload
from llamarack.secrets import read_token

from .plan import ModelPlan


def tools(root: str) -> dict:
    """Where the other roles put what this one runs (python env, llama.cpp roles)."""
    layout = Layout(root)
    return {
        "python": "python3",  # the host's own: the fetcher needs only the standard library
        "convert_python": f"{layout.env('convert')}/bin/python",
        "convert_script": f"{layout.src}/convert_hf_to_gguf.py",
        "quantize": f"{layout.current_build}/bin/llama-quantize",
    }


def _logged(command: str, log: str, after: str = "") -> str:
    """``command`` with its output appended to ``log``; on failure the log's tail goes to
    stderr (what pyinfra shows), and ``after`` runs whatever the result."""
    q = shlex.quote
    return (f"{{ {command} >> {q(log)} 2>&1; rc=$?; {after + '; ' if after else ''}"
            f"[ $rc = 0 ] || {{ tail -n 40 {q(log)} >&2; exit $rc; }}; }}")  # fmt: skip


def _own_tmp(path: str) -> str:
    """``path``'s temporary name for this shell only (``.tmp.$$``, a shell word). A run whose
    SSH connection dropped leaves its command going on the host (no terminal, no SIGHUP):
    a re-run's step must not write into the file that one is still writing."""
    return f"{shlex.quote(path + '.tmp')}.$$"


def _into_place(tmp: str, path: str) -> str:
    """``durable_rename`` for an ``_own_tmp`` word: the bytes reach the disk (``sync FILE``
    is fsync(2)) before the name says the file is complete; a crash leaves no truncated
    file to seal."""
    return f"sync -- {tmp} && mv -f -- {tmp} {shlex.quote(path)}"


def _record_shape(gguf: str, python: str) -> str:
    """Record the GGUF's shape beside it (``gguf_header.py --record``): every later read of
    its ``GgufShape`` (each audit, each deploy's server plan) answers from the record while
    the file is the one recorded, instead of reading past its tokenizer again."""
    return remote.command("gguf_header", "--record", shape_record_name(), gguf, python=python)


def _json(data: dict) -> StringIO:
    return StringIO(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _fetcher(python: str, *args: str) -> str:
    """A ``model_fetch`` command (fetch, seal, prune-cache) run by the host's ``python``."""
    return remote.command("model_fetch", *args, python=python)


def _token_path(plan: ModelPlan) -> str:
    """Where the hub token lies on the host while a fetch runs (inside the mode-700 staging)."""
    return f"{plan.staging}/hub-token"


def _unquantized(plan: ModelPlan) -> str:
    """The converter's output: the artifact's GGUF itself, or the input of quantize."""
    s = plan.staging
    return f"{s}/model.gguf" if not plan.quantizes else f"{s}/model-{plan.outtype}.gguf"


def _disk_refusal(plan: ModelPlan, free: int, need: int, cached: dict) -> str:
    """Why the staging does not fit the disk, and what to do."""
    return (f"{host.name}: model-disk: found {free} bytes free under {plan.models_dir}; "
            f"needed {need} (checkpoint files not in the blob cache: {plan.to_download(cached)}, "
            "unquantized GGUF, quantized GGUF and 1 GiB). "
            "Fix: free space or move llamarack_root to a bigger disk")  # fmt: skip


def _staging(plan: ModelPlan):
    """The mode-700 staging directory, with the fetch's manifest and the plan's stamp record."""
    q, s = shlex.quote, plan.staging
    yield (f"install -d -m 755 {q(plan.models_dir)} && "
           f"install -d -m 700 {q(plan.models_dir + '/.staging')} {q(s)}")  # fmt: skip
    yield FileUploadCommand(_json(plan.manifest()), f"{s}/manifest.json")
    yield FileUploadCommand(_json(plan.record()), f"{s}/stamp.plan.json")


def _fetch(plan: ModelPlan, python: str, token_file: Optional[str], cached: dict, fetched: bool):
    """Fetch the source files into the staging through the blob cache, unless a GGUF was
    made from them already; the hub token goes up only for a fetch that runs."""
    q, s = shlex.quote, plan.staging
    fetch_cmd = _fetcher(python, "fetch", "--manifest", f"{s}/manifest.json", "--dest",
                         f"{s}/hf" if plan.converts else s, "--retries", str(plan.retries),
                         "--cache", Layout(plan.root).blob_cache)  # fmt: skip
    token_path = _token_path(plan)
    # A token of a run killed before its fetch ended goes first, whatever comes next.
    yield f"rm -f {q(token_path)} {q(token_path + '.new')}"
    if fetched:
        return
    token = read_token(token_file)
    after = ""
    if token:
        # Sent only for a fetch that runs; the fetcher deletes it once read, and
        # it is removed again here whatever the fetch's result.
        yield from secret_upload(token, token_path, mode="600")
        fetch_cmd += " --token-file " + q(token_path)
        after = f"rm -f {q(token_path)}"
    if executing():
        logger.info(f"{host.print_prefix}model {plan.name}: {plan.describe_fetch(cached)}; follow each step "
                    f"with: tail -f {s}/fetch.log (then convert.log, quantize.log)")  # fmt: skip
    yield _logged(fetch_cmd, f"{s}/fetch.log", after)


def _convert(plan: ModelPlan, t: dict):
    """Convert the checkpoint to a GGUF, then quantize it, each step skipped when its output exists."""
    q, s, unquantized = shlex.quote, plan.staging, _unquantized(plan)
    done = f"[ -f {q(unquantized)} ] || [ -f {q(s + '/model.gguf')} ]"
    tmp = _own_tmp(unquantized)
    convert = (f"{q(t['convert_python'])} {q(t['convert_script'])} {q(s + '/hf')} "
               f"--outtype {q(plan.outtype)} --outfile {tmp}")  # fmt: skip
    yield f"{done} || {{ {_logged(convert, f'{s}/convert.log')} && {_into_place(tmp, unquantized)}; }}"
    if plan.quantizes:
        tmp = _own_tmp(f"{s}/model.gguf")
        quantize = f"{q(t['quantize'])} {q(unquantized)} {tmp} {q(plan.quant)}"
        yield (f"[ -f {q(s + '/model.gguf')} ] || {{ {_logged(quantize, f'{s}/quantize.log')} && "
               f"{_into_place(tmp, s + '/model.gguf')}; }}")  # fmt: skip


def _seal(plan: ModelPlan, python: str):
    """Record the GGUF's shape and seal the staging (``stamp.json``), then clear its scratch."""
    q, s = shlex.quote, plan.staging
    yield _record_shape(f"{s}/model.gguf", python)
    yield _fetcher(python, "seal", "--stamp", f"{s}/stamp.plan.json", "--gguf", f"{s}/model.gguf",
                   "--out", f"{s}/stamp.json")  # fmt: skip
    # The token never goes into a served directory, whatever cut the fetch short.
    token_path = _token_path(plan)
    scratch = [f"{s}/manifest.json", f"{s}/stamp.plan.json", token_path, token_path + ".new"]
    if plan.converts and not plan.keep_intermediates:
        scratch += [f"{s}/hf"] + ([f"{s}/model-{plan.outtype}.gguf"] if plan.quantizes else [])
    # and what a step cut off (or still going on the host after its run died) wrote
    yield "rm -rf " + " ".join(q(p) for p in scratch) + f" {q(s)}/*.gguf.tmp.*"


def _move_into_place(plan: ModelPlan, state, python: str):
    """Rename the sealed staging to the artifact's directory, then prune the blob cache."""
    q, s, d = shlex.quote, plan.staging, plan.dir
    # rename(2) of the whole directory: the artifact appears complete or not at all.
    # mv -T refuses to move into an existing non-empty directory: never overwrite.
    if state is None:
        yield f"chmod 755 {q(s)} && mv -T {q(s)} {q(d)}"
    else:
        # A directory of this name that is not the sealed, untouched artifact (unsealed,
        # truncated, edited after its seal) may be what the server runs: it goes only
        # now, once its replacement is whole, and is moved aside, not over.
        aside = f"{plan.models_dir}/.staging/replaced-{plan.name}"
        yield (f"chmod 755 {q(s)} && rm -rf {q(aside)} && mv -T {q(d)} {q(aside)} && "
               f"mv -T {q(s)} {q(d)} && rm -rf {q(aside)}")  # fmt: skip
    # The new artifact's record names its files: the cache keeps what some record names.
    yield _fetcher(python, "prune-cache", "--cache", Layout(plan.root).blob_cache, "--models", plan.models_dir)


def _point_link(current: str, name: str, linked: Optional[dict]):
    """``current`` (``models/current`` or ``models/draft``) switched atomically to ``name``."""
    q = shlex.quote
    if not linked or linked.get("link_target") != name:
        yield (f"ln -sfn {q(name)} {q(current + '.new')} && "
               f"mv -T {q(current + '.new')} {q(current)}")  # fmt: skip
    else:
        host.noop(f"{current} already points at {name}")


@operation()
def artifact(plan: ModelPlan, token_file: Optional[str] = None, tool_paths: Optional[dict] = None,
             link: str = "current"):
    """
    Make the plan's GGUF artifact on the host unless it is already there, sealed and whole.

    + plan: the ``ModelPlan`` (llamarack.model_plan.plan_model)
    + token_file: file on the control machine holding the hub token, or None
    + tool_paths: override ``tools(plan.root)`` (python, convert_python, convert_script, quantize)
    + link: the link under ``models/`` that ends up pointing at it: ``current`` (the served
      model) or ``draft`` (the draft model of speculative decoding)

    The token goes to the host as a mode-600 file inside the mode-700 staging
    directory, only when a fetch runs, and is removed as soon as it ends,
    whatever its result. Fetch, convert and quantize each write a log in the
    staging directory (it becomes the artifact's), whose path is printed.
    """
    t = {**tools(plan.root), **(tool_paths or {})}
    d, s = plan.dir, plan.staging
    if link not in ("current", "draft"):
        raise ValueError(f"artifact: link {link!r} is neither 'current' nor 'draft'")
    current = f"{plan.models_dir}/{link}"

    # Read before this operation's first command (llamarack.facts.reading's rule).
    state = read(ModelArtifact, path=d)
    linked = read(Link, path=current)
    if state is not None and state.complete_for(plan.stamp):
        if read(File, path=f"{d}/{shape_record_name()}"):
            host.noop(f"model {plan.name} is in place ({plan.source}, "
                      f"{plan.quant if plan.converts else 'as fetched'})")  # fmt: skip
        else:
            # sealed before its shape was recorded, or recorded by another reader: once
            yield _record_shape(f"{d}/model.gguf", t["python"])
    else:
        free = read(FreeDiskBytes, path=plan.models_dir)
        # A rerun resumes where one failed: each step skips when its output exists,
        # and the fetch is past once a GGUF is made.
        fetched = plan.converts and any(read(File, path=p) for p in {_unquantized(plan), f"{s}/model.gguf"})
        # A source file the blob cache holds is hardlinked, not written again: only the
        # others count (as model_fetch.check_disk counts on the host).
        blobs = Layout(plan.root).blob_cache
        cached = (read(CachedBlobs, cache=blobs, ids=plan.blob_ids) if plan.blob_ids else None) or {}
        need = plan.disk_needed(cached)
        if free is not None and free < need:
            yield refusal(_disk_refusal(plan, free, need, cached))
            return
        yield from _staging(plan)
        yield from _fetch(plan, t["python"], token_file, cached, fetched)
        if plan.converts:
            yield from _convert(plan, t)
        yield from _seal(plan, t["python"])
        yield from _move_into_place(plan, state, t["python"])
    yield from _point_link(current, plan.name, linked)
