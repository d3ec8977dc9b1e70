"""A small, strict safetensors reader and writer for torch tensors (no safetensors package needed).

File layout: 8-byte little-endian header length N, an N-byte JSON header {name: {"dtype", "shape",
"data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}, then the tensors' little-endian
row-major bytes. The same format the library reads and writes (include/coupledqk/io/safetensors.hpp).
"""
import json
import math
import re
import struct

import torch

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_CODES = {v: k for k, v in _DTYPES.items()}
_METADATA = "__metadata__"


#: The library's limits on a header (include/coupledqk/io/safetensors.hpp): its length, how deep
#: it nests arrays and objects (a valid header uses 3), and the longest quotation in a message.
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_HEADER_DEPTH = 8
_MAX_QUOTED = 160


def _excerpt(value):
    """repr(value) cut to a bounded length, for messages (a hostile file cannot make a huge one)."""
    text = repr(value)
    return text if len(text) <= _MAX_QUOTED else f"{text[:_MAX_QUOTED]}...({len(text)} characters in all)"


_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")


def _depth(text):
    """Deepest nesting of arrays and objects in JSON text, counted without recursion (strings aside)."""
    depth = deepest = 0
    for c in _NOT_BRACKETS.sub("", _STRINGS.sub("", text)):
        depth += 1 if c in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def read_json(text, where, max_depth=MAX_HEADER_DEPTH):
    """The project's bounded JSON reading (json_read.hpp): a depth limit checked before parsing,
    duplicate keys refused; ValueError naming `where` otherwise."""
    deepest = _depth(text)
    if deepest > max_depth:
        raise ValueError(f"{where} nests JSON arrays or objects {deepest} levels deep; at most {max_depth} "
                         f"are accepted")

    def pairs(items):
        seen = {}
        for key, value in items:
            if key in seen:
                raise ValueError(f"{where} has the key {_excerpt(key)} twice; every key may appear only once")
            seen[key] = value
        return seen

    try:
        return json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON ({e})") from None


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def load_file(path, with_metadata=False):
    """{name: tensor} of a safetensors file (and its string metadata when with_metadata). Every
    malformed file raises ValueError naming the file, the tensor or field, and the value seen."""
    with open(path, "rb") as f:
        data = f.read()
    where = f"safetensors file {str(path)!r}"
    if len(data) < 8:
        raise ValueError(f"{where}: {len(data)} bytes; a safetensors file starts with an 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER_BYTES:
        raise ValueError(f"{where}: header length {n} bytes is larger than the {MAX_HEADER_BYTES}-byte limit")
    if n > len(data) - 8:
        raise ValueError(f"{where}: header length {n} exceeds the {len(data) - 8} bytes after it")
    try:
        text = data[8:8 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: the header is not UTF-8 ({e})") from None
    header = read_json(text, f"{where}: the header")
    if not isinstance(header, dict):
        raise ValueError(f"{where}: the header is a JSON {type(header).__name__}; expected an object")
    buffer = memoryview(data)[8 + n:]
    metadata = header.pop(_METADATA, None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}: {_METADATA!r} is {_excerpt(metadata)}; expected an object of string values")
    for key, value in metadata.items():
        if not isinstance(value, str):
            raise ValueError(f"{where}: {_METADATA}[{_excerpt(key)}] is {_excerpt(value)}; expected a string")
    tensors = {}
    expected = f"expected {{\"dtype\": one of {', '.join(_DTYPES)}, \"shape\": [non-negative integers], " \
               f"\"data_offsets\": [begin, end]}}"
    for name, entry in header.items():
        if (not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES
                or not isinstance(entry.get("shape"), list) or not all(_is_int(s) and s >= 0 for s in entry["shape"])
                or not isinstance(entry.get("data_offsets"), list) or len(entry["data_offsets"]) != 2
                or not all(_is_int(o) for o in entry["data_offsets"])):
            raise ValueError(f"{where}: tensor {_excerpt(name)} has a malformed entry {_excerpt(entry)}; {expected}")
        dtype = _DTYPES[entry["dtype"]]
        shape = entry["shape"]
        begin, end = entry["data_offsets"]
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(buffer) or end - begin != size:
            raise ValueError(f"{where}: tensor {_excerpt(name)} (shape {_excerpt(shape)}, {entry['dtype']}) has "
                             f"data_offsets [{begin}, {end}]; expected {size} bytes within the {len(buffer)}-byte buffer")
        raw = bytearray(buffer[begin:end])
        t = torch.frombuffer(raw, dtype=dtype) if size else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(shape)
    return (tensors, dict(metadata)) if with_metadata else tensors


def save_file(tensors, path, metadata=None):
    """Writes {name: tensor} (and string metadata) as a safetensors file, tensors in the given order."""
    header, chunks, offset = {}, [], 0
    if metadata:
        header[_METADATA] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        if t.dtype not in _CODES:
            raise TypeError(f"tensor {name!r} has dtype {t.dtype}; safetensors takes {', '.join(map(str, _CODES))}")
        raw = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the buffer starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for c in chunks:
            f.write(c)
