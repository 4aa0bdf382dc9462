"""The model pipeline as one pyinfra operation: fetch, convert, quantize, seal, move into place.

Everything happens in ``<root>/models/.staging/<stamp16>/`` and only a sealed artifact is
renamed to ``<root>/models/<stamp16>``: a failed or interrupted run leaves the staging to
resume from (each step skips when its output exists) and never touches a finished artifact;
``models/current`` then switches atomically. The steps run as the pipeline's own user, each
in its sandbox (``sandbox.py``), through the host's blob cache, and root takes over what
they made before it is sealed (``_take_over``): docs/ARCHITECTURE.md ("The model pipeline's
sandbox", "The checkpoint is downloaded once per host") says how. The hub token goes to
``/run/llamarack/`` (mode 600, root's), read on the fetch's standard input (``_fetch``).
"""

from __future__ import annotations

import json
import shlex
from io import StringIO
from pathlib import Path
from typing import Optional

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.facts.files import File
from pyinfra.facts.files import Link

from llamarack import remote, ship as shipping
from roles.llamacpp.files.llamacpp_proof import runtime_args
from roles.llamacpp.reads import LlamaServerFlags
from roles.model.reads import CachedBlobs, ModelArtifact, shape_record_name
from llamarack.facts import FreeDiskBytes, read
from llamarack.layout import Layout
from llamarack.operations import executing, private_upload, refusal, secret_upload
from llamarack.secrets import read_token

from . import sandbox, ship
from .files.model_quality import KV_TYPES, kld_problem
from .plan import ModelPlan, text_sha256

# The hub token's directory on a host: a tmpfs, root's.
TOKEN_DIR = "/run/llamarack"


def tools(root: str) -> dict:
    """Where the other roles put what this one runs (python env, llama.cpp roles)."""
    layout = Layout(root)
    return {"python": "python3",  # the host's own: the fetcher needs only the standard library
            "convert_python": f"{layout.env('convert')}/bin/python",
            "convert_script": f"{layout.src}/convert_hf_to_gguf.py",
            "quantize": f"{layout.current_build}/bin/llama-quantize",
            "awq_python": f"{layout.env('awq')}/bin/python",
            "perplexity": f"{layout.current_build}/bin/llama-perplexity"}


# llama-perplexity's context for the quality runs: the held-out text needs twice as many tokens.
QUALITY_CTX = 256


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
    """``durable_rename`` (``llamarack.operations``) for an ``_own_tmp`` word."""
    return f"sync -- {tmp} && mv -f -- {tmp} {shlex.quote(path)}"


def _record_shape(gguf: str, python: str) -> str:
    """Record the GGUF's shape beside it (``gguf_header.py --record``), which its later
    ``GgufShape`` reads answer from while the file is the one recorded."""
    return remote.command("gguf_header", "--record", shape_record_name(), gguf, python=python)


