#!/usr/bin/python3
"""torch.autograd.gradcheck (float64 central differences) of coupledqk's autograd Function, i.e. of
the library's analytic backward, for every registered variant at steps 1 and 3, and with
memory="recompute" for every reversible one. Tiny shapes: B=2, T=3, D=8, H=2, m=4."""
import torch

import coupledqk
from harness import main


def random_layer(variant, steps, memory="store", seed=0):
    """A float64 layer whose every parameter is random and O(1)-scaled (non-trivial dynamics)."""
    torch.manual_seed(seed)
    layer = coupledqk.CoupledAttention(8, 2, variant, steps, hidden=4, layer_index=1, memory=memory,
                                       dtype=torch.float64, seed=seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if name.startswith("w") else 0.3))
            if name == "dyn.rho":
                p.add_(0.3)
            if name == "subln":
                p.add_(1.0)
    return layer


def check(variant, steps, memory="store"):
    layer = random_layer(variant, steps, memory)
    names = layer.parameter_names()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    params = [layer.get_parameter(n) for n in names]

    def f(x, *ps):
        return coupledqk.attention(x, dict(zip(names, ps)), attention=variant, steps=steps, heads=2,
                                   layer_index=1, hidden=4, memory=memory)

    assert torch.autograd.gradcheck(f, (x, *params), eps=1e-6, atol=1e-7, rtol=1e-5), (variant, steps, memory)
    # the module and the functional form are the same function
    assert torch.equal(layer(x), f(x, *params))


VELOCITY_FAMILY = ("drift", "newton-euler", "newton-leapfrog", "unit-leapfrog")


def test_every_variant_steps_1_and_3():
    names = coupledqk.variants()
    # the velocity family of spec 3c, in both scorings, is among them (so checked below)
    for name in VELOCITY_FAMILY:
        assert name in names and "diff-" + name in names, (name, names)
    for variant in names:
        for steps in (1, 3):
            check(variant, steps)


def test_recompute_for_every_reversible_variant():
    reversible = [v for v in coupledqk.variants() if coupledqk.variant_info(v)["is_reversible"]]
    assert "leapfrog" in reversible and "affine" in reversible, reversible
    for variant in reversible:
        check(variant, 3, memory="recompute")


def test_reused_buffers_change_nothing():
    # A layer keeps its last pass's buffers for the next forward; passes of other shapes, passes
    # left in flight and passes run twice must give exactly what a fresh layer gives.
    for variant, memory in (("diff-leapfrog", "store"), ("affine", "recompute"), ("uncoupled", "store")):
        layer = random_layer(variant, 2, memory)
        shapes = [(2, 3), (1, 5), (3, 2), (2, 3)]
        inputs = [torch.randn(b, t, 8, dtype=torch.float64, requires_grad=True) for b, t in shapes]
        # two in flight at once, then one differentiated twice (retain_graph)
        ys = [layer(x) for x in inputs[:2]]
        ys[1].sum().backward(retain_graph=True)
        ys[1].sum().backward()
        ys[0].square().sum().backward()
        for x in inputs[2:]:
            layer.zero_grad()  # the parameter gradients of the last step are compared below
            layer(x).square().sum().backward()
            with torch.no_grad():
                layer(x)
        grads = [x.grad.clone() for x in inputs]
        last = {n: p.grad.clone() for n, p in layer.named_parameters()}
        for i, x in enumerate(inputs):
            fresh = random_layer(variant, 2, memory)  # same seed: same parameters, new kernel
            x2 = x.detach().clone().requires_grad_(True)
            y = fresh(x2)
            (y.sum() * 2 if i == 1 else y.square().sum()).backward()
            assert torch.equal(grads[i], x2.grad), (variant, i)
        assert all(torch.equal(last[n], p.grad) for n, p in fresh.named_parameters()), variant


def test_velocity_family_tensor_names():
    # state_dict keys are the library's tensor names, and the dynamics' are those of spec 3c
    dyn = {"drift": {"dyn.rho"},
           "newton-euler": {"dyn.F1", "dyn.f1", "dyn.F2", "dyn.f2", "dyn.rho"},
           "newton-leapfrog": {"dyn.F1", "dyn.f1", "dyn.F2", "dyn.f2", "dyn.rho"},
           "unit-leapfrog": {"dyn.W", "dyn.b", "dyn.a", "dyn.rho"}}
    for name, expected in dyn.items():
        for scoring, extra in (("", set()), ("diff-", {"lq1", "lk1", "lq2", "lk2", "subln"})):
            layer = coupledqk.CoupledAttention(8, 2, scoring + name, 1, hidden=4, dtype=torch.float64)
            keys = set(layer.state_dict().keys())
            assert keys == {"wq", "wk", "wv", "wo"} | expected | extra, (scoring + name, sorted(keys))
            assert keys == set(layer.parameter_names()), (scoring + name, layer.parameter_names())
            m, d = 4, 4
            shapes = {k: tuple(v.shape) for k, v in layer.state_dict().items()}
            if "dyn.F1" in expected:
                assert shapes["dyn.F1"] == (m, d) and shapes["dyn.F2"] == (d, m), shapes
                assert shapes["dyn.f1"] == (m,) and shapes["dyn.f2"] == (d,), shapes
            assert shapes["dyn.rho"] == (2,), shapes  # one integration time per q/k pair of a token


def test_gradcheck_can_fail():
    # A wrong backward must be caught: scale the library's dx and gradcheck has to say no.
    layer = random_layer("leapfrog", 2)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)

    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, dy):
            return dy * 1.001

    ok = torch.autograd.gradcheck(lambda x: layer(Wrong.apply(x)), (x,), eps=1e-6, atol=1e-7, rtol=1e-5,
                                  raise_exception=False)
    assert not ok


if __name__ == "__main__":
    main(globals())
