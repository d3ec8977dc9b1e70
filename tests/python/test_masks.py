#!/usr/bin/python3
"""Masks, padded and packed sequences and rotary positions in the Python module (issue 22):
CoupledAttention(..., causal, window, positions, rope_base, rope_order), module(x, lengths=...),
module.forward_packed(x, offsets) and coupledqk.attention(...) with the same keywords, against the
PyTorch reference of tests/parity (written from the definitions) and torch.autograd.gradcheck; the
refusals; the settings surviving pickling and safetensors files."""
import copy
import os
import pickle
import sys
import tempfile

import torch

import coupledqk
from harness import main

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import reference  # noqa: E402

VARIANTS = ("standard", "leapfrog", "affine", "diff-leapfrog")
SETTINGS = [dict(), dict(causal=False), dict(window=2), dict(causal=False, window=2),
            dict(positions="rope", rope_base=100.0),
            dict(causal=False, positions="rope", rope_base=100.0, rope_order="rotate-then-dynamics")]


def random_layer(variant, seed=0, **kw):
    torch.manual_seed(seed)
    layer = coupledqk.CoupledAttention(8, 2, variant, 2, hidden=4, layer_index=1, dtype=torch.float64, seed=seed,
                                       **kw)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if name.startswith("w") else 0.3))
            if name == "dyn.rho":
                p.add_(0.3)
            if name == "subln":
                p.add_(1.0)
    return layer


def reference_meta(layer, **extra):
    meta = layer.metadata()
    meta.update(extra)
    return meta


def reference_y(layer, x, **extra):
    tensors = {n: p.detach() for n, p in layer.state_dict().items()}
    tensors["x"] = x
    return reference.forward(tensors, reference_meta(layer, **extra))


def test_every_setting_matches_the_reference():
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    for variant in VARIANTS:
        for kw in SETTINGS:
            layer = random_layer(variant, **kw)
            err = float((layer(x) - reference_y(layer, x)).abs().max())
            assert err < 1e-12, (variant, kw, err)


def test_padded_sequences():
    x = torch.randn(3, 6, 8, dtype=torch.float64)
    lengths = torch.tensor([6, 2, 4])
    for variant in VARIANTS:
        for kw in SETTINGS:
            layer = random_layer(variant, **kw)
            y = layer(x, lengths=lengths)
            want = reference_y(layer, x, lengths="6,2,4")
            assert float((y - want).abs().max()) < 1e-12, (variant, kw)
            for b, n in enumerate(lengths.tolist()):
                assert torch.all(y[b, n:] == 0), (variant, kw)
                alone = layer(x[b:b + 1, :n])
                assert float((alone[0] - y[b, :n]).abs().max()) < 1e-12


def test_packed_equals_one_by_one():
    offsets = torch.tensor([0, 5, 6, 11], dtype=torch.int32)
    x = torch.randn(11, 8, dtype=torch.float64)
    for variant in VARIANTS:
        for kw in SETTINGS:
            layer = random_layer(variant, **kw)
            y = layer.forward_packed(x, offsets)
            assert y.shape == x.shape
            for lo, hi in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
                alone = layer(x[None, lo:hi])[0]
                assert float((alone - y[lo:hi]).abs().max()) < 1e-12, (variant, kw)
            want = reference_y(layer, x[None], offsets="0,5,6,11")[0]
            assert float((y - want).abs().max()) < 1e-12, (variant, kw)


def test_gradcheck_with_masks():
    lengths = torch.tensor([3, 1])
    offsets = torch.tensor([0, 2, 5])
    for variant in ("leapfrog", "diff-leapfrog", "affine"):
        for kw in (dict(causal=False, window=2, positions="rope", rope_base=50.0), dict(window=2)):
            layer = random_layer(variant, **kw)
            names = layer.parameter_names()
            params = [layer.get_parameter(n) for n in names]
            x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
            xp = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)

            def padded(x, *ps):
                return coupledqk.attention(x, dict(zip(names, ps)), attention=variant, steps=2, heads=2,
                                           layer_index=1, hidden=4, lengths=lengths, **kw)

            def packed(x, *ps):
                return coupledqk.attention(x, dict(zip(names, ps)), attention=variant, steps=2, heads=2,
                                           layer_index=1, hidden=4, offsets=offsets, **kw)

            assert torch.autograd.gradcheck(padded, (x, *params), eps=1e-6, atol=1e-7, rtol=1e-5), (variant, kw)
            assert torch.autograd.gradcheck(packed, (xp, *params), eps=1e-6, atol=1e-7, rtol=1e-5), (variant, kw)
            # padding rows get zero gradient
            y = padded(x, *params)
            (gx,) = torch.autograd.grad(y.sum(), x)
            assert torch.all(gx[0, 3:] == 0) and torch.all(gx[1, 1:] == 0)
            assert torch.equal(layer(x, lengths=lengths), y)
            assert torch.equal(layer.forward_packed(xp, offsets), packed(xp, *params))


