#!/usr/bin/python3
"""Hostile files and arguments from Python (issue 23): every error is a ValueError / TypeError /
KeyError naming the file or argument and the value seen -- never IndexError, RecursionError or a
bare MemoryError -- and a failed call changes no file."""
import json
import os
import struct
import tempfile

import torch

import coupledqk
from coupledqk.safetensors import MAX_HEADER_DEPTH
from harness import main, raises


def _write(path, header_text, data=b""):
    raw = header_text.encode("utf-8") if isinstance(header_text, str) else header_text
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + data)


def _files():
    d = tempfile.mkdtemp()
    return d, os.path.join(d, "layer.safetensors")


def _snapshot(d):
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as f:
            out[name] = f.read()
    return out


def test_header_nested_too_deep_is_a_value_error():
    d, path = _files()
    _write(path, "{\"a\": " + "[" * 100000 + "]" * 100000 + "}")
    before = _snapshot(d)
    raises(ValueError, coupledqk.load_file, path,
           contains=(path, "100001 levels deep", f"at most {MAX_HEADER_DEPTH}"))
    raises(ValueError, coupledqk.CoupledAttention.from_safetensors, path, contains=(path, "levels deep"))
    assert _snapshot(d) == before


def test_duplicate_keys_and_bad_json():
    d, path = _files()
    _write(path, '{"wq": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}, '
                 '"wq": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}}')
    raises(ValueError, coupledqk.load_file, path, contains=(path, "'wq' twice"))
    _write(path, '{"wq": ')
    raises(ValueError, coupledqk.load_file, path, contains=(path, "not valid JSON"))
    _write(path, b"\xff\xfe")
    raises(ValueError, coupledqk.load_file, path, contains=(path, "not UTF-8"))
    _write(path, "[1, 2]")
    raises(ValueError, coupledqk.load_file, path, contains=(path, "JSON list", "expected an object"))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", 2**63) + b"{}")
    raises(ValueError, coupledqk.load_file, path, contains=(path, str(2**63), "limit"))


def test_malformed_metadata_names_the_file_and_the_field():
    d, path = _files()
    for meta, shown in ((["a"], "['a']"), ("text", "'text'"), (7, "7")):
        _write(path, json.dumps({"__metadata__": meta}))
        raises(ValueError, coupledqk.load_file, path, contains=(path, "'__metadata__'", shown, "object of string"))
    _write(path, json.dumps({"__metadata__": {"steps": 3}}))
    raises(ValueError, coupledqk.load_file, path, contains=(path, "__metadata__['steps']", "3", "expected a string"))
    # a valid file whose integer metadata is not an integer
    layer = coupledqk.CoupledAttention(8, 2, "leapfrog", 2, seed=1)
    layer.save_safetensors(path)
    tensors, meta = coupledqk.load_file(path, with_metadata=True)
    for key, value in (("steps", "-1"), ("heads", "x" * 100000), ("layer_index", "1e3")):
        coupledqk.save_file(tensors, path, dict(meta, **{key: value}))
        msg = raises(ValueError, coupledqk.CoupledAttention.from_safetensors, path,
                     contains=(path, repr(key), "expected a non-negative integer"))
        assert len(msg) < 1000, len(msg)


def test_malformed_tensor_entries():
    d, path = _files()
    for entry in ({"dtype": "F32", "shape": [True], "data_offsets": [0, 4]},
                  {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]},
                  {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]},
                  {"dtype": "F32", "shape": [1], "data_offsets": [0]},
                  {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]},
                  "F32", [1, 2]):
        _write(path, json.dumps({"wq": entry}), b"\0" * 4)
        raises(ValueError, coupledqk.load_file, path, contains=(path, "'wq'", "malformed entry", "dtype"))
    _write(path, json.dumps({"x" * 100000: "bad"}))
    msg = raises(ValueError, coupledqk.load_file, path, contains=(path, "characters in all"))
    assert len(msg) < 1000, len(msg)


def test_scalar_where_a_matrix_is_expected():
    d, path = _files()
    layer = coupledqk.CoupledAttention(8, 2, "leapfrog", 2, seed=1)
    layer.save_safetensors(path)
    tensors, meta = coupledqk.load_file(path, with_metadata=True)
    for bad in (torch.tensor(1.0), torch.zeros(8), torch.zeros(8, 4), torch.zeros(8, 8, dtype=torch.int32)):
        coupledqk.save_file(dict(tensors, wq=bad), path, meta)
        before = _snapshot(d)
        raises(ValueError, coupledqk.CoupledAttention.from_safetensors, path,
               contains=(path, "'wq'", str(list(bad.shape)), "[dim, dim]"))
        assert _snapshot(d) == before


