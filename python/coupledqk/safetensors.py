"""A small, strict safetensors reader and writer for torch tensors (no safetensors package needed).

File layout: 8-byte little-endian header length N, an N-byte JSON header {name: {"dtype", "shape",
"data_offsets": [begin, end]}, ..., "__metadata__": {str: str}}, then the tensors' little-endian
row-major bytes. The same format the library reads and writes (include/coupledqk/io/safetensors.hpp).
"""
import json
import math
import struct

import torch

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_CODES = {v: k for k, v in _DTYPES.items()}
_METADATA = "__metadata__"


def load_file(path, with_metadata=False):
    """{name: tensor} of a safetensors file (and its string metadata when with_metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    where = f"safetensors file {str(path)!r}"
    if len(data) < 8:
        raise ValueError(f"{where}: {len(data)} bytes; a safetensors file starts with an 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{where}: header length {n} exceeds the {len(data) - 8} bytes after it")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: the header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{where}: the header is not a JSON object")
    buffer = memoryview(data)[8 + n:]
    metadata = header.pop(_METADATA, {}) or {}
    tensors = {}
    for name, entry in header.items():
        try:
            dtype = _DTYPES[entry["dtype"]]
            shape = [int(s) for s in entry["shape"]]
            begin, end = (int(o) for o in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: tensor {name!r} has a malformed entry {entry!r}; expected dtype "
                             f"({', '.join(_DTYPES)}), shape and data_offsets") from None
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(buffer) or end - begin != size or any(s < 0 for s in shape):
            raise ValueError(f"{where}: tensor {name!r} (shape {shape}, {entry['dtype']}) has data_offsets "
                             f"[{begin}, {end}]; expected {size} bytes within the {len(buffer)}-byte buffer")
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