def raises(kind, text, f):
    try:
        f()
    except kind as e:
        assert text in str(e), f"expected {text!r} in {str(e)!r}"
        return
    raise AssertionError(f"no {kind.__name__} ({text!r})")


def test_refusals_say_what_was_wrong():
    raises(ValueError, "window must be >= 0 (0 means no window); got -1",
           lambda: coupledqk.CoupledAttention(8, 2, window=-1))
    raises(TypeError, "causal must be a bool; got int 0", lambda: coupledqk.CoupledAttention(8, 2, causal=0))
    raises(ValueError, "positions is 'alibi'; accepted: 'none', 'rope'",
           lambda: coupledqk.CoupledAttention(8, 2, positions="alibi"))
    raises(ValueError, "rope_order is 'after'", lambda: coupledqk.CoupledAttention(8, 2, rope_order="after"))
    raises(ValueError, "rope_base must be finite and > 1; got 0.5",
           lambda: coupledqk.CoupledAttention(8, 2, positions="rope", rope_base=0.5))
    raises(ValueError, "positions = rope needs an even head width D/H; got D/H = 3",
           lambda: coupledqk.CoupledAttention(9, 3, positions="rope"))
    layer = coupledqk.CoupledAttention(8, 2, dtype=torch.float64, seed=1)
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    raises(ValueError, "length of sequence 1 is 5; expected 1..4", lambda: layer(x, lengths=torch.tensor([4, 5])))
    raises(ValueError, "lengths holds 3 values; x holds B = 2", lambda: layer(x, lengths=torch.tensor([1, 2, 3])))
    raises(TypeError, "lengths has dtype torch.float32; expected an integer tensor",
           lambda: layer(x, lengths=torch.tensor([1.0, 2.0])))
    raises(TypeError, "lengths must be a 1-D integer torch.Tensor; got list", lambda: layer(x, lengths=[1, 2]))
    xp = torch.randn(6, 8, dtype=torch.float64)
    raises(ValueError, "offsets end at 5; x holds N = 6 rows", lambda: layer.forward_packed(xp, torch.tensor([0, 5])))
    raises(ValueError, "offsets[1] = 3, offsets[2] = 3",
           lambda: layer.forward_packed(xp, torch.tensor([0, 3, 3, 6])))
    raises(ValueError, "packed x has shape [2, 4, 8] (rank 3); expected [N, 8]",
           lambda: layer.forward_packed(x, torch.tensor([0, 8])))
    raises(ValueError, "not both", lambda: coupledqk.attention(
        xp, dict(layer.named_parameters()), heads=2, lengths=torch.tensor([6]), offsets=torch.tensor([0, 6])))


def test_settings_survive_copies_and_files():
    layer = random_layer("leapfrog", causal=False, window=3, positions="rope", rope_base=500.0,
                         rope_order="rotate-then-dynamics")
    x = torch.randn(1, 7, 8, dtype=torch.float64)
    y = layer(x)
    assert torch.equal(copy.deepcopy(layer)(x), y)
    assert torch.equal(pickle.loads(pickle.dumps(layer))(x), y)
    meta = layer.metadata()
    assert meta["causal"] == "0" and meta["window"] == "3" and meta["positions"] == "rope"
    assert meta["rope_order"] == "rotate-then-dynamics" and float(meta["rope_base"]) == 500.0
    assert "causal" not in coupledqk.CoupledAttention(8, 2).metadata()  # defaults are not written
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "layer.safetensors")
        layer.save_safetensors(path)
        again = coupledqk.CoupledAttention.from_safetensors(path)
        assert torch.equal(again(x), y)
    assert "window=3" in repr(layer) and "positions='rope'" in repr(layer)


if __name__ == "__main__":
    main(globals())
