#!/usr/bin/python3
"""Bad input from Python gets an exception (ValueError / TypeError / KeyError) whose message names
the value seen and what is accepted -- never a crash; a non-contiguous input just works."""
import torch

import coupledqk
from harness import main, raises


def layer(**kw):
    args = dict(dim=16, heads=4, attention="leapfrog", steps=2, dynamics_init_scale=0.3, seed=1)
    args.update(kw)
    return coupledqk.CoupledAttention(**args)


def test_wrong_rank_or_width():
    m = layer()
    raises(ValueError, m, torch.randn(3, 16), contains=("[3, 16]", "[B, T, 16]"))
    raises(ValueError, m, torch.randn(2, 3, 12), contains=("[2, 3, 12]", "[B, T, 16]"))
    raises(ValueError, m, torch.randn(0, 3, 16), contains=("[0, 3, 16]", "B > 0"))


def test_dim_not_divisible_by_heads():
    raises(ValueError, layer, dim=18, heads=4, contains=("D = 18", "H = 4", "divisible"))
    raises(ValueError, layer, attention="diff", heads=1, contains=("even",))
    raises(ValueError, layer, heads=0, contains=("heads", "0"))


def test_unknown_variant_or_steps():
    msg = raises(ValueError, layer, attention="leapfrogg", contains=("'leapfrogg'", "leapfrog", "diff-affine"))
    assert all(v in msg for v in coupledqk.variants()), msg
    raises(TypeError, layer, attention=3, contains=("3", "leapfrog"))
    raises(ValueError, layer, steps=0, contains=("steps", "0"))
    raises(ValueError, layer, steps=coupledqk.max_steps + 1, contains=(f"1..{coupledqk.max_steps}",))
    raises(TypeError, layer, steps=1.5, contains=("steps", "1.5"))
    raises(ValueError, layer, memory="recompute", attention="euler", contains=("'euler'", "leapfrog"))
    raises(ValueError, layer, memory="disk", contains=("'disk'", "'store'", "'recompute'"))
    raises(ValueError, coupledqk.variant_info, "nope", contains=("'nope'", "leapfrog"))


def test_dtype_mismatch_and_non_float_input():
    m = layer()  # float32
    raises(TypeError, m, torch.randn(2, 3, 16, dtype=torch.float64),
           contains=("torch.float32", "torch.float64", "'wq'"))
    raises(TypeError, m, torch.ones(2, 3, 16, dtype=torch.int64), contains=("torch.int64", "torch.float32"))
    raises(TypeError, m, torch.ones(2, 3, 16, dtype=torch.float16), contains=("torch.float16", "torch.float64"))
    raises(TypeError, m, [[1.0] * 16], contains=("list",))
    raises(TypeError, layer, dtype=torch.float16, contains=("torch.float16", "torch.float32"))
    # after .double() the module takes float64
    assert layer().double()(torch.randn(2, 3, 16, dtype=torch.float64)).dtype == torch.float64


def test_device_mismatch():
    m = layer()
    # A tensor on another device: "meta" exists on every build of torch, CUDA or not.
    raises(ValueError, m, torch.empty(2, 3, 16, device="meta"), contains=("'meta'", "CPU"))
    if torch.cuda.is_available():
        raises(ValueError, m, torch.randn(2, 3, 16, device="cuda"), contains=("cuda", "CPU"))


def test_non_finite_input():
    x = torch.randn(2, 3, 16)
    x[1, 2, 5] = float("nan")
    raises(ValueError, layer(), x, contains=("input x", "nan"))
    m = layer()
    with torch.no_grad():
        m.dyn.W[1, 2] = float("inf")
    raises(ValueError, m, torch.randn(2, 3, 16), contains=("'dyn.W'", "inf", "finite"))


