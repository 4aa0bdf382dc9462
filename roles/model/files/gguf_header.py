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

Every value is untrusted: a count that is not an integer or not in range, an
array of arrays, a block count past what the tensors make are each an error
naming the key (``check_shape``, which the planner also runs on every shape
it is given), and no claim in a header makes the answer longer than a size
per layer for at most ``MAX_LAYERS`` layers.

The control machine imports this file for its reader
(``llamarack/model_shapes.py``) and its checks (``llamarack/planner.py``).
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
# The shape's values read from keys under "<architecture>.": the key each comes from.
GGUF_KEYS = {"n_layer": "block_count", "n_ctx_train": "context_length", "n_embd": "embedding_length",
             "n_head": "attention.head_count", "n_head_kv": "attention.head_count_kv",
             "head_dim_k": "attention.key_length", "head_dim_v": "attention.value_length",
             "n_ff": "feed_forward_length", "n_vocab": "vocab_size", "n_swa": "attention.sliding_window",
             "swa_pattern": "attention.sliding_window_pattern", "rope_scaling": "rope.scaling.type",
             "rope_scale": "rope.scaling.factor", "rope_orig_ctx": "rope.scaling.original_context_length"}  # fmt: skip
_ARCH_KEYS = tuple(GGUF_KEYS.values())
# The most layers a shape may have. llama.cpp's largest models have a few hundred; a block
# count past this is no model's, and the answer (a size per layer) would grow with it.
MAX_LAYERS = 2**16
# The newest GGUF version llama.cpp reads (its gguf.cpp's GGUF_VERSION); it refuses a later one.
GGUF_VERSION = 3
# The most metadata keys and tensors a header may claim: a real model has tens of keys and
# thousands of tensors; a claim past these would only keep the reader busy.
MAX_KEYS, MAX_TENSORS = 2**16, 2**20
# llama.cpp keeps at most 4 dimensions per tensor (GGML_MAX_DIMS), fewer than 2^63 values in all.
MAX_DIMS = 4
UINT32, INT64 = 2**32 - 1, 2**63 - 1
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


def _bytes(f) -> bytes:
    """A string's bytes, as the header holds them."""
    n = _read(f, "<Q")
    # A corrupt or hostile length is refused before anything is allocated for it.
    if n > _left(f):
        raise GgufError(f"corrupt GGUF header: a string of {n} bytes, past the end of the file")
    data = f.read(n)
    if len(data) != n:
        raise GgufError("truncated GGUF header")
    return data


def _string(f) -> str:
    return _bytes(f).decode("utf-8", errors="replace")


def _value(f, key: str, vtype: int, keep: bool, most: int):
    """The value of ``vtype`` at ``f`` (None when not ``keep``). An array holds scalars or
    strings, never arrays (llama.cpp's reader refuses those, so nothing is nested here);
    a kept one at most ``most`` items."""
    if vtype in _SCALARS:
        return _read(f, _SCALARS[vtype])
    if vtype == _STRING:
        return _string(f)
    if vtype != _ARRAY:
        raise GgufError(f"unknown GGUF value type {vtype} (key {_shown(key)})")
    itype, count = _read(f, "<I"), _read(f, "<Q")
    if itype != _STRING and itype not in _SCALARS:
        what = "an array of arrays, which llama.cpp does not read" if itype == _ARRAY else f"items of type {itype}"
        raise GgufError(f"corrupt GGUF header: key {_shown(key)} holds {what}")
    if count > _left(f):  # every item takes at least one byte
        raise GgufError(f"corrupt GGUF header: an array of {count} items, past the end of the file")
    if not keep:
        if itype == _STRING:
            _skip_strings(f, count)  # the vocabulary's tokens, its merges
        else:
            f.seek(count * struct.calcsize(_SCALARS[itype]), os.SEEK_CUR)  # vocab scores etc.
        return None
    if count > most:
        raise GgufError(f"key {_shown(key)} holds {count} items, more than the {most} it can hold")
    if itype == _STRING:
        return [_string(f) for _ in range(count)]
    return [_read(f, _SCALARS[itype]) for _ in range(count)]