def test_gpt_sizes_and_token_ids():
    # The library's own rules and words (validate(GptConfig) in model/gpt.hpp), not Python's.
    raises(ValueError, coupledqk.GPT, 0, 8, 1, 2, 4, contains=("gpt: vocab (V) must be positive; got 0",))
    raises(ValueError, coupledqk.GPT, 10, 8, -1, 2, 4, contains=("gpt: layers (L) must be positive; got -1",))
    raises(ValueError, coupledqk.GPT, 10, 0, 1, 2, 4, contains=("gpt: dim (D) must be positive; got 0",))
    raises(ValueError, coupledqk.GPT, 10, 8, 1, 2, 0, contains=("gpt: context", "must be positive; got 0"))
    raises(ValueError, coupledqk.GPT, 10, 9, 1, 2, 4, contains=("gpt: dim (D) must be divisible by heads (H)",))
    raises(ValueError, coupledqk.GPT, 2**31, 8, 1, 2, 4, contains=("int32", str(2**31)))
    raises(ValueError, coupledqk.GPT, 10, 8, 1, 1, 4, attention="diff", contains=("even",))
    raises(ValueError, coupledqk.GPT, 10, 8, 1, 2, 4, steps=0, contains=("gpt: steps must be >= 1; got 0",))
    raises(ValueError, coupledqk.GPT, 10, 8, 1, 2, 4, steps=coupledqk.max_steps + 1,
           contains=(f"steps must be in 1..{coupledqk.max_steps}; got {coupledqk.max_steps + 1}",))
    raises(ValueError, coupledqk.GPT, 10, 8, 1, 2, 4, attention="nope", contains=("unknown attention variant 'nope'",))
    raises(ValueError, coupledqk.GPT, 10, 8, 1, 2, 4, init_time=0.0, contains=("init_time", "got 0"))
    raises(ValueError, coupledqk.GPT, 2**70, 8, 1, 2, 4, contains=("vocab", str(2**70), "64-bit"))
    raises(TypeError, coupledqk.GPT, 10.5, 8, 1, 2, 4, contains=("vocab", "10.5"))
    gpt = coupledqk.GPT(10, 8, 1, 2, 4, attention="leapfrog", steps=1)
    raises(ValueError, gpt, torch.tensor([[1, -1]]), contains=("token ids", "[0, vocab = 10)", "-1"))
    raises(ValueError, gpt, torch.tensor([[1, 10]]), contains=("token ids", "10"))
    raises(ValueError, gpt, torch.zeros(0, 2, dtype=torch.int64), contains=("[0, 2]", "B > 0"))
    raises(ValueError, gpt, torch.tensor([[1, 2]]), torch.tensor([[1, 10]]), contains=("target ids", "10"))
    raises(ValueError, gpt, torch.tensor([[1, 2]]), torch.tensor([1, 2]), contains=("targets", "[1, 2]"))
    logits, loss = gpt(torch.tensor([[1, 2]]), torch.tensor([[3, -100]]))
    assert logits.shape == (1, 2, 10) and torch.isfinite(loss)


def test_unallocatable_sizes_name_the_setting_and_the_bytes():
    msg = raises(ValueError, coupledqk.GPT, 10**9, 2**20, 1, 4, 8, contains=("vocab=1000000000", "dim=1048576", "bytes"))
    assert "MemoryError" not in msg and "bad_alloc" not in msg
    raises(ValueError, coupledqk.CoupledAttention, 10**8, 4, contains=("dim=100000000", "320000000000000000 bytes"))
    # under the cap but beyond any machine (2 TiB per matrix): the allocation itself fails -> the same
    # ValueError, not a bare MemoryError (only where the kernel refuses such a malloc: with
    # vm.overcommit_memory = 1 it would succeed and the first write would meet the OOM killer)
    with open("/proc/sys/vm/overcommit_memory") as f:
        if f.read().strip() == "1":
            return
    raises(ValueError, coupledqk.CoupledAttention, 2**19, 4, contains=("dim=524288", "bytes", "cannot be allocated"))



def test_layer_settings_in_the_library_words():
    # CoupledAttention and the functional form refuse what the C++ layer refuses, with its words
    # (Attention::check_config, the variant table), before anything is allocated.
    layer = coupledqk.CoupledAttention
    raises(ValueError, layer, 16, 0, contains=("attention: heads (H) must be positive; got 0",))
    raises(ValueError, layer, 16, 4, hidden=-1, contains=("attention: hidden (m) must be >= 0", "got -1"))
    raises(ValueError, layer, 16, 4, "diff", layer_index=-1, contains=("attention: layer_index must be >= 0; got -1",))
    raises(ValueError, layer, 16, 4, init_std=float("nan"), contains=("init_std must be finite", "nan"))
    raises(ValueError, layer, 16, 4, steps=0, contains=("attention 'leapfrog': steps must be in 1..", "got 0"))
    raises(ValueError, layer, 16, 4, steps=2**40, contains=("steps", str(2**40), "32-bit"))
    raises(ValueError, layer, 16, 4, "euler", memory="recompute", contains=("recompute needs a reversible integrator",))
    raises(TypeError, layer, 16, 4, memory=3, contains=("memory", "3"))
    x = torch.randn(1, 2, 16)
    params = dict(coupledqk.CoupledAttention(16, 4).named_parameters())
    raises(ValueError, coupledqk.attention, x, params, heads=3, contains=("attention: dim (D) must be divisible by heads",))
    raises(ValueError, coupledqk.parameter_shapes, 16, 4, hidden=-2, contains=("attention: hidden (m) must be >= 0",))


if __name__ == "__main__":
    main(globals())
