"""Facts about the model artifacts under the llamarack root."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from pyinfra.api import FactBase
from pyinfra.api.exceptions import FactProcessError
from pyinfra.facts.files import Link

from llamarack import remote
from roles.model.files.model_fetch import BLOB_MTIME_NS
from llamarack.facts import FactRead
from llamarack.facts.value import FactValue


@dataclass(frozen=True)
class ArtifactState(FactValue):
    """What one ``models/<stamp>`` directory holds."""

    stamp: Optional[str]  # from its stamp.json; None when unsealed
    gguf_size: Optional[int]  # model.gguf's size now
    sealed_size: Optional[int]  # model.gguf's size when it was sealed
    record: Optional[dict] = None  # the whole stamp.json: what the artifact was made from
    signature: Optional[dict] = None  # model.gguf's size, mtime_ns and inode now

    @property
    def untouched(self) -> bool:
        """model.gguf is the file that was sealed: same size and, where the seal recorded
        one (artifacts sealed since it does), the same signature. An edit in place that
        keeps the size changes the mtime; a replaced file changes the inode."""
        sealed = ((self.record or {}).get("gguf") or {}).get("signature")
        return self.gguf_size is not None and self.gguf_size == self.sealed_size and \
            (sealed is None or sealed == self.signature)  # fmt: skip

    def complete_for(self, stamp: str) -> bool:
        """The artifact is the one wanted, and its GGUF is whole and untouched since its seal."""
        return self.stamp == stamp and self.untouched


class ModelArtifact(FactBase[Optional[ArtifactState]]):
    """Returns the state of a model artifact directory, or None when it does not exist.

    A directory without ``model.gguf`` and ``stamp.json`` (a leftover) has no stamp."""

    def command(self, path: str) -> str:
        d, gguf, stamp = (shlex.quote(p) for p in (path, f"{path}/model.gguf", f"{path}/stamp.json"))
        return (f"if [ -f {gguf} ] && [ -f {stamp} ]; then stat -c 'size %s %.9Y %i' {gguf}; cat {stamp}; "
                f"elif [ -e {d} ]; then echo unsealed; fi")

    def process(self, output) -> Optional[ArtifactState]:
        if not output:
            return None
        if output[0].strip() == "unsealed":
            return ArtifactState(None, None, None)
        try:
            head, size, mtime, inode = output[0].split()
            if head != "size":
                raise ValueError(output[0])
            seconds, _, fraction = mtime.partition(".")
            signature = {"size": int(size), "mtime_ns": int(seconds) * 10**9 + int(fraction.ljust(9, "0")[:9]),
                         "inode": int(inode)}  # fmt: skip
            record = json.loads("\n".join(output[1:]))
            return ArtifactState(record["stamp"], int(size), int(record["gguf"]["size"]), record, signature)
        except (ValueError, KeyError, TypeError) as e:
            raise FactProcessError(f"unreadable model artifact state: {e}") from e


@lru_cache(maxsize=None)
def shape_record_name() -> str:
    """The name of the shape record the model role writes beside each artifact's GGUF
    (``gguf_header.py --record``): ``shape-<the reader's digest>.json``, so that a changed
    reader answers from the header until the next deploy records again."""
    return f"shape-{hashlib.sha256(remote.source('gguf_header').encode()).hexdigest()[:16]}.json"


class GgufShape(FactBase[Optional[dict]]):
    """Returns what the context planner needs from a GGUF file's header, or None
    when the file does not exist. Read by the host's python3 running
    ``roles/model/files/gguf_header.py`` (standard library only; the tensors are not read).
    With ``recorded`` (the default), from the shape recorded beside the file when its
    artifact was sealed (``shape_record_name``), as long as the file is the one it was
    recorded from (size, mtime, inode); the same answer as the header's, without reading
    past a real tokenizer's 10^5 strings."""

    requires_command = "python3"

    def host_run(self, path: str, recorded: bool = True) -> tuple:
        return ("gguf_header", path, "--recorded", shape_record_name()) if recorded else ("gguf_header", path)

    def command(self, path: str, recorded: bool = True) -> str:
        return remote.command(*self.host_run(path, recorded))

    def process(self, output) -> Optional[dict]:
        try:
            data = json.loads("\n".join(output))
        except ValueError as e:
            raise FactProcessError(f"unreadable GGUF header report: {e}") from e
        if data.get("missing"):
            return None
        if "error" in data:
            raise FactProcessError(f"GGUF header of {data.get('path')}: {data['error']}")
        return data


# A content id as the blob cache names it: sha256:<64 hex> or git-sha1:<40 hex>.
_BLOB_ID = re.compile(r"(sha256):([0-9a-f]{64})|(git-sha1):([0-9a-f]{40})")


class CachedBlobs(FactBase[dict]):
    """Returns which of the content ids ``ids`` the host's blob cache (``cache``:
    ``<root>/cache/blobs``) holds as sound blobs, with each blob's size: those a
    fetch hardlinks instead of downloading (``model_fetch.BlobCache.lookup``: a
    regular file whose mtime is still the one every blob gets on insert; the
    caller compares the size with the one it expects). Ids of another shape are
    not asked."""

    @staticmethod
    def default() -> dict:
        return {}

    def command(self, cache: str, ids: tuple) -> str:
        names = [f"{m.group(1) or m.group(3)}/{m.group(2) or m.group(4)}"
                 for m in (_BLOB_ID.fullmatch(str(i)) for i in ids) if m]  # fmt: skip
        if not names:
            return "true"
        return (f"cd {shlex.quote(cache)} 2>/dev/null || exit 0; "
                f"for b in {' '.join(shlex.quote(n) for n in names)}; do "
                '[ -f "$b" ] && [ ! -L "$b" ] && stat -c \'%n %s %.9Y\' -- "$b"; done; true')

    def process(self, output) -> dict:
        blobs = {}
        for line in output:
            try:
                name, size, mtime = line.split()
                algo, hexdigest = name.split("/")
                seconds, _, fraction = mtime.partition(".")
                mtime_ns = int(seconds) * 10**9 + int(fraction.ljust(9, "0")[:9])
                if not _BLOB_ID.fullmatch(f"{algo}:{hexdigest}"):
                    raise ValueError(name)
            except ValueError as e:
                raise FactProcessError(f"unreadable blob cache line {line!r}: {e}") from e
            if mtime_ns == BLOB_MTIME_NS:  # else written to since it was cached: a miss
                blobs[f"{algo}:{hexdigest}"] = int(size)
        return blobs


class BlobCacheIndex(CachedBlobs):
    """Returns every sound blob of the host's blob cache (``cache``) with its size, as
    ``CachedBlobs`` reads the ones it is asked for: whether the cache holds a checkpoint."""

    def command(self, cache: str) -> str:  # type: ignore[override]
        return (f"cd {shlex.quote(cache)} 2>/dev/null || exit 0; "
                "find . -mindepth 2 -maxdepth 2 -type f -printf '%P %s %T@\\n'; true")


def reads(settings) -> tuple:
    """What the model role reads on a converged host: its part of preflight's one read."""
    if not settings.general.runs("model"):
        return ()
    layout = settings.layout
    paths = (layout.current_model, layout.draft_model) if settings.model.draft_repo else (layout.current_model,)
    return tuple(read for path in paths for read in (FactRead.of(ModelArtifact, path=path), FactRead.of(Link, path=path)))