def test_state_dict_missing_or_misshapen():
    m = layer()
    sd = m.state_dict()
    missing = {k: v for k, v in sd.items() if k != "dyn.U"}
    raises(KeyError, m.load_state_dict, missing, contains=("'dyn.U'", "dyn.W", "wq"))
    bad = dict(sd, **{"dyn.W": torch.zeros(5, 4)})
    raises(ValueError, m.load_state_dict, bad, contains=("'dyn.W'", "[5, 4]", "[4, 4]"))
    ints = dict(sd, wq=torch.zeros(16, 16, dtype=torch.int32))
    raises(TypeError, m.load_state_dict, ints, contains=("'wq'", "torch.int32", "floating"))
    # inside a model: the key carries the prefix
    gpt = coupledqk.GPT(vocab=11, dim=16, layers=2, heads=4, context=8)
    sd = gpt.state_dict()
    del sd["h.1.attn.dyn.rho"]
    raises(KeyError, gpt.load_state_dict, sd, contains=("'h.1.attn.dyn.rho'",))
    # a full, well-shaped state_dict loads, and strict=False tolerates a missing tensor
    m.load_state_dict(layer(seed=2).state_dict())
    m.load_state_dict(missing, strict=False)


def test_gpt_tokens():
    gpt = coupledqk.GPT(vocab=11, dim=16, layers=1, heads=4, context=8)
    raises(TypeError, gpt, torch.zeros(2, 3), contains=("int64", "torch.float32"))
    raises(ValueError, gpt, torch.zeros(2, 9, dtype=torch.int64), contains=("[2, 9]", "context = 8"))
    raises(ValueError, gpt, torch.zeros(6, dtype=torch.int64), contains=("[6]", "[B, T]"))


def test_copies_and_pickles():
    # copy.deepcopy and torch.save of a whole module (the compiled layer pickles as its arguments)
    import copy
    import io
    m = layer(dtype=torch.float64, memory="recompute")
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    twin = copy.deepcopy(m)
    assert torch.equal(twin(x), m(x))
    with torch.no_grad():
        twin.wq.add_(1.0)
    assert not torch.equal(twin(x), m(x))  # its own parameters
    buffer = io.BytesIO()
    torch.save(m, buffer)
    buffer.seek(0)
    back = torch.load(buffer)
    assert back.memory == "recompute" and torch.equal(back(x), m(x))


def test_functional_form_errors():
    m = layer()
    params = dict(m.named_parameters())
    x = torch.randn(2, 3, 16)
    f = coupledqk.attention
    raises(TypeError, f, x, params, attention="leapfrog", steps=2, contains=("heads",))
    raises(KeyError, f, x, {k: v for k, v in params.items() if k != "wo"}, attention="leapfrog", steps=2, heads=4,
           contains=("'wo'", "dyn.rho"))
    raises(KeyError, f, x, dict(params, extra=params["wo"]), attention="leapfrog", steps=2, heads=4,
           contains=("'extra'",))
    raises(ValueError, f, x, dict(params, wq=params["wq"][:, :8]), attention="leapfrog", steps=2, heads=4,
           contains=("'wq'", "[16, 8]", "[16, 16]"))
    raises(TypeError, f, x, dict(params, wq=params["wq"].double()), attention="leapfrog", steps=2, heads=4,
           contains=("'wq'", "torch.float64", "torch.float32"))
    # wrong hidden width: the dynamics tensors do not match
    raises(ValueError, f, x, params, attention="leapfrog", steps=2, heads=4, hidden=6, contains=("dyn.W", "[6, 4]"))


def test_non_contiguous_input_just_works():
    m = layer(dtype=torch.float64)
    x = torch.randn(3, 16, 2, dtype=torch.float64)
    xt = x.transpose(1, 2)  # [3, 2, 16], not contiguous
    assert not xt.is_contiguous()
    xt.requires_grad_(True)
    y = m(xt)
    y.square().sum().backward()
    xc = xt.detach().contiguous().requires_grad_(True)
    yc = m(xc)
    yc.square().sum().backward()
    assert torch.equal(y, yc) and torch.equal(xt.grad, xc.grad)
    # a non-contiguous parameter (functional form)
    params = {k: v.detach() for k, v in m.named_parameters()}
    params["wq"] = params["wq"].t().contiguous().t()
    assert not params["wq"].is_contiguous()
    assert torch.equal(coupledqk.attention(xc, params, attention="leapfrog", steps=2, heads=4), yc)


def test_causal_and_thread_count_independent():
    m = layer(dtype=torch.float64)
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    y = m(x)
    x2 = x.clone()
    x2[:, 4:] = torch.randn(2, 2, 16, dtype=torch.float64)
    assert torch.equal(m(x2)[:, :4], y[:, :4])  # outputs at t ignore tokens after t
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        y2 = m(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(y, y2)


if __name__ == "__main__":
    main(globals())