def _shown(value) -> str:
    """``value`` as a message shows it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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


def read_header(f, name: str, wanted=None, most: int = sys.maxsize) -> tuple:
    """(metadata, tensors) of the GGUF open as ``f``: all keys, or only those in
    ``wanted`` (a predicate on the key; other values are skipped, not kept; a kept
    array at most ``most`` items), and each tensor's (name, bytes, dimensions)."""
    if f.read(4) != b"GGUF":
        raise GgufError(f"{name} is not a GGUF file")
    version = _read(f, "<I")
    if version < 2:
        raise GgufError(f"GGUF version {version} is not supported (needs 2 or later)")
    if version > GGUF_VERSION:
        # llama.cpp's gguf.cpp refuses it: a later version may lay the header out otherwise
        other_endian = " (a big-endian file's version, read little-endian)" if not version & 0xFFFF else ""
        raise GgufError(f"{name}: GGUF version {version}{other_endian} is not supported: llama.cpp reads "
                        f"versions 2 to {GGUF_VERSION}")  # fmt: skip
    n_tensors, n_keys = _read(f, "<Q"), _read(f, "<Q")
    if n_tensors > MAX_TENSORS or n_keys > MAX_KEYS:
        raise GgufError(f"{name}: a header of {n_tensors} tensors and {n_keys} metadata keys is no model's "
                        f"(at most {MAX_TENSORS} and {MAX_KEYS})")  # fmt: skip
    meta, seen = {"gguf.version": version}, set()
    for _ in range(n_keys):
        raw = _bytes(f)
        key = raw.decode("utf-8", errors="replace")
        if raw in seen:  # llama.cpp refuses the file: which of the two values counts is no one's guess
            raise GgufError(f"{name}: key {_shown(key)} appears twice in the header; llama.cpp refuses such a file")
        seen.add(raw)
        keep = wanted is None or wanted(key)
        value = _value(f, key, _read(f, "<I"), keep, most)
        if keep:
            meta[key] = value
    tensors = []
    for _ in range(n_tensors):
        tname = _string(f)
        n_dims = _read(f, "<I")
        if n_dims > MAX_DIMS:
            raise GgufError(f"{name}: tensor {_shown(tname)} has {n_dims} dimensions; llama.cpp reads "
                            f"at most {MAX_DIMS}")  # fmt: skip
        dims = [_read(f, "<Q") for _ in range(n_dims)]
        count = 1
        for d in dims:
            count *= d
        if count > INT64:
            raise GgufError(f"{name}: tensor {_shown(tname)} of {count} values, more than llama.cpp can hold")
        ggml_type = _read(f, "<I")
        _read(f, "<Q")  # offset in the data section
        if ggml_type not in GGML_BLOCKS:
            raise GgufError(f"{name}: tensor {_shown(tname)} has ggml type {ggml_type}, unknown here")
        per_block, block_bytes = GGML_BLOCKS[ggml_type]
        tensors.append((tname, count // per_block * block_bytes, dims))
    return meta, tensors


def read_metadata(path: str, wanted=None) -> dict:
    """The metadata of the GGUF at ``path`` (see ``read_header``)."""
    with open(path, "rb") as f:
        return read_header(f, path, wanted)[0]


def _layer_index(tname: str):
    """N of a repeating layer's tensor (``blk.N.*``), else None."""
    parts = tname.split(".", 2)
    if len(parts) > 1 and parts[0] == "blk" and parts[1].isascii() and parts[1].isdigit():
        return int(parts[1])
    return None


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
        index = _layer_index(tname)
        if index is not None and index < n_layer:
            layers[index] += size
        elif tname == "token_embd.weight":
            embd += size
        else:
            output += size
    return {"layer_bytes": layers, "token_embd_bytes": embd, "output_bytes": output,
            "tied_embeddings": "output.weight" not in names}  # fmt: skip


# Every key of a shape (``shape_of``) but its path.
SHAPE_KEYS = ("size", "architecture", "file_type", "n_layer", "n_ctx_train", "n_head", "n_head_kv", "head_dim_k",
              "head_dim_v", "n_embd", "n_ff", "n_vocab", "n_swa", "swa_pattern", "rope_scaling", "rope_scale",
              "rope_orig_ctx", "layer_bytes", "token_embd_bytes", "output_bytes", "tied_embeddings")  # fmt: skip
# The integers of a shape: (lowest, highest, None allowed). llama.cpp keeps the model's
# hyperparameters as 32-bit unsigned integers, byte counts as 64-bit signed ones.
INTEGERS = {
    "size": (0, INT64, False), "file_type": (0, UINT32, True), "n_layer": (1, MAX_LAYERS, False),
    "n_ctx_train": (1, UINT32, False), "n_head": (1, UINT32, False), "n_head_kv": (1, UINT32, False),
    "head_dim_k": (1, UINT32, False), "head_dim_v": (1, UINT32, False), "n_embd": (0, UINT32, True),
    "n_ff": (0, UINT32, True), "n_vocab": (0, UINT32, True), "n_swa": (0, UINT32, False),
    "rope_orig_ctx": (0, UINT32, True), "token_embd_bytes": (0, INT64, False), "output_bytes": (0, INT64, False),
}  # fmt: skip


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_values(values: dict, names: dict = GGUF_KEYS) -> None:
    """Each integer of a shape in ``values`` (``INTEGERS``) is one, within its range;
    GgufError naming the first that is not, and where it comes from (``names``)."""
    for key, value in values.items():
        if key not in INTEGERS or (value is None and INTEGERS[key][2]):
            continue
        low, high, _ = INTEGERS[key]
        source = f" ({names[key]})" if key in names else ""
        if not _integer(value):
            raise GgufError(f"{key}{source} {_shown(value)} is not an integer")
        if not low <= value <= high:
            raise GgufError(f"{key}{source} {value} is out of range ({low} to {high})")


def check_shape(shape) -> None:
    """A shape (``shape_of``'s, a recorded one, a config.json's estimate) has every key,
    each value of the type and within the range the planner's arithmetic needs: integers
    where counts belong (``INTEGERS``), a size per layer, a finite positive rope scale.
    GgufError naming the first value that is not."""
    if not isinstance(shape, dict):
        raise GgufError(f"a shape is a mapping, not {type(shape).__name__}")
    missing = [k for k in SHAPE_KEYS if k not in shape]
    if missing:
        raise GgufError(f"the shape lacks {', '.join(missing)}")
    check_values(shape)
    arch, pattern, scale, layers = (shape[k] for k in ("architecture", "swa_pattern", "rope_scale", "layer_bytes"))
    if not isinstance(arch, str) or not arch:
        raise GgufError(f"architecture {_shown(arch)} is not a name")
    if not (pattern is None or _integer(pattern) and 0 <= pattern <= UINT32 or isinstance(pattern, list)
            and len(pattern) <= MAX_LAYERS and all(_integer(v) or isinstance(v, bool) for v in pattern)):
        raise GgufError(f"swa_pattern ({GGUF_KEYS['swa_pattern']}) {_shown(pattern)} is neither a count "
                        "nor a list of flags, one per layer")  # fmt: skip
    if not (shape["rope_scaling"] is None or isinstance(shape["rope_scaling"], str)):
        raise GgufError(f"rope_scaling ({GGUF_KEYS['rope_scaling']}) {_shown(shape['rope_scaling'])} is not a name")
    if not (scale is None or isinstance(scale, (int, float)) and not isinstance(scale, bool) and 0 < scale < 2**32):
        raise GgufError(f"rope_scale ({GGUF_KEYS['rope_scale']}) {_shown(scale)} is not a positive finite number")
    if not (isinstance(layers, list) and len(layers) == shape["n_layer"]
            and all(_integer(b) and 0 <= b <= INT64 for b in layers)):
        raise GgufError(f"layer_bytes {_shown(layers)} is not a byte count for each of the {shape['n_layer']} layers")
    if not isinstance(shape["tied_embeddings"], bool):
        raise GgufError(f"tied_embeddings {_shown(shape['tied_embeddings'])} is not true or false")


def read_shape(path: str) -> dict:
    """What the planner needs from the GGUF at ``path`` (see ``shape_of``)."""
    with open(path, "rb") as f:
        return shape_of(f, path, os.path.getsize(path))


def shape_of(f, path: str, size: int) -> dict:
    """File size, architecture, layers, trained context, KV heads and head sizes
    (a per-layer KV head list is reduced to its largest), the sliding-window
    layout, the rope scaling the model was trained with, and the weights' bytes
    per layer (``tensor_ledger``). GgufError when a value is not what it must be
    (``check_shape``), or the file's tensors make fewer layers than it claims."""
    meta, tensors = read_header(f, path, lambda k: k == "general.architecture" or k.endswith(_ARCH_KEYS)
                                or k == "general.file_type", most=MAX_LAYERS)  # fmt: skip
    try:
        shape = _counts(meta, path, size)
        shape.update(_layout(meta, shape["architecture"], tensors, shape["n_layer"]))
        check_shape(shape)
    except GgufError as e:
        raise GgufError(f"{path}: {e}") from None
    return shape


def _get(meta: dict, arch: str, key: str):
    """``<arch>.<key>``; of a list per layer, its largest (a list of anything but
    integers is left as it is, for ``check_shape`` to name)."""
    value = meta.get(f"{arch}.{key}")
    return max(value) if isinstance(value, list) and value and all(map(_integer, value)) else value


def _given(value, default):
    """``value``, else (the key absent) ``default``: llama.cpp takes a head count or head size a
    header gives as it is, 0 included, and derives it only where the key is absent."""
    return default if value is None else value


def _counts(meta: dict, path: str, size: int) -> dict:
    """``shape_of``'s architecture, layers, trained context, heads and head sizes."""
    arch = meta.get("general.architecture")
    if not arch:
        raise GgufError("no general.architecture in its metadata")
    if not isinstance(arch, str):
        raise GgufError(f"general.architecture {_shown(arch)} is not a name")
    heads, width = _get(meta, arch, "attention.head_count"), _get(meta, arch, "embedding_length")
    # before one is divided by the other
    check_values({k: v for k, v in (("n_head", heads), ("n_embd", width)) if v is not None})
    head_dim = width // heads if heads and width else None
    shape = {
        "path": path,
        "size": size,
        "architecture": arch,
        "file_type": meta.get("general.file_type"),
        "n_layer": _get(meta, arch, "block_count"),
        "n_ctx_train": _get(meta, arch, "context_length"),
        "n_head": heads,
        "n_head_kv": _given(_get(meta, arch, "attention.head_count_kv"), heads),
        "head_dim_k": _given(_get(meta, arch, "attention.key_length"), head_dim),
        "head_dim_v": _given(_get(meta, arch, "attention.value_length"), head_dim),
    }
    missing = [k for k, v in shape.items() if v is None and k != "file_type"]
    if missing:
        raise GgufError(f"{arch} metadata lacks {', '.join(missing)}")
    return shape


def _layout(meta: dict, arch: str, tensors: list, n_layer) -> dict:
    """The rest of ``shape_of``'s shape: widths, the sliding window, rope, the bytes per layer."""
    check_values({"n_layer": n_layer})  # before a size per layer is counted for it
    blocks = sum(1 for tname, _, _ in tensors if _layer_index(tname) is not None)
    if n_layer > blocks:
        raise GgufError(f"block_count {n_layer} is more layers than the file's {blocks} layer tensors (blk.N.*) make")
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    embd_dims = next((dims for name, _, dims in tensors if name == "token_embd.weight"), None)
    return {
        "n_embd": _get(meta, arch, "embedding_length"),
        "n_ff": _get(meta, arch, "feed_forward_length"),
        "n_vocab": meta.get(f"{arch}.vocab_size") or (embd_dims[-1] if embd_dims else None),
        "n_swa": _get(meta, arch, "attention.sliding_window") or 0,
        # a list: which layers slide (llama.cpp reads it so); an int: every Nth layer is dense
        "swa_pattern": [bool(v) for v in pattern] if isinstance(pattern, list) else pattern,
        "rope_scaling": meta.get(f"{arch}.rope.scaling.type"),
        "rope_scale": meta.get(f"{arch}.rope.scaling.factor"),
        "rope_orig_ctx": meta.get(f"{arch}.rope.scaling.original_context_length"),
        **tensor_ledger(tensors, n_layer),
    }


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
    try:
        check_shape(shape)  # a record altered since: the header answers, and says what is wrong
    except GgufError:
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
