"""Minimal, strict reader/writer for the safetensors file format (F64/F32 only).

Layout of a file:
    [8 bytes]  N = little-endian uint64, length of the JSON header
    [N bytes]  UTF-8 JSON object:
                 {"<name>": {"dtype": "F64"|"F32", "shape": [...], "data_offsets": [begin, end]},
                  ...,
                  "__metadata__": {"key": "string value", ...}}      (optional)
    [rest]     byte buffer; each tensor's little-endian, row-major data lies at
               buffer[begin:end] (offsets relative to the start of the buffer).

The reader is deliberately strict (it follows the rules of the official format):
every tensor entry must have exactly the three keys, a known dtype, a shape of
non-negative integers, and a byte span whose length matches the shape; the spans
must tile the buffer exactly (no gaps, overlaps or trailing bytes); metadata
values must be strings; duplicate JSON keys are rejected.  Any violation raises
SafetensorsError with a message naming the file and the offending entry.

Only the standard library and numpy are used (no safetensors package).
"""

import json
import struct

import numpy as np

# safetensors dtype code -> little-endian numpy dtype.
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
}
# numpy dtype -> safetensors dtype code (for the writer).
_CODES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32"}

# Refuse absurd header lengths before allocating/decoding anything.
MAX_HEADER_BYTES = 100 * 1024 * 1024

METADATA_KEY = "__metadata__"


class SafetensorsError(ValueError):
    """Raised for any malformed or unsupported safetensors content."""


def _reject_duplicates(pairs):
    # json.loads would silently keep the last of duplicated keys; we refuse.
    result = {}
    for key, value in pairs:
        if key in result:
            raise SafetensorsError(f"duplicate JSON key {key!r} in header")
        result[key] = value
    return result


def _is_int(value):
    # bool is a subclass of int in Python; JSON true/false are not sizes.
    return isinstance(value, int) and not isinstance(value, bool)


def loads(data, source="<bytes>"):
    """Parse safetensors bytes. Returns (tensors: dict name -> np.ndarray, metadata: dict)."""
    def fail(msg):
        raise SafetensorsError(f"{source}: {msg}")

    if len(data) < 8:
        fail(f"only {len(data)} bytes; a safetensors file starts with an 8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > MAX_HEADER_BYTES:
        fail(f"header length {header_len} is implausibly large (> {MAX_HEADER_BYTES})")
    if header_len > len(data) - 8:
        fail(f"header length {header_len} exceeds the {len(data) - 8} bytes after the length field")

    raw_header = data[8:8 + header_len]
    try:
        text = raw_header.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"header is not valid UTF-8 ({exc})")
    try:
        header = json.loads(text, object_pairs_hook=_reject_duplicates)
    except SafetensorsError as exc:
        fail(str(exc))
    except json.JSONDecodeError as exc:
        fail(f"header is not valid JSON ({exc})")
    if not isinstance(header, dict):
        fail(f"header must be a JSON object, got {type(header).__name__}")

    buffer = memoryview(data)[8 + header_len:]
    buffer_len = len(buffer)

    metadata = header.pop(METADATA_KEY, {})
    if not isinstance(metadata, dict):
        fail(f"{METADATA_KEY} must be an object of strings, got {type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(value, str):
            fail(f"metadata value for {key!r} must be a string, got {json.dumps(value)}")

    tensors = {}
    spans = []  # (begin, end, name) used to check that spans tile the buffer
    for name, info in header.items():
        where = f"tensor {name!r}"
        if not isinstance(info, dict):
            fail(f"{where}: entry must be an object, got {json.dumps(info)}")
        keys = set(info)
        if keys != {"dtype", "shape", "data_offsets"}:
            fail(f"{where}: expected keys dtype, shape, data_offsets; got {sorted(keys)}")
        code = info["dtype"]
        if code not in DTYPES:
            fail(f"{where}: unsupported dtype {code!r} (supported: {sorted(DTYPES)})")
        dtype = DTYPES[code]
        shape = info["shape"]
        if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
            fail(f"{where}: shape must be a list of non-negative integers, got {json.dumps(shape)}")
        offsets = info["data_offsets"]
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(_is_int(o) for o in offsets)):
            fail(f"{where}: data_offsets must be [begin, end] integers, got {json.dumps(offsets)}")
        begin, end = offsets
        if not 0 <= begin <= end <= buffer_len:
            fail(f"{where}: data_offsets [{begin}, {end}] outside the {buffer_len}-byte data buffer")
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * dtype.itemsize:
            fail(f"{where}: {code} {shape} needs {count * dtype.itemsize} bytes, "
                 f"data_offsets span {end - begin}")
        array = np.frombuffer(buffer, dtype=dtype, count=count, offset=begin)
        # Copy into a native-endian, writable array independent of the file bytes.
        tensors[name] = array.reshape(shape).astype(dtype.newbyteorder("="), copy=True)
        spans.append((begin, end, name))

    # The spans must cover the buffer exactly once, in some order.
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position:
            kind = "overlaps the previous tensor" if begin < position else "leaves a gap before it"
            fail(f"tensor {name!r} starts at byte {begin} but the previous data ends at "
                 f"{position} ({kind})")
        position = end
    if position != buffer_len:
        fail(f"data buffer has {buffer_len - position} trailing bytes not owned by any tensor")
    return tensors, dict(metadata)


def read(path):
    """Read a safetensors file. Returns (dict name -> numpy array, metadata dict of strings)."""
    with open(path, "rb") as handle:
        data = handle.read()
    return loads(data, source=str(path))


def dumps(tensors, metadata=None):
    """Serialise tensors (dict name -> float64/float32 array-like) and string metadata to bytes."""
    header = {}
    if metadata:
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise SafetensorsError(f"metadata must map strings to strings, got {key!r}: {value!r}")
        header[METADATA_KEY] = dict(metadata)

    chunks = []
    offset = 0
    for name, value in tensors.items():
        if not isinstance(name, str) or name == METADATA_KEY:
            raise SafetensorsError(f"invalid tensor name {name!r}")
        array = np.asarray(value)
        code = _CODES.get(array.dtype)
        if code is None:
            raise SafetensorsError(f"tensor {name!r}: unsupported dtype {array.dtype} "
                                   f"(only float64 and float32)")
        raw = np.ascontiguousarray(array, dtype=DTYPES[code]).tobytes(order="C")
        header[name] = {"dtype": code, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)

    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # Pad with spaces so the data buffer starts 8-byte aligned.
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write(path, tensors, metadata=None):
    """Write tensors and string metadata to a safetensors file."""
    data = dumps(tensors, metadata)
    with open(path, "wb") as handle:
        handle.write(data)
