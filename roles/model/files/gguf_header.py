# Runs on the host (standard library only, imports nothing from llamarack; run by llamarack.remote.command).
"""Read what the context planner needs from a GGUF file's header.

Standard library only: the ``GgufShape`` fact runs this file's source with
the host's python3 (``python3 -c``), where no gguf package is installed; the
``llamarack plan`` command reads the same header from a local file or from
the hub with HTTP ranges (``llamarack/planner.py``).

    python3 gguf_header.py MODEL.gguf [--recorded NAME]   -> one JSON line (or {"missing": true})
    python3 gguf_header.py --record NAME MODEL.gguf       -> the same line, and NAME written

A real model's header holds its tokenizer (10^5 strings and more), and reading
past it still costs a host 0.06 to 0.1 s of CPU on every audit and deploy. So
the model role records the shape when it seals an artifact: ``--record``
writes ``NAME`` (``shape-<reader>.json``, named after this file's own digest,
so a changed reader never answers from an older reader's record) beside the
GGUF, with the GGUF's signature (size, mtime, inode). ``--recorded NAME``
answers from that record when the signature is still the file's, and from the
header when it is not (the file written to or replaced since), when the record
is absent, unreadable or not of this shape, or when the name is not a record's.
Both answers are the same bytes.

GGUF layout (v2/v3, little-endian): magic ``GGUF``, uint32 version, uint64
tensor count, uint64 metadata count, then the metadata: key (uint64 length,
UTF-8), uint32 value type, value; then one info per tensor: name, uint32
number of dimensions, uint64 each, uint32 ggml type, uint64 offset. Only the
header is read, never the tensor data, and the tokenizer's arrays (10^5
strings and more) are read past, not decoded: 0.06 to 0.08 s of CPU for a
real model's header (``bench/gguf_header_bench.py``). A tensor's bytes follow
from its dimensions and type (ggml's block sizes below), which is how the
weights are counted per layer.

The control machine imports this file for its reader
(``llamarack/model_shapes.py``).
"""

import os
import stat
import struct
import sys

from json import dumps, loads

# GGUF metadata value types: struct format of the scalar ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9
# Keys under "<architecture>." that the planner reads.
_ARCH_KEYS = ("block_count", "context_length", "embedding_length", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "attention.value_length",
              "feed_forward_length", "vocab_size", "attention.sliding_window",
              "attention.sliding_window_pattern", "rope.scaling.type", "rope.scaling.factor",
              "rope.scaling.original_context_length")  # fmt: skip
# ggml type id: (values per block, bytes per block), as gguf-py's GGML_QUANT_SIZES.
GGML_BLOCKS = {
    0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
    9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
    15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
    21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
    27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66),
    39: (32, 17), 40: (64, 36), 41: (128, 18), 42: (64, 18),
}  # fmt: skip


# A vocabulary is read past, not read: its strings' lengths are taken from chunks this size.
_SKIP_CHUNK = 64 * 1024
_U64 = struct.Struct("<Q")


class GgufError(ValueError):
    pass


def _read(f, fmt: str):
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GgufError("truncated GGUF header")
    return struct.unpack(fmt, data)[0]


def _left(f) -> int:
    """Bytes from here to the end of the file: no length a header claims can exceed it.
    A reader without a file (``llamarack plan``'s HTTP range reader) says its ``size``
    once it knows it; until then only its reads bound what it returns."""
    try:
        size = os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        size = getattr(f, "size", None)
    return sys.maxsize if size is None else size - f.tell()


def _string(f) -> str:
    n = _read(f, "<Q")
    # A corrupt or hostile length is refused before anything is allocated for it.
    if n > _left(f):
        raise GgufError(f"corrupt GGUF header: a string of {n} bytes, past the end of the file")
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
        if count > _left(f):  # every item takes at least one byte
            raise GgufError(f"corrupt GGUF header: an array of {count} items, past the end of the file")
        if itype in _SCALARS and not keep:
            f.seek(count * struct.calcsize(_SCALARS[itype]), os.SEEK_CUR)  # vocab scores etc.
            return None
        if itype == _STRING and not keep:
            _skip_strings(f, count)  # the vocabulary's tokens, its merges
            return None
        items = [_value(f, itype, keep) for _ in range(count)]
        return items if keep else None
    raise GgufError(f"unknown GGUF value type {vtype}")


