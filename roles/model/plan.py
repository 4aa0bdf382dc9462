"""What the model role will produce on a host: the artifact, its stamp and the steps to it.

Pure functions of the settings and the hub listing (no host, no network), so
the role and its tests share them.

The artifact is content-addressed: its directory name comes from the stamp,
a sha256 over everything that decides the bytes of ``model.gguf``: the source
files' content hashes, and for a converted checkpoint the quant type, the
converter's output type and the llama.cpp commit. Same inputs, same
directory: a host that has it does nothing. Other inputs, another directory:
the old artifact stays until the new one is complete (``models/current``
then moves).

    <root>/models/<stamp16>/model.gguf       the artifact
    <root>/models/<stamp16>/stamp.json       its record (inputs, gguf size and sha256)
    <root>/models/.staging/<stamp16>/        work in progress, moved into place when done
    <root>/models/current -> <stamp16>
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
from dataclasses import dataclass
from typing import Optional
from urllib.parse import quote

from llamarack.errors import ModelSourceError
from llamarack.layout import Layout
from llamarack.settings import Settings

from .hub import HubListing


@dataclass(frozen=True)
class SourceFile:
    """One file to fetch, with the hash the host checks it by."""

    path: str  # where it goes under the fetch directory
    size: Optional[int]
    sha256: Optional[str]
    git_sha1: Optional[str] = None
    url: Optional[str] = None  # for source url; else the hub's resolve URL

    @property
    def content_id(self) -> str:
        return f"sha256:{self.sha256}" if self.sha256 else f"git-sha1:{self.git_sha1}"

    def manifest_entry(self) -> dict:
        entry: dict = {"path": self.path, "size": self.size}
        if self.sha256:
            entry["sha256"] = self.sha256
        else:
            entry["git_sha1"] = self.git_sha1
        if self.url:
            entry["url"] = self.url
        return entry


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
    def gguf(self) -> str:
        return f"{self.dir}/model.gguf"

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
    def source_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    def disk_needed(self) -> int:
        """Bytes the staging needs at its peak, with 1 GiB to spare.

        The checkpoint, plus (converting) an unquantized GGUF no bigger than a
        16-bit checkpoint, plus the quantized file (at most ~8.5 bits per
        weight for Q8_0: ~0.55 of f16).
        """
        s = self.source_bytes
        if self.converts:
            s = s + s + (s * 55 // 100 if self.quantizes else 0)
        return s + (1 << 30)

    def describe_fetch(self) -> str:
        """What the fetch brings, for the user who waits on it."""
        steps = "fetch, convert, quantize" if self.quantizes else "fetch, convert" if self.converts else "fetch"
        return f"{steps}: {len(self.files)} file(s), {self.source_bytes / 1e9:.2f} GB"

    def manifest(self) -> dict:
        """What ``model_fetch.py fetch`` reads (no secret in it)."""
        return {
            "endpoint": self.endpoint,
            "repo": self.repo,
            "revision": self.revision,
            "files": [f.manifest_entry() for f in self.files],
        }

    def record(self) -> dict:
        """The stamp file's inputs part (``seal`` adds the GGUF's size and sha256)."""
        record = {
            "stamp": self.stamp,
            "source": self.source,
            "files": {f.path: f.content_id for f in self.files},
        }
        if self.repo:
            record.update(repo=self.repo, revision=self.revision)
        if self.source == "url":
            record["url"] = self.files[0].url
        if self.converts:
            record.update(quant=self.quant, outtype=self.outtype, llamacpp_commit=self.llamacpp_commit)
        # What the settings said, so a later run can tell without the hub that this
        # artifact is the one they still ask for (plan_from_record).
        record["asked"] = dict(self.asked)
        return record


def artifact_stamp(source: str, files, quant: str, outtype: str, llamacpp_commit: str) -> str:
    """sha256 over the inputs that decide the GGUF's bytes (and nothing else)."""
    inputs: dict = {"source": source, "files": sorted([f.path, f.content_id] for f in files)}
    if source == "hf":
        # Prequantized files do not depend on our llama.cpp or quant settings.
        inputs.update(quant=quant, outtype=outtype, llamacpp_commit=llamacpp_commit)
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


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
    revision as given: a pinned commit always lists the same files.
    """
    m = settings.model
    asked = {"source": m.source, "quant": m.quant}
    if m.source == "url":
        asked.update(url=m.url, sha256=m.sha256)
    else:
        asked.update(repo=m.repo, revision=m.revision)
    if m.source == "gguf":
        asked["file"] = m.file
    if m.source == "hf":
        asked.update(include=list(m.hf_include), outtype=m.convert_outtype, llamacpp_commit=settings.llamacpp.commit)
    return tuple(sorted(json.loads(json.dumps(asked)).items()))


def plan_from_record(settings: Settings, state) -> Optional[ModelPlan]:
    """The plan of the artifact a host already serves, from its own record, when
    that record says it was made from what the settings ask now; else None.

    ``state``: the ``ModelArtifact`` fact of ``models/current``. This is what
    lets a converged rack deploy with the hub unreachable: nothing to fetch,
    so nothing to ask the hub. An artifact that must be made again (its GGUF
    truncated, or edited after its seal) is planned from the hub's listing,
    whose sizes and hashes the fetch checks: the record has no sizes.
    """
    if state is None or not state.record or not state.untouched:
        return None
    record = state.record
    asked = asked_inputs(settings)
    if tuple(sorted((record.get("asked") or {}).items())) != asked:
        return None
    m = settings.model
    files = tuple(
        SourceFile(path, None, cid[len("sha256:"):] if cid.startswith("sha256:") else None,
                   cid[len("git-sha1:"):] if cid.startswith("git-sha1:") else None)
        for path, cid in sorted(record.get("files", {}).items())
    )  # fmt: skip
    return ModelPlan(
        root=settings.general.root,
        source=m.source,
        stamp=record["stamp"],
        files=files,
        endpoint=m.hf_endpoint if m.source != "url" else None,
        repo=record.get("repo"),
        revision=record.get("revision"),
        quant=m.quant,
        outtype=record.get("outtype", m.convert_outtype),
        llamacpp_commit=settings.llamacpp.commit,
        keep_intermediates=m.keep_intermediates,
        retries=m.fetch_retries,
        asked=asked,
    )


def plan_model(settings: Settings, listing: Optional[HubListing] = None) -> ModelPlan:
    """The plan for one host; ``listing`` is the hub's answer for sources hf and gguf."""
    m = settings.model
    if m.source == "url":
        # The file lands as model.gguf directly; its size is learnt from the server.
        files: tuple[SourceFile, ...] = (SourceFile("model.gguf", None, m.sha256, url=m.url),)
    elif listing is None:
        raise ModelSourceError(f"model_source={m.source!r} needs the hub listing of {m.repo}")
    elif m.source == "gguf":
        match = [f for f in listing.files if f.path == m.file]
        if not match:
            raise ModelSourceError(f"{m.repo}@{listing.sha} has no file {m.file!r}")
        f = match[0]
        if not f.sha256:
            raise ModelSourceError(f"{m.repo}/{m.file}: the hub gives no sha256 (not an LFS file)")
        # Fetched under the name model.gguf, so it gets its own resolve URL.
        resolve = f"{m.hf_endpoint.rstrip('/')}/{m.repo}/resolve/{listing.sha}/{quote(m.file)}"
        files = (SourceFile("model.gguf", f.size, f.sha256, url=resolve),)
    else:
        files = select_hf_files(listing, m.hf_include)

    stamp = artifact_stamp(m.source, files, m.quant, m.convert_outtype, settings.llamacpp.commit)
    return ModelPlan(
        root=settings.general.root,
        source=m.source,
        stamp=stamp,
        files=files,
        endpoint=m.hf_endpoint if m.source != "url" else None,
        repo=m.repo if m.source != "url" else None,
        revision=listing.sha if listing else None,
        quant=m.quant,
        outtype=m.quant.lower() if m.quant in ("F16", "BF16") else m.convert_outtype,
        llamacpp_commit=settings.llamacpp.commit,
        keep_intermediates=m.keep_intermediates,
        retries=m.fetch_retries,
        asked=asked_inputs(settings),
    )