def _json(data: dict) -> StringIO:
    return StringIO(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _work(plan: ModelPlan) -> str:
    """The pipeline user's directory in the staging: the one place its steps write."""
    return f"{plan.staging}/work"


def _token_path(plan: ModelPlan) -> str:
    """Where the hub token lies on the host while a fetch starts: root's, on a tmpfs, never
    in a directory the pipeline user can write."""
    return f"{TOKEN_DIR}/hub-token-{plan.name}"


def _unquantized(plan: ModelPlan) -> str:
    """The converter's output: the artifact's GGUF itself, or the input of quantize."""
    return f"{_work(plan)}/{_unquantized_name(plan)}"


def _unquantized_name(plan: ModelPlan) -> str:
    return "model.gguf" if not plan.quantizes else f"model-{plan.outtype}.gguf"


def _made(plan: ModelPlan) -> set:
    """The GGUFs whose presence says the fetch is past: the staging's own (taken over), and
    for a conversion the work directory's unquantized or quantized one."""
    work = _work(plan)
    return {f"{plan.staging}/model.gguf"} | ({_unquantized(plan), f"{work}/model.gguf"} if plan.converts else set())


def _staging(plan: ModelPlan, user: str):
    """The staging (root's; the pipeline user's group may enter it), its work directory and the
    blob cache (the pipeline user's), and the fetch's manifest."""
    q, s = shlex.quote, plan.staging
    group = f'"$(id -g -- {q(user)})"'
    blobs = Layout(plan.root).blob_cache
    # .staging is only passed through by the pipeline user; it cannot list it.
    yield (f"install -d -m 755 {q(plan.models_dir)} && install -d -m 711 {q(plan.models_dir + '/.staging')} && "
           f"install -d -m 710 -g {group} {q(s)} && install -d -m 700 -o {q(user)} -g {group} {q(_work(plan))}")
    # The cache's directories become the user's (a cache root made them before); its
    # blobs stay whose they are: one root owns is copied into a fetch, not linked.
    yield (f"install -d -m 755 {q(Layout(plan.root).cache)} && install -d -m 700 -o {q(user)} -g {group} {q(blobs)} "
           f"&& find {q(blobs)} -mindepth 1 -maxdepth 1 -type d ! -user {q(user)} "
           f"-exec chown -h -- {q(user + ':')} {{}} +")  # fmt: skip
    # and the texts the AWQ step calibrates on and the quality runs measure on: root's, read by the steps
    texts = {"calibration.txt": plan.calibration_file, "quality.txt": plan.quality_file if plan.measures else None}
    uploads = [("manifest.json", _json(plan.manifest()))]
    uploads += [(name, StringIO(Path(local).read_text())) for name, local in texts.items() if local]
    for name, text in uploads:
        yield from private_upload(text, f"{s}/{name}")
        yield f"chmod 644 {q(f'{s}/{name}')}"


def _fetch(plan: ModelPlan, python: str, token_file: Optional[str], cached: dict, fetched: bool, user: str,
           announce: bool = True):
    """Fetch the source files into the work directory through the blob cache, as the pipeline
    user in its sandbox, unless a GGUF was made from them already; the hub token goes up
    only for a fetch that runs. ``announce``: say so now (``fetch_note``), not when it runs."""
    q, s, work = shlex.quote, plan.staging, _work(plan)
    words = [python, "-c", remote.source("model_fetch"), "fetch", "--manifest", f"{s}/manifest.json", "--dest",
             f"{work}/hf" if plan.converts else work, "--retries", str(plan.retries),
             "--cache", Layout(plan.root).blob_cache]  # fmt: skip
    token_path = _token_path(plan)
    # A token of a run killed before its fetch started goes first, whatever comes next.
    yield f"rm -f {q(token_path)} {q(token_path + '.new')}"
    if fetched:
        return
    token = read_token(token_file)
    after = ""
    if token:
        # Sent only for a fetch that runs. Root's shell opens it as the fetch's standard
        # input and removes its name before the fetch starts; removed again after it.
        yield from secret_upload(token, token_path, mode="600")
        step = sandbox.fetch(words + ["--token-file", "-"], user, plan.root, work)
        run = f"{{ rm -f -- {q(token_path)} && {step}; }} < {q(token_path)}"
        after = f"rm -f {q(token_path)}"
    else:
        run = f"{sandbox.fetch(words, user, plan.root, work)} < /dev/null"
    if announce and executing():
        logger.info(host.print_prefix + fetch_note(plan, cached))
    yield _logged(run, f"{s}/fetch.log", after)


def fetch_note(plan: ModelPlan, cached: dict) -> str:
    """What a fetch that runs says first: what it fetches, and where to follow it."""
    return (f"model {plan.name}: {plan.describe_fetch(cached)}; follow each step with: tail -f "
            f"{plan.staging}/fetch.log (then convert.log, quantize.log)")


def _convert(plan: ModelPlan, t: dict, user: str):
    """Convert the checkpoint to a GGUF, then quantize it, each step skipped when its output
    exists, each as the pipeline user in its offline sandbox; the checkpoint is read-only there."""
    q, s, work, unquantized = shlex.quote, plan.staging, _work(plan), _unquantized(plan)
    done = " || ".join(f"[ -f {q(p)} ]" for p in sorted(_made(plan)))
    # The step's temporary name has the sandbox's shell's pid ($$ there).
    tmp = _own_tmp(unquantized)
    checkpoint = f"{work}/awq" if plan.applies_awq else f"{work}/hf"
    convert = (f"{q(t['convert_python'])} {q(t['convert_script'])} {q(checkpoint)} "
               f"--outtype {q(plan.outtype)} --outfile {tmp} && {_into_place(tmp, unquantized)}")  # fmt: skip
    step = sandbox.offline("convert", ["/bin/sh", "-c", convert], user, work, readonly=[f"{work}/hf"])
    yield f"{done} || {_logged(step + ' < /dev/null', f'{s}/convert.log')}"
    if plan.quantizes:
        gguf, tmp = f"{work}/model.gguf", _own_tmp(f"{work}/model.gguf")
        quantize = f"{q(t['quantize'])} {q(unquantized)} {tmp} {q(plan.quant)} && {_into_place(tmp, gguf)}"
        step = sandbox.offline("quantize", ["/bin/sh", "-c", quantize], user, work, readonly=[f"{work}/hf"])
        yield (f"[ -f {q(gguf)} ] || [ -f {q(s + '/model.gguf')} ] || "
               f"{_logged(step + ' < /dev/null', f'{s}/quantize.log')}")  # fmt: skip


def _awq(plan: ModelPlan, t: dict, user: str, devices: tuple):
    """Route awq: AutoAWQ's scales applied into the checkpoint's fp16 weights (``awq_apply.py``,
    the AWQ env's python) into ``work/awq``, as the pipeline user in its offline sandbox, on
    the GPU where the host has one; skipped once it, or a GGUF made from it, exists. A cut
    step leaves only its own temporary directory, removed when the step starts again."""
    q, s, work = shlex.quote, plan.staging, _work(plan)
    scaled, tmp = f"{work}/awq", _own_tmp(f"{work}/awq")
    a = dict(plan.awq)
    apply = remote.command("awq_apply", "--model", f"{work}/hf", "--calibration", f"{s}/calibration.txt",
                           "--zero-point", "true" if a["zero_point"] else "false",
                           "--q-group-size", str(a["q_group_size"]), "--w-bit", str(a["w_bit"]),
                           "--version", a["version"], python=t["awq_python"])  # fmt: skip
    run = f"rm -rf -- {q(scaled + '.tmp')}.* && {apply} --out {tmp} && sync -f -- {tmp} && mv -T -- {tmp} {q(scaled)}"
    step = sandbox.offline("awq", ["/bin/sh", "-c", run], user, work, readonly=[f"{work}/hf"], devices=devices)
    done = " || ".join(f"[ -e {q(p)} ]" for p in sorted(_made(plan) | {scaled}))
    yield f"{done} || {_logged(step + ' < /dev/null', f'{s}/awq.log')}"


# llama-perplexity's log thread may lose the last lines, the figures among them, when it
# exits (llama.cpp never flushes it there: its issue 22142): a run whose output lacks its
# figure is run again, up to this many times in all, before its log is kept as it is.
MEASURE_TRIES = 3
# What made the loss common: OpenMP's threads spin between parallel regions, and on a host of
# few cores they keep the log thread off the CPU until the process exits (a lab host, 2 cores:
# 7 of 12 runs lost their figure; with passive waiting 0 of 20, and the runs were no slower).
MEASURE_ENV = (("OMP_WAIT_POLICY", "PASSIVE"),)


def _measured(command: str, log: str, figure: str) -> str:
    """``command`` with its output in ``log``, which appears only once the run succeeded (a log
    there is a measurement done: a rerun skips it); on failure the output's tail goes to stderr.
    A run whose output lacks ``figure`` (a fixed string of the line that holds it) runs again."""
    q, tmp = shlex.quote, log + ".tmp"
    return (f"[ -f {q(log)} ] || {{ for try in $(seq {MEASURE_TRIES}); do {command} > {q(tmp)} 2>&1 || "
            f"{{ rc=$?; tail -n 40 {q(tmp)} >&2; exit $rc; }}; grep -qF -- {q(figure)} {q(tmp)} && break; done; "
            f"mv -f -- {q(tmp)} {q(log)}; }}")  # fmt: skip


def _measure(plan: ModelPlan, t: dict, user: str, devices: tuple, proven: tuple):
    """The quality runs, each as the pipeline user in its offline sandbox: llama-perplexity on the
    held-out text, first the f16 GGUF saving its logits (``--kl-divergence-base``), then the
    quantized GGUF against them for each KV type (``--kl-divergence``), their logs in the
    staging; skipped once the GGUF was taken over. ``proven``: the runtime switches the build's
    proof needed (``ServerFlags.proven_args``), which every run takes."""
    q, s, work = shlex.quote, plan.staging, _work(plan)
    logits = f"{work}/quality.logits"
    common = ["-c", str(QUALITY_CTX), "-b", str(QUALITY_CTX), "--kl-divergence-base", logits] + \
        (["-ngl", "999"] if devices else []) + runtime_args("llama-perplexity", proven)  # fmt: skip
    runs = [("f16", [t["perplexity"], "-m", _unquantized(plan), "-f", f"{s}/quality.txt", *common])]
    runs += [(f"kv-{kv}", [t["perplexity"], "-m", f"{work}/model.gguf", *common, "--kl-divergence",
                           "-ctk", kv, "-ctv", kv, "-fa", "on"]) for kv in KV_TYPES]  # fmt: skip
    for name, words in runs:
        step = sandbox.offline(f"quality {name}", words, user, work, devices=devices, env=MEASURE_ENV)
        figure = "Final estimate: PPL" if name == "f16" else "Mean    KLD:"
        yield f"[ -f {q(s + '/model.gguf')} ] || {_measured(step + ' < /dev/null', f'{s}/quality-{name}.log', figure)}"


def _take_over(plan: ModelPlan):
    """Once the pipeline user's steps are done, what they made becomes root's, as
    docs/ARCHITECTURE.md ("The model pipeline's sandbox") says: refused (and removed) with a
    link or a special file; else what is kept is renamed into the staging and checked again
    there (the pipeline user cannot write the staging: what is checked there is what is kept,
    whatever a step still going from a killed run does), owned by root, no set-id bit."""
    q, s, work = shlex.quote, plan.staging, _work(plan)
    keep = ["model.gguf"]
    if plan.converts and plan.keep_intermediates:
        keep += ["hf"] + ([_unquantized_name(plan)] if plan.quantizes else [])
    elif plan.measures and plan.keep_f16:
        keep += [_unquantized_name(plan)]
    names = " ".join(q(n) for n in keep)
    refused = refusal(f"{host.name}: model {plan.name}: its pipeline left links or special files in {work}: "
                      "refusing what it made (removed). A checkpoint's own code may do that; "
                      "check the repository").get_raw_value()  # fmt: skip
    odd = '"$(find {} ! -type f ! -type d -print -quit)"'
    yield f"""if [ -d {q(work)} ]; then
  if [ -n {odd.format(q(work) + ' -mindepth 1')} ]; then rm -rf -- {q(work)}; {refused}; fi
  for n in {names}; do
    if [ -e {q(work)}/"$n" ] || [ -L {q(work)}/"$n" ]; then
      rm -rf -- {q(s)}/"$n" && mv -T -- {q(work)}/"$n" {q(s)}/"$n" || exit 1
    fi
  done
  rm -rf -- {q(work)}
fi
for n in {names}; do
  [ -e {q(s)}/"$n" ] || [ -L {q(s)}/"$n" ] || continue
  if [ -L {q(s)}/"$n" ] || [ -n {odd.format(q(s) + '/"$n"')} ]; then rm -rf -- {q(s)}/"$n"; {refused}; fi
  chown -R root:root -- {q(s)}/"$n" && chmod -R a+rX,go-w,ug-s -- {q(s)}/"$n" || exit 1
done
chown root:root {q(s)} && chmod 700 {q(s)}"""


def _seal(plan: ModelPlan, python: str):
    """Record the GGUF's shape and seal the staging (``stamp.json``), then clear its scratch."""
    q, s = shlex.quote, plan.staging
    yield from private_upload(_json(plan.record()), f"{s}/stamp.plan.json")
    if plan.measures:
        yield remote.command("model_quality", "record", "--stamp", f"{s}/stamp.plan.json", "--logs", s,
                             "--text-sha256", text_sha256(plan.quality_file, "model_quality_text_file"),
                             "--ctx", str(QUALITY_CTX), python=python)  # fmt: skip
    yield _record_shape(f"{s}/model.gguf", python)
    yield remote.command("model_fetch", "seal", "--stamp", f"{s}/stamp.plan.json", "--gguf", f"{s}/model.gguf",
                         "--out", f"{s}/stamp.json", python=python)  # fmt: skip
    # The token never outlives the run, whatever cut the fetch short.
    token_path = _token_path(plan)
    scratch = [f"{s}/manifest.json", f"{s}/stamp.plan.json", token_path, token_path + ".new"]
    scratch += [f"{s}/calibration.txt"] if plan.applies_awq else []
    scratch += [f"{s}/quality.txt"] if plan.measures else []
    if plan.converts and not plan.keep_intermediates:
        # (a staging made before the work directory held them)
        scratch += [f"{s}/hf"]
        if plan.quantizes and not (plan.measures and plan.keep_f16):
            scratch.append(f"{s}/model-{plan.outtype}.gguf")
    # and what a step cut off (or still going on the host after its run died) wrote
    yield "rm -rf " + " ".join(q(p) for p in scratch) + f" {q(s)}/*.gguf.tmp.*"


def _move_into_place(plan: ModelPlan, state, python: str, sealed: Optional[str] = None):
    """Rename the sealed staging (or ``sealed``: a received artifact) to the artifact's
    directory, then prune the blob cache."""
    q, s, d = shlex.quote, sealed or plan.staging, plan.dir
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
    yield remote.command("model_fetch", "prune-cache", "--cache", Layout(plan.root).blob_cache,
                         "--models", plan.models_dir, python=python)


def _pipeline(plan: ModelPlan, state, t: dict, fetch, user: str, devices: tuple, proven: tuple) -> list:
    """The commands that make the artifact here, from its staging to its place (``fetch``:
    the fetch's commands); each step skips what a cut run already made."""
    make = [*_staging(plan, user), *fetch]
    if plan.applies_awq:
        make += _awq(plan, t, user, devices)
    if plan.converts:
        make += _convert(plan, t, user)
    if plan.measures:
        make += _measure(plan, t, user, devices, proven)
    return make + [*_take_over(plan), *_seal(plan, t["python"]), *_move_into_place(plan, state, t["python"])]


@operation()
def artifact(plan: ModelPlan, token_file: Optional[str] = None, tool_paths: Optional[dict] = None,
             link: str = "current", user: str = sandbox.PIPELINE_USER, devices: tuple = (),
             ship_artifacts: bool = False):
    """Make the plan's GGUF artifact on the host unless it is already there, sealed and whole.

    + plan: the ``ModelPlan`` (``plan.plan_model``)
    + token_file: file on the control machine holding the hub token, or None
    + tool_paths: override ``tools(plan.root)`` (python, convert_python, convert_script, quantize)
    + link: the link under ``models/`` that ends up pointing at it: ``current`` (the served
      model) or ``draft`` (the draft model of speculative decoding)
    + user: the unprivileged system user fetch, convert and quantize run as (it must exist)
    + devices: the GPU's character device names (``/proc/devices``) the AWQ and quality runs
      may open (a CUDA host); () runs them on the CPU
    + ship_artifacts: make the artifact once in the run and ship it to the other hosts that
      need it (``ship.py``); a host that holds it, sealed, is a source

    Route awq applies AutoAWQ's scales before the convert (``awq.log``). A new quantized
    artifact with ``plan.quality_file`` is measured by llama-perplexity before it is taken
    over (``quality-*.log``), the figures go into its record, and with ``plan.max_kld`` an
    artifact above the bound is refused: ``models/current`` is not switched to it. Each step
    writes a log in the staging directory (it becomes the artifact's), whose path is printed."""
    t = {**tools(plan.root), **(tool_paths or {})}
    d = plan.dir
    if link not in ("current", "draft"):
        raise ValueError(f"artifact: link {link!r} is neither 'current' nor 'draft'")
    current = f"{plan.models_dir}/{link}"

    # Read before this operation's first command (llamarack.facts.reading's rule).
    state, linked = read(ModelArtifact, path=d), read(Link, path=current)
    flags = read(LlamaServerFlags, root=plan.root) if plan.measures else None  # the build's proven switches
    if state is not None and state.complete_for(plan.stamp):
        if ship_artifacts:
            shipping.hold(ship.key(plan), d)
        problem = kld_problem((state.record or {}).get("quality"), plan.max_kld, f"{host.name}: model {plan.name}")
        if problem and link == "current":
            yield refusal(problem)
            return
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
        fetched = any(read(File, path=p) for p in sorted(_made(plan)))
        # A source file the blob cache holds is hardlinked, not written again: only the
        # others count (as model_fetch.check_disk counts on the host).
        blobs = Layout(plan.root).blob_cache
        cached = (read(CachedBlobs, cache=blobs, ids=plan.blob_ids) if plan.blob_ids else None) or {}
        need = plan.disk_needed(cached)
        if free is not None and free < need:
            yield refusal(f"{host.name}: model-disk: found {free} bytes free under {plan.models_dir}; "
                          f"needed {need} (checkpoint files not in the blob cache: {plan.to_download(cached)}, "
                          "unquantized GGUF, quantized GGUF and 1 GiB). "
                          "Fix: free space or move llamarack_root to a bigger disk")  # fmt: skip
            return
        fetch = _fetch(plan, t["python"], token_file, cached, fetched, user, announce=not ship_artifacts)
        make = _pipeline(plan, state, t, fetch, user, devices, flags.proven_args if flags else ())
        if not ship_artifacts:
            yield from make
        else:
            if fetched or plan.cache_holds(cached):
                shipping.prefer(ship.key(plan))  # made here without asking the hub
            place = list(_move_into_place(plan, state, t["python"], sealed=ship.incoming(plan)))
            note = None if fetched else fetch_note(plan, cached)  # said by the host that makes it
            yield FunctionCommand(ship.obtain, (plan, make, t["python"], place, note), {})
        if plan.measures and plan.max_kld is not None:
            # the bound, on the figures just recorded: refused, the link stays where it is
            yield remote.command("model_quality", "check", "--stamp", f"{d}/stamp.json", "--max-kld",
                                 str(plan.max_kld), "--name", f"{host.name}: model {plan.name}", python=t["python"])
    # switched atomically
    if (linked or {}).get("link_target") == plan.name:
        host.noop(f"{current} already points at {plan.name}")
    else:
        new = shlex.quote(current + ".new")
        yield f"ln -sfn {shlex.quote(plan.name)} {new} && mv -T {new} {shlex.quote(current)}"