def _skip_strings(f, count: int) -> None:
    """Past ``count`` strings that are not kept, their lengths read from chunks of the
    file. A real model's vocabulary is 10^5 strings or more (a Llama-3 GGUF holds 128,256
    tokens and 280,147 merges): read one at a time (a length, a string, its decoding),
    they took a host 1.5 to 2 s of CPU in every read of the header, the audit's included."""
    left, passed = _left(f), 0
    unpack = _U64.unpack_from
    buf, pos, limit = b"", 0, -1  # f is at the end of buf; the next string's length is at pos

    def moved() -> int:  # bytes from the chunk's start to pos, once they are known to be in the file
        if passed + pos > left:  # before any seek: a hostile length moves nothing
            raise GgufError("corrupt GGUF header: a string array runs past the end of the file")
        return pos

    for _ in range(count):
        if pos > limit:
            passed += moved()
            f.seek(pos - len(buf), os.SEEK_CUR)  # back to what is unread, or on past a long string
            buf, pos = f.read(_SKIP_CHUNK), 0
            limit = len(buf) - 8
            if limit < 0:
                raise GgufError("truncated GGUF header")
        pos += 8 + unpack(buf, pos)[0]
    moved()
    f.seek(pos - len(buf), os.SEEK_CUR)


def read_header(f, name: str, wanted=None) -> tuple:
    """(metadata, tensors) of the GGUF open as ``f``: all keys, or only those in
    ``wanted`` (a predicate on the key; other values are skipped, not kept), and
    each tensor's (name, bytes, dimensions)."""
    if f.read(4) != b"GGUF":
        raise GgufError(f"{name} is not a GGUF file")
    version = _read(f, "<I")
    if version < 2:
        raise GgufError(f"GGUF version {version} is not supported (needs 2 or later)")
    n_tensors = _read(f, "<Q")
    meta = {"gguf.version": version}
    for _ in range(_read(f, "<Q")):
        key = _string(f)
        keep = wanted is None or wanted(key)
        value = _value(f, _read(f, "<I"), keep)
        if keep:
            meta[key] = value
    tensors = []
    for _ in range(n_tensors):
        tname = _string(f)
        dims = [_read(f, "<Q") for _ in range(_read(f, "<I"))]
        count = 1
        for d in dims:
            count *= d
        ggml_type = _read(f, "<I")
        _read(f, "<Q")  # offset in the data section
        if ggml_type not in GGML_BLOCKS:
            raise GgufError(f"{name}: tensor {tname} has ggml type {ggml_type}, unknown here")
        per_block, block_bytes = GGML_BLOCKS[ggml_type]
        tensors.append((tname, count // per_block * block_bytes, dims))
    return meta, tensors


def read_metadata(path: str, wanted=None) -> dict:
    """The metadata of the GGUF at ``path`` (see ``read_header``)."""
    with open(path, "rb") as f:
        return read_header(f, path, wanted)[0]


def tensor_ledger(tensors: list, n_layer: int) -> dict:
    """Bytes per repeating layer (``blk.N.*``), of the token embedding, and of the
    output layer (``output.weight``, ``output_norm``, any other tensor outside
    the blocks); ``tied``: no ``output.weight``, so llama.cpp serves the token
    embedding as the output too (a second copy, on the output layer's device)."""
    layers = [0] * n_layer
    embd = output = 0
    names = set()
    for tname, size, _ in tensors:
        names.add(tname)
        if tname.startswith("blk."):
            index = int(tname.split(".")[1])
            if index < n_layer:
                layers[index] += size
                continue
        if tname == "token_embd.weight":
            embd += size
        else:
            output += size
    return {"layer_bytes": layers, "token_embd_bytes": embd, "output_bytes": output,
            "tied_embeddings": "output.weight" not in names}  # fmt: skip


# Every key of a shape (``shape_of``) but its path.
SHAPE_KEYS = ("size", "architecture", "file_type", "n_layer", "n_ctx_train", "n_head", "n_head_kv", "head_dim_k",
              "head_dim_v", "n_embd", "n_ff", "n_vocab", "n_swa", "swa_pattern", "rope_scaling", "rope_scale",
              "rope_orig_ctx", "layer_bytes", "token_embd_bytes", "output_bytes", "tied_embeddings")  # fmt: skip


def read_shape(path: str) -> dict:
    """What the planner needs from the GGUF at ``path`` (see ``shape_of``)."""
    with open(path, "rb") as f:
        return shape_of(f, path, os.path.getsize(path))


def shape_of(f, path: str, size: int) -> dict:
    """File size, architecture, layers, trained context, KV heads and head sizes
    (a per-layer KV head list is reduced to its largest), the sliding-window
    layout, the rope scaling the model was trained with, and the weights' bytes
    per layer (``tensor_ledger``)."""
    meta, tensors = read_header(f, path, lambda k: k == "general.architecture" or k.endswith(_ARCH_KEYS)
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
        "size": size,
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
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    embd_dims = next((dims for name, _, dims in tensors if name == "token_embd.weight"), None)
    vocab = meta.get(f"{arch}.vocab_size") or (embd_dims[-1] if embd_dims else None)
    shape.update({
        "n_embd": get("embedding_length"),
        "n_ff": get("feed_forward_length"),
        "n_vocab": vocab,
        "n_swa": get("attention.sliding_window") or 0,
        # a list: which layers slide (llama.cpp reads it so); an int: every Nth layer is dense
        "swa_pattern": [bool(v) for v in pattern] if isinstance(pattern, list) else pattern,
        "rope_scaling": meta.get(f"{arch}.rope.scaling.type"),
        "rope_scale": meta.get(f"{arch}.rope.scaling.factor"),
        "rope_orig_ctx": meta.get(f"{arch}.rope.scaling.original_context_length"),
        **tensor_ledger(tensors, shape["n_layer"]),
    })  # fmt: skip
    return shape


def is_record_name(name: str) -> bool:
    """Whether ``name`` is a shape record's: shape-<the reader's digest, 16 hex>.json (``--record``)."""
    digest = name[6:-5]
    return len(name) == 27 and name.startswith("shape-") and name.endswith(".json") \
        and all(c in "0123456789abcdef" for c in digest)  # fmt: skip


def signature(st: os.stat_result) -> dict:
    """The GGUF's signature, as its seal records it (``model_fetch.py seal``)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}


def recorded_shape(path: str, name: str, st: os.stat_result):
    """The shape record ``name`` beside ``path`` holds, when it was made from exactly this
    file (``st``: its stat now) and has every key a shape has; else None."""
    if not is_record_name(name):
        return None
    try:
        with open(os.path.join(os.path.dirname(path), name)) as f:
            record = loads(f.read())
        shape, sig = record["shape"], record["signature"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if sig != signature(st) or not isinstance(shape, dict) or sorted(shape) != sorted(SHAPE_KEYS) \
            or shape["size"] != st.st_size:  # fmt: skip
        return None
    return dict(shape, path=path)


def record(path: str, name: str) -> dict:
    """Read the shape of the GGUF at ``path`` and write it, with the file's signature, to
    ``name`` beside it (whole or not at all); other shape records there are removed."""
    if not is_record_name(name):
        raise GgufError(f"not a shape record's name: {name!r}")
    st = os.stat(path)
    shape = read_shape(path)
    folder = os.path.dirname(path)
    out = os.path.join(folder, name)
    tmp = f"{out}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(dumps({"signature": signature(st), "shape": {k: v for k, v in shape.items() if k != "path"}},
                      sort_keys=True) + "\n")  # fmt: skip
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    os.rename(tmp, out)
    for other in os.listdir(folder):
        if other != name and is_record_name(other):
            os.unlink(os.path.join(folder, other))
    return shape


def main(argv: list) -> int:
    if argv[1] == "--record":
        name, path = argv[2], argv[3]
        print(dumps(record(path, name), sort_keys=True))  # a failure exits 1: the deploy step fails
        return 0
    path = argv[1]
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        print(dumps({"missing": True, "path": path}))
        return 0
    shape = recorded_shape(path, argv[3], st) if argv[2:3] == ["--recorded"] else None
    if shape is not None:
        print(dumps(shape, sort_keys=True))
        return 0
    try:
        print(dumps(read_shape(path), sort_keys=True))
    except (GgufError, OSError, struct.error, ValueError, OverflowError, MemoryError) as e:
        # A model file's header is untrusted data: whatever it holds is an answer, never a crash.
        print(dumps({"error": f"{type(e).__name__}: {e}" if not isinstance(e, GgufError) else str(e),
                          "path": path}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
