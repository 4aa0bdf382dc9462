# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Read what the context planner needs from a GGUF file's header.

Standard library only: the ``GgufShape`` fact runs this file's source with
the host's python3 (``python3 -c``), where no gguf package is installed.

    python3 gguf_header.py MODEL.gguf   -> one JSON line (or {"missing": true})

GGUF layout (v2/v3, little-endian): magic ``GGUF``, uint32 version, uint64
tensor count, uint64 metadata count, then the metadata: key (uint64 length,
UTF-8), uint32 value type, value. Only the metadata is read, never the
tensors, so this takes milliseconds on a 15 GB file.
"""

from __future__ import annotations

import json
import os
import struct
import sys

# GGUF metadata value types: struct format of the scalar ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
# Keys under "<architecture>." that the planner reads.
_ARCH_KEYS = ("block_count", "context_length", "embedding_length", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "attention.value_length")  # fmt: skip


class GgufError(ValueError):
    pass


def _read(f, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GgufError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _string(f) -> str:
    n = _read(f, "<Q")
    data = f.read(n)
    if len(data) != n:
        raise GgufError("truncated GGUF header")
    return data.decode("utf-8", errors="replace")


def _value(f, vtype: int, keep: bool):
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(f)
    if vtype == _ARRAY:
        itype, count = _read(f, "<I"), _read(f, "<Q")
        if itype in _SCALARS and not keep:
            f.seek(count * struct.calcsize(_SCALARS[itype]), os.SEEK_CUR)  # vocab scores etc.
            return None
        items = [_value(f, itype, keep) for _ in range(count)]
        return items if keep else None
    raise GgufError(f"unknown GGUF value type {vtype}")


def read_metadata(path: str, wanted=None) -> dict:
    """The metadata of the GGUF at ``path``: all keys, or only those in ``wanted``
    (a predicate on the key; other values are skipped, not kept)."""
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GgufError(f"{path} is not a GGUF file")
        version = _read(f, "<I")
        if version < 2:
            raise GgufError(f"GGUF version {version} is not supported (needs 2 or later)")
        _read(f, "<Q")  # tensor count
        meta = {"gguf.version": version}
        for _ in range(_read(f, "<Q")):
            key = _string(f)
            keep = wanted is None or wanted(key)
            value = _value(f, _read(f, "<I"), keep)
            if keep:
                meta[key] = value
        return meta


def read_shape(path: str) -> dict:
    """What the planner needs: file size, architecture, layers, trained context,
    KV heads and head sizes (a per-layer KV head list is reduced to its largest)."""
    meta = read_metadata(path, lambda k: k == "general.architecture" or k.endswith(_ARCH_KEYS)
                         or k == "general.file_type")  # fmt: skip
    arch = meta.get("general.architecture")
    if not arch:
        raise GgufError(f"{path}: no general.architecture in its metadata")

    def get(key):
        value = meta.get(f"{arch}.{key}")
        return max(value) if isinstance(value, list) else value

    heads = get("attention.head_count")
    head_dim = get("embedding_length") // heads if heads and get("embedding_length") else None
    shape = {
        "path": path,
        "size": os.path.getsize(path),
        "architecture": arch,
        "file_type": meta.get("general.file_type"),
        "n_layer": get("block_count"),
        "n_ctx_train": get("context_length"),
        "n_head": heads,
        "n_head_kv": get("attention.head_count_kv") or heads,
        "head_dim_k": get("attention.key_length") or head_dim,
        "head_dim_v": get("attention.value_length") or head_dim,
    }
    missing = [k for k, v in shape.items() if v is None and k != "file_type"]
    if missing:
        raise GgufError(f"{path}: {arch} metadata lacks {', '.join(missing)}")
    return shape


def main(argv: list) -> int:
    path = argv[1]
    if not os.path.isfile(path):
        print(json.dumps({"missing": True, "path": path}))
        return 0
    try:
        print(json.dumps(read_shape(path), sort_keys=True))
    except (GgufError, OSError) as e:
        print(json.dumps({"error": str(e), "path": path}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
