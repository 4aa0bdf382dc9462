"""What the model role will produce on a host: the artifact, its stamp and the steps to it.

Pure functions of the settings and the hub listing (no host, no network), so the role and
its tests share them. The artifact is content-addressed: its directory,
``<root>/models/<stamp16>``, is named by a sha256 over everything that decides the bytes of
its ``model.gguf`` (``artifact_stamp``); its ``stamp.json`` records the inputs and the
settings it was made from (``ModelPlan.record``), which ``plan_from_record`` and
``plan_from_pinned_record`` plan from without the hub (docs/ARCHITECTURE.md, "The model
role asks the hub only when it must").
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Mapping, Optional
from urllib.parse import quote

from llamarack.errors import ModelSourceError
from llamarack.layout import Layout
from roles.settings import Settings

# A URL as an artifact's record keeps it (stamp.json is readable by all): without the user and
# password, the query and the fragment (a signed URL's signature), which only the manifest carries.
from .files.model_fetch import url_shown as recorded_url
from .files.model_quality import KV_TYPES
from .hub import FULL_SHA, HubFile, HubListing, repo_path_problem


@dataclass(frozen=True)
class SourceFile(HubFile):
    """One file to fetch (``path``: under the fetch directory), with the hash the host checks it by."""

    size: Optional[int]
    git_sha1: Optional[str] = None
    url: Optional[str] = None  # for source url; else the hub's resolve URL

    def manifest_entry(self) -> dict:
        check = {"sha256": self.sha256} if self.sha256 else {"git_sha1": self.git_sha1}
        return {"path": self.path, "size": self.size, **check, **({"url": self.url} if self.url else {})}


@dataclass(frozen=True)
class ModelPlan:
    """The artifact one host must end up with, and how to make it."""

    root: str
    source: str  # hf, gguf or url
    stamp: str  # full sha256 hex
    files: tuple[SourceFile, ...]
    endpoint: Optional[str]
    repo: Optional[str]
    revision: Optional[str]  # the full commit sha the hub resolved
    quant: str
    outtype: str
    llamacpp_commit: str
    keep_intermediates: bool
    retries: int
    asked: tuple = ()
    """The settings it was planned from (``asked_inputs``), recorded with the artifact."""
    awq: tuple = ()
    """Route awq: AutoAWQ's quant_config and the calibration text's sha256, as (key, value)
    pairs (``awq_inputs``); () for route gguf."""
    calibration_file: Optional[str] = None
    """Route awq: the calibration text on the control machine."""
    quality_file: Optional[str] = None
    """The held-out text on the control machine a new artifact is measured on; None: not measured."""
    max_kld: Optional[float] = None
    keep_f16: bool = False

    @property
    def name(self) -> str:
        return self.stamp[:16]

    @property
    def models_dir(self) -> str:
        return Layout(self.root).models

    @property
    def dir(self) -> str:
        return f"{self.models_dir}/{self.name}"

    @property
    def staging(self) -> str:
        return f"{Layout(self.root).staging}/{self.name}"

    @property
    def converts(self) -> bool:
        return self.source == "hf"

    @property
    def quantizes(self) -> bool:
        return self.converts and self.quant not in ("F16", "BF16")

    @property
    def applies_awq(self) -> bool:
        return bool(self.awq)

    @property
    def measures(self) -> bool:
        """A new artifact's quality is measured against its f16 GGUF (a quantized conversion)."""
        return self.quantizes and self.quality_file is not None

    @property
    def source_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def blob_ids(self) -> tuple:
        """The content ids (``algo:hex``, the blob cache's names) of the files whose size is
        known: those the host's cache can stand in for (``CachedBlobs`` reads which it holds)."""
        return tuple(sorted({f.content_id for f in self.files if f.size is not None}))

    def to_download(self, cached: Mapping[str, int] = MappingProxyType({})) -> int:
        """Bytes of the source files the host's blob cache does not hold (``cached``:
        content id -> size of the sound blobs, the ``CachedBlobs`` fact): a cached file is
        hardlinked into the fetch and takes no new space, as ``model_fetch.check_disk`` counts."""
        return sum(f.size or 0 for f in self.files if f.size is None or cached.get(f.content_id) != f.size)

    def cache_holds(self, cached: Mapping[str, int]) -> bool:
        """Whether the blob cache (``cached``, as ``to_download`` takes it) holds the whole
        checkpoint: the artifact is made there without asking the hub."""
        return bool(self.blob_ids) and not self.to_download(cached)

    def disk_needed(self, cached: Mapping[str, int] = MappingProxyType({})) -> int:
        """Bytes the staging needs at its peak, with 1 GiB to spare.

        The checkpoint files the blob cache does not hold (``to_download``), plus
        (converting) an unquantized GGUF no bigger than a 16-bit checkpoint (the
        whole checkpoint counts, cached or not), plus the quantized file (at most
        ~8.5 bits per weight for Q8_0: ~0.55 of f16); route awq: the scaled checkpoint too
        (fp16, no bigger than the checkpoint); measured: 1 GiB more for the saved logits."""
        s = self.source_bytes
        need = self.to_download(cached)
        if self.converts:
            need += s + (s * 55 // 100 if self.quantizes else 0) + (s if self.applies_awq else 0)
        return need + (1 << 30) + ((1 << 30) if self.measures else 0)

    def describe_fetch(self, cached: Mapping[str, int] = MappingProxyType({})) -> str:
        """What the fetch brings, for the user who waits on it."""
        steps = "fetch, convert, quantize" if self.quantizes else "fetch, convert" if self.converts else "fetch"
        steps = steps.replace("fetch, ", "fetch, awq, ") if self.applies_awq else steps
        held = sum(1 for f in self.files if f.size is not None and cached.get(f.content_id) == f.size)
        return (f"{steps}: {len(self.files)} file(s), {self.source_bytes / 1e9:.2f} GB, {held} of them in the "
                f"host's blob cache ({self.to_download(cached) / 1e9:.2f} GB to download); "
                f"disk needed: {self.disk_needed(cached)} bytes")  # fmt: skip

    def manifest(self) -> dict:
        """What ``model_fetch.py fetch`` reads (no secret in it)."""
        return {"endpoint": self.endpoint, "repo": self.repo, "revision": self.revision,
                "files": [f.manifest_entry() for f in self.files]}

    def record(self) -> dict:
        """The stamp file's inputs part (``seal`` adds the GGUF's size and sha256)."""
        record = {"stamp": self.stamp, "source": self.source, "files": {f.path: f.content_id for f in self.files}}
        # The sizes the listing gave: with them, a later plan from this record can fetch
        # (a git-sha1 check needs the size) and count the disk without the hub.
        sizes = {f.path: f.size for f in self.files if f.size is not None}
        if sizes:
            record["sizes"] = sizes
        if self.repo:
            record.update(repo=self.repo, revision=self.revision)
        if self.source == "url":
            record["url"] = recorded_url(self.files[0].url)
        if self.converts:
            record.update(quant=self.quant, outtype=self.outtype, llamacpp_commit=self.llamacpp_commit)
        if self.applies_awq:
            record.update(route="awq", awq=dict(self.awq))
        # What the settings said, so a later run can tell without the hub that this
        # artifact is the one they still ask for (plan_from_record).
        record["asked"] = dict(self.asked)
        return record


def artifact_stamp(source: str, files, quant: str, outtype: str, llamacpp_commit: str, awq: tuple = ()) -> str:
    """sha256 over the inputs that decide the GGUF's bytes (and nothing else); ``awq`` (route
    awq's ``awq_inputs``) only when given, so a route gguf artifact keeps its stamp."""
    inputs: dict = {"source": source, "files": sorted([f.path, f.content_id] for f in files)}
    if source == "hf":
        # Prequantized files do not depend on our llama.cpp or quant settings.
        inputs.update(quant=quant, outtype=outtype, llamacpp_commit=llamacpp_commit)
        if awq:
            inputs["awq"] = dict(awq)
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


FILES = Path(__file__).resolve().parent / "files"


def calibration_file(settings: Settings) -> str:
    """The text AutoAWQ calibrates on (route awq): the operator's, or the one shipped."""
    return settings.model.awq_calibration_file or str(FILES / "calibration.txt")


def quality_file(settings: Settings) -> str:
    """The held-out text a new artifact's quality is measured on: the operator's, or the one shipped."""
    return settings.model.quality_text_file or str(FILES / "quality.txt")


def text_sha256(path: str, key: str) -> str:
    """The sha256 of a text file of the control machine (``key``: the setting naming it)."""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise ModelSourceError(f"{key}: cannot read {path}: {e.strerror}") from None


def awq_inputs(settings: Settings) -> tuple:
    """Route awq's inputs to the artifact's bytes, as sorted (key, value) pairs: AutoAWQ's
    quant_config and the calibration text's sha256; () for route gguf (or a source not hf)."""
    m = settings.model
    if m.route != "awq" or m.source != "hf":
        return ()
    awq = {"zero_point": m.awq_zero_point, "q_group_size": m.awq_q_group_size, "w_bit": m.awq_w_bit,
           "version": m.awq_version,
           "calibration_sha256": text_sha256(calibration_file(settings), "model_awq_calibration_file")}
    return tuple(sorted(awq.items()))


def pipeline_options(settings: Settings) -> dict:
    """The plan's route awq and quality fields (``ModelPlan``), from the settings. The held-out
    text is never the calibration text."""
    m, awq = settings.model, awq_inputs(settings)
    held_out = quality_file(settings) if m.quality and m.source == "hf" else None
    if held_out and awq and text_sha256(held_out, "model_quality_text_file") == dict(awq)["calibration_sha256"]:
        raise ModelSourceError(f"model_quality_text_file: given {held_out}, the calibration text; allowed: a "
                               "held-out text AutoAWQ did not calibrate on")  # fmt: skip
    return {"awq": awq, "calibration_file": calibration_file(settings) if awq else None, "quality_file": held_out,
            "max_kld": m.quality_max_kld, "keep_f16": m.keep_f16}


def select_hf_files(listing: HubListing, include) -> tuple[SourceFile, ...]:
    """The checkpoint files the converter needs, by the include patterns."""
    chosen = [f for f in listing.files if any(fnmatch.fnmatch(f.path, p) for p in include)]
    if not any(f.path.endswith(".safetensors") for f in chosen):
        names = ", ".join(f.path for f in listing.files) or "nothing"
        raise ModelSourceError(f"{listing.repo}@{listing.sha}: no *.safetensors file among the "
                               f"included files (model_hf_include); the repository has: {names}")  # fmt: skip
    return tuple(SourceFile(f.path, f.size, f.sha256, f.git_sha1) for f in chosen)


def asked_inputs(settings: Settings) -> tuple:
    """The settings that decide which artifact a host serves, as (key, value) pairs.

    Not the endpoint (a mirror serves the same bytes) nor the retries. The
    revision as given: a pinned commit always lists the same files."""
    m = settings.model
    asked = {"source": m.source, "quant": m.quant}
    if m.source == "url":
        asked.update(url=recorded_url(m.url), sha256=m.sha256)
    else:
        asked.update(repo=m.repo, revision=m.revision)
    if m.source == "gguf":
        asked["file"] = m.file
    if m.source == "hf":
        asked.update(include=list(m.hf_include), outtype=m.convert_outtype, llamacpp_commit=settings.llamacpp.commit)
    awq = awq_inputs(settings)
    if awq:
        asked.update(route="awq", awq=dict(awq))
    return tuple(sorted(json.loads(json.dumps(asked)).items()))


def _record_files(record: dict) -> tuple[SourceFile, ...]:
    """The source files a record names, with the sizes it gives (records made before
    they carried sizes give none)."""
    sizes, named = record.get("sizes") or {}, record.get("files")
    if not isinstance(sizes, dict) or not isinstance(named, dict):
        return ()
    files = []
    for path, cid in sorted(named.items()):
        algo, _, hexdigest = str(cid).partition(":")
        size = sizes.get(path)
        files.append(SourceFile(path, int(size) if isinstance(size, int) else None,
                                hexdigest if algo == "sha256" else None, hexdigest if algo == "git-sha1" else None))
    return tuple(files)


def plan_from_record(settings: Settings, state) -> Optional[ModelPlan]:
    """The plan of the artifact a host already serves (``state``: its ``ModelArtifact``), from
    its own record, when that record says it was made from what the settings ask now; else
    None. A converged rack so deploys with the hub unreachable. An artifact that must be made
    again (its GGUF truncated, or edited after its seal) is not planned here: the audit reads
    a plan from here as "the served artifact is the wanted one"."""
    if state is None or not state.record or not state.untouched:
        return None
    record = state.record
    asked = asked_inputs(settings)
    made_from = dict(record.get("asked") or {})
    if isinstance(made_from.get("url"), str):  # recorded before records left a URL's secrets out
        made_from["url"] = recorded_url(made_from["url"])
    if tuple(sorted(made_from.items())) != asked:
        return None
    return _plan(settings, stamp=record["stamp"], files=_record_files(record), repo=record.get("repo"),
                 revision=record.get("revision"), outtype=record.get("outtype", settings.model.convert_outtype),
                 asked=asked, **pipeline_options(settings))  # fmt: skip


def _plan(settings: Settings, **fields) -> ModelPlan:
    """A plan of the settings' model, with the ``fields`` its source or record gives."""
    m = settings.model
    return ModelPlan(root=settings.general.root, source=m.source, endpoint=m.hf_endpoint if m.source != "url" else None,
                     quant=m.quant, llamacpp_commit=settings.llamacpp.commit, keep_intermediates=m.keep_intermediates,
                     retries=m.fetch_retries, **fields)  # fmt: skip


# What a record's asked inputs may differ in from the settings' and still plan the new
# artifact from its files: the llama.cpp commit (a bump), and the revision as given (the
# record's ``revision``, the full sha the hub resolved, is compared instead).
_BUMPED = ("llamacpp_commit", "revision")


def plan_from_pinned_record(settings: Settings, state) -> Optional[ModelPlan]:
    """The plan of the artifact the settings ask for, made from the files the served
    artifact's record names, without asking the hub, where the settings differ from the
    record only in the llama.cpp commit and pin the revision by its full sha
    (docs/ARCHITECTURE.md, "The model role asks the hub only when it must"); else None.
    A record made before records carried the files' sizes is never planned from (a git-sha1
    check needs them)."""
    m = settings.model
    if m.source != "hf" or state is None or not state.record or not FULL_SHA.fullmatch(m.revision or ""):
        return None
    record = state.record
    made_from, wanted = record.get("asked") or {}, dict(asked_inputs(settings))
    if record.get("source") != "hf" or record.get("repo") != m.repo or record.get("revision") != m.revision:
        return None
    if any(made_from.get(k) != wanted.get(k) for k in set(made_from) | set(wanted) if k not in _BUMPED):
        return None
    files = _record_files(record)
    if not files or any(f.size is None or repo_path_problem(f.path) for f in files) \
            or not any(f.path.endswith(".safetensors") for f in files):  # fmt: skip
        return None
    # The record's files are the listing's selection: planned as that listing would be.
    listing = HubListing(m.repo, m.revision, tuple(HubFile(f.path, f.size, f.sha256, f.git_sha1 or "")
                                                   for f in files))  # fmt: skip
    return plan_model(settings, listing)


def plan_model(settings: Settings, listing: Optional[HubListing] = None) -> ModelPlan:
    """The plan for one host; ``listing`` is the hub's answer for sources hf and gguf."""
    m = settings.model
    if m.source == "url":
        # The file lands as model.gguf directly; its size is learnt from the server.
        files: tuple[SourceFile, ...] = (SourceFile("model.gguf", None, m.sha256, url=m.url),)
    elif m.source == "gguf":
        f = next((f for f in listing.files if f.path == m.file), None)
        if f is None:
            raise ModelSourceError(f"{m.repo}@{listing.sha} has no file {m.file!r}")
        if not f.sha256:
            raise ModelSourceError(f"{m.repo}/{m.file}: the hub gives no sha256 (not an LFS file)")
        # Fetched under the name model.gguf, so it gets its own resolve URL.
        resolve = f"{m.hf_endpoint.rstrip('/')}/{m.repo}/resolve/{listing.sha}/{quote(m.file)}"
        files = (SourceFile("model.gguf", f.size, f.sha256, url=resolve),)
    else:
        files = select_hf_files(listing, m.hf_include)

    options = pipeline_options(settings)
    stamp = artifact_stamp(m.source, files, m.quant, m.convert_outtype, settings.llamacpp.commit, options["awq"])
    return _plan(settings, stamp=stamp, files=files, repo=m.repo if m.source != "url" else None,
                 revision=listing.sha if listing else None, asked=asked_inputs(settings),
                 outtype=m.quant.lower() if m.quant in ("F16", "BF16") else m.convert_outtype, **options)  # fmt: skip


def quality_summary(quality) -> Optional[str]:
    """An artifact record's ``quality`` as one line (the audit, ``llamarack plan``): the f16
    GGUF's perplexity, and per KV type the quant's perplexity and mean KL divergence against
    it; None when the artifact was not measured."""
    if not isinstance(quality, dict):
        return None
    number = (int, float)
    base, kvs = quality.get("f16") or {}, quality.get("kv") or {}
    parts = [f"f16 GGUF PPL {base['ppl']:.4f}"] if isinstance(base.get("ppl"), number) else []
    for kv in sorted(kvs, key=lambda k: (k not in KV_TYPES, KV_TYPES.index(k) if k in KV_TYPES else 0, k)):
        v = kvs[kv]
        if isinstance(v, dict) and isinstance(v.get("kld"), number):
            ppl = f"PPL {v['ppl']:.4f}, " if isinstance(v.get("ppl"), number) else ""
            parts.append(f"{kv} KV: {ppl}KLD {v['kld']:.6f}")
    if quality.get("missing"):
        parts.append("not measured: " + ", ".join(str(m) for m in quality["missing"]))
    return "; ".join(parts) or None


def artifact_quality(gguf: str) -> Optional[dict]:
    """The ``quality`` of the artifact whose GGUF is ``gguf`` (its ``stamp.json`` beside it), or None."""
    try:
        with open(Path(gguf).parent / "stamp.json") as f:
            quality = json.load(f).get("quality")
    except (OSError, ValueError, AttributeError):
        return None
    return quality if isinstance(quality, dict) else None


def draft_settings(s: Settings) -> Optional[Settings]:
    """The settings the model role makes the draft artifact from: the model's, with the
    draft's source, repository, revision, file and quant; None when no draft is asked.
    Endpoint, token, include patterns, converter type and retries are the model's; the draft
    takes the gguf route and is not measured (it only proposes tokens the model checks)."""
    m = s.model
    if not m.draft_repo:
        return None
    draft = dataclasses.replace(m, source=m.draft_source, repo=m.draft_repo, revision=m.draft_revision,
                                file=m.draft_file, quant=m.draft_quant, url=None, sha256=None,
                                route="gguf", quality=False, quality_max_kld=None)  # fmt: skip
    return dataclasses.replace(s, model=draft)
