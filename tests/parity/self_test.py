#!/usr/bin/python3
"""Self-checks of the PyTorch reference and the parity driver (no C++ needed).

Usage: self_test.py [--quick]     (--quick skips the end-to-end driver runs)

Checks:
  * safetensors_io round-trips and rejects malformed files with clear errors;
  * the reference agrees with an independent, loop-based numpy implementation;
  * the standard variant agrees with torch.nn.MultiheadAttention;
  * torch.autograd.gradcheck (float64) on a tiny case of every variant;
  * with a = c = 0 (Pq2 = Pk2 = 0) every coupled variant equals its
    non-coupled counterpart exactly;
  * leapfrog run forward then backward (step -h) returns to the start (~1e-12);
  * causality: changing x after position t leaves y up to t unchanged;
  * the parity driver flags missing/extra/misshapen/wrong-dtype/inaccurate
    outputs and passes/fails end to end with reference_tool.py.
Ends with "N passed, M failed"; exit status 1 if anything failed.
"""

import math
import os
import struct
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import cases  # noqa: E402
import parity_test  # noqa: E402
import reference  # noqa: E402
import safetensors_io  # noqa: E402

VARIANTS = list(reference.VARIANTS)
COUPLED_TO_PLAIN = {"leapfrog": "standard", "euler": "standard", "uncoupled": "standard",
                    "diff-leapfrog": "diff", "diff-euler": "diff", "diff-uncoupled": "diff",
                    "affine": "standard", "diff-affine": "diff"}

RESULTS = {"passed": 0, "failed": 0}


def report(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    print(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  ({detail})" if detail else ""))
    sys.stdout.flush()


def run_check(name, func):
    """Run one check; func returns (ok, detail). Exceptions count as failures."""
    try:
        ok, detail = func()
    except Exception:  # noqa: BLE001 - a crash in a check is a failure, keep going
        ok, detail = False, "exception:\n" + traceback.format_exc()
    report(name, ok, detail)


def torch_case(variant, steps=2, seed=0, shape=None, layer_index=None):
    """Random case as float64 torch tensors (dy dropped) plus metadata."""
    shape = shape or cases.MAIN_SHAPE
    rng = np.random.default_rng([seed, VARIANTS.index(variant), steps])
    arrays, meta = cases.random_case(rng, variant, steps, layer_index=layer_index, **shape)
    tensors = {n: torch.tensor(v, dtype=torch.float64) for n, v in arrays.items() if n != "dy"}
    return tensors, meta


def max_rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


# ----------------------------------------------------------------------------
# safetensors_io
# ----------------------------------------------------------------------------

def check_safetensors_roundtrip():
    tensors = {"a": np.arange(6, dtype=np.float64).reshape(2, 3),
               "b": np.float32([1.5, -2.0]),
               "empty": np.zeros((0, 4)),
               "scalar": np.array(3.25)}
    meta = {"attention": "leapfrog", "steps": "3"}
    data = safetensors_io.dumps(tensors, meta)
    (header_len,) = struct.unpack("<Q", data[:8])
    back, back_meta = safetensors_io.loads(data)
    same = (list(back) == list(tensors) and back_meta == meta
            and all(back[n].dtype == tensors[n].dtype and back[n].shape == tensors[n].shape
                    and np.array_equal(back[n], tensors[n]) for n in tensors))
    return same and header_len % 8 == 0, f"header {header_len} bytes"


def _raw(header, buffer=b""):
    text = header.encode() if isinstance(header, str) else header
    return struct.pack("<Q", len(text)) + text + buffer


def check_safetensors_rejects():
    good = '{"t":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}}'
    bad_files = {
        "too short": b"\x01\x02",
        "header length past end": struct.pack("<Q", 999) + b"{}",
        "not JSON": _raw("{oops"),
        "not an object": _raw("[1,2]"),
        "bad dtype": _raw(good.replace("F64", "F17"), bytes(16)),
        "extra key": _raw(good.replace("}}", ',"x":1}}'), bytes(16)),
        "negative shape": _raw(good.replace("[2]", "[-2]"), bytes(16)),
        "size mismatch": _raw(good.replace("[2]", "[3]"), bytes(16)),
        "out of bounds": _raw(good, bytes(8)),
        "trailing bytes": _raw(good, bytes(24)),
        "gap": _raw('{"t":{"dtype":"F64","shape":[1],"data_offsets":[8,16]}}', bytes(16)),
        "overlap": _raw('{"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]},'
                        '"u":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}', bytes(8)),
        "non-string metadata": _raw('{"__metadata__":{"steps":3}}'),
        "duplicate key": _raw('{"t":{"dtype":"F64","shape":[0],"data_offsets":[0,0]},'
                              '"t":{"dtype":"F64","shape":[0],"data_offsets":[0,0]}}'),
    }
    accepted = []
    for label, data in bad_files.items():
        try:
            safetensors_io.loads(data)
            accepted.append(label)
        except safetensors_io.SafetensorsError:
            pass
    # And the unpadded well-formed file is accepted.
    safetensors_io.loads(_raw(good, bytes(16)))
    return not accepted, ("accepted: " + ", ".join(accepted)) if accepted else \
        f"{len(bad_files)} malformed files rejected"


# ----------------------------------------------------------------------------
# Independent loop-based implementation (numpy, one vector at a time)
# ----------------------------------------------------------------------------

def naive_forward(arrays, meta):
    """Same layer written token by token / head by head, straight from the maths."""
    scoring, integrator = reference.parse_variant(meta["attention"])
    steps, H = int(meta["steps"]), int(meta["heads"])
    x = arrays["x"]
    B, T, D = x.shape
    d = D // H
    Q, K, V = x @ arrays["wq"], x @ arrays["wk"], x @ arrays["wv"]
    g = {n[4:]: v for n, v in arrays.items() if n.startswith("dyn.")}

    def grad_V(q):
        return sum(g["a"][r] * math.tanh(g["W"][r] @ q + g["b"][r]) * g["W"][r]
                   for r in range(len(g["a"])))

    def grad_T(k):
        return sum(g["c"][r] * math.tanh(g["U"][r] @ k + g["e"][r]) * g["U"][r]
                   for r in range(len(g["c"])))

    def conditioner(which, c):
        # u = tanh(A c + a); s = 2 tanh((S u + s0) / 2); t = T u + t0, one vector at a time
        P = lambda n: g[f"{which}.{n}"]
        u = np.array([math.tanh(P("A")[r] @ c + P("a")[r]) for r in range(len(P("a")))])
        s = np.array([2 * math.tanh((P("S")[i] @ u + P("s")[i]) / 2) for i in range(len(c))])
        t = np.array([P("T")[i] @ u + P("t")[i] for i in range(len(c))])
        return s, t

    def flow(P1, p, P2, v):
        return P2 @ np.array([math.tanh(P1[r] @ v + p[r]) for r in range(len(p))])

    # Dynamics on every (token, head) pair.
    Qd, Kd = Q.copy(), K.copy()
    if integrator is not None:
        for b in range(B):
            for t in range(T):
                for head in range(H):
                    sl = slice(head * d, (head + 1) * d)
                    q, k = Q[b, t, sl].copy(), K[b, t, sl].copy()
                    h = math.log1p(math.exp(g["rho"][head])) / steps
                    for _ in range(steps):
                        if integrator == "leapfrog":
                            k = k - h / 2 * grad_V(q)
                            q = q + h * grad_T(k)
                            k = k - h / 2 * grad_V(q)
                        elif integrator == "euler":
                            q, k = q + h * grad_T(k), k - h * grad_V(q)
                        elif integrator == "drift":
                            q = q + h * k
                        elif integrator in ("newton-euler", "newton-leapfrog"):
                            def force(v):  # F2 silu(F1 v + f1) + f2
                                z = g["F1"] @ v + g["f1"]
                                return g["F2"] @ (z / (1 + np.exp(-z))) + g["f2"]
                            if integrator == "newton-euler":
                                q, k = q + h * k, k + h * force(q)
                            else:
                                k = k + h / 2 * force(q)
                                q = q + h * k
                                k = k + h / 2 * force(q)
                        elif integrator == "unit-leapfrog":
                            k = k - h / 2 * grad_V(q)
                            q = q + h * k
                            k = k - h / 2 * grad_V(q)
                        elif integrator == "affine":
                            sk, tk = conditioner("k", q)
                            k = np.array([k[i] * math.exp(h * sk[i]) + h * tk[i] for i in range(d)])
                            sq, tq = conditioner("q", k)
                            q = np.array([q[i] * math.exp(h * sq[i]) + h * tq[i] for i in range(d)])
                        else:
                            q = q + h * flow(g["Pq1"], g["pq"], g["Pq2"], q)
                            k = k + h * flow(g["Pk1"], g["pk"], g["Pk2"], k)
                    Qd[b, t, sl], Kd[b, t, sl] = q, k

    def probs(b, head, i):
        # softmax over j <= i of q_i . k_j / sqrt(d) for one (batch, head, query)
        sl = slice(head * d, (head + 1) * d)
        s = np.array([Qd[b, i, sl] @ Kd[b, j, sl] / math.sqrt(d) for j in range(i + 1)])
        e = np.exp(s - s.max())
        return e / e.sum()

    O = np.zeros_like(x)
    for b in range(B):
        for i in range(T):
            if scoring == "softmax":
                for head in range(H):
                    sl = slice(head * d, (head + 1) * d)
                    p = probs(b, head, i)
                    O[b, i, sl] = sum(p[j] * V[b, j, sl] for j in range(i + 1))
            else:
                lam_init = 0.8 - 0.6 * math.exp(-0.3 * int(meta["layer_index"]))
                lam = (math.exp(arrays["lq1"] @ arrays["lk1"])
                       - math.exp(arrays["lq2"] @ arrays["lk2"]) + lam_init)
                for grp in range(H // 2):
                    sl = slice(grp * 2 * d, (grp + 1) * 2 * d)
                    p1, p2 = probs(b, 2 * grp, i), probs(b, 2 * grp + 1, i)
                    o = sum((p1[j] - lam * p2[j]) * V[b, j, sl] for j in range(i + 1))
                    rms = math.sqrt(np.mean(o ** 2) + 1e-5)
                    O[b, i, sl] = o / rms * arrays["subln"] * (1 - lam_init)
    return O @ arrays["wo"]


def check_naive(variant):
    def run():
        worst_err = 0.0
        for shape, steps in ((cases.MAIN_SHAPE, 3), (cases.ALT_SHAPE, 1)):
            tensors, meta = torch_case(variant, steps=steps, seed=1, shape=shape)
            y = reference.forward(tensors, meta).numpy()
            y_naive = naive_forward({n: v.numpy() for n, v in tensors.items()}, meta)
            worst_err = max(worst_err, max_rel(y, y_naive))
        return worst_err <= 1e-12, f"max rel err {worst_err:.1e}"
    return run


def check_multihead_attention():
    """standard == torch.nn.MultiheadAttention (no bias, causal mask)."""
    tensors, meta = torch_case("standard", seed=2)
    D, H = tensors["x"].shape[-1], int(meta["heads"])
    T = tensors["x"].shape[1]
    mha = torch.nn.MultiheadAttention(D, H, bias=False, batch_first=True).double()
    with torch.no_grad():
        # torch computes x @ weight^T; our weights are stored [in, out].
        mha.in_proj_weight.copy_(torch.cat([tensors["wq"].T, tensors["wk"].T, tensors["wv"].T]))
        mha.out_proj.weight.copy_(tensors["wo"].T)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        x = tensors["x"]
        y_torch, _ = mha(x, x, x, attn_mask=mask, need_weights=False)
        y = reference.forward(tensors, meta)
    err = max_rel(y, y_torch)
    return err <= 1e-12, f"max rel err {err:.1e}"


def check_multihead_attention_masks():
    """standard under every mask == torch.nn.MultiheadAttention with the same boolean attn_mask
    (True = not allowed) and, for padded batches, its key_padding_mask (valid rows compared;
    padding rows must be zero in the reference)."""
    worst = 0.0
    for meta_extra, lengths in (({"causal": "0"}, None), ({"window": "3"}, None),
                                ({"causal": "0", "window": "2"}, None),
                                ({"causal": "0", "lengths": "3,7"}, [3, 7]),
                                ({"lengths": "7,4", "window": "2"}, [7, 4])):
        tensors, meta = torch_case("standard", seed=3)
        meta.update(meta_extra)
        D, H = tensors["x"].shape[-1], int(meta["heads"])
        B, T = tensors["x"].shape[:2]
        causal, w = meta.get("causal", "1") == "1", int(meta.get("window", "0"))
        i, j = torch.arange(T).view(T, 1), torch.arange(T).view(1, T)
        blocked = (j > i) if causal else torch.zeros(T, T, dtype=torch.bool)
        if w:
            blocked |= (i - j >= w) if causal else ((i - j).abs() >= w)
        pad = None
        if lengths:
            pad = torch.arange(T).view(1, T) >= torch.tensor(lengths).view(B, 1)
        mha = torch.nn.MultiheadAttention(D, H, bias=False, batch_first=True).double()
        with torch.no_grad():
            mha.in_proj_weight.copy_(torch.cat([tensors["wq"].T, tensors["wk"].T, tensors["wv"].T]))
            mha.out_proj.weight.copy_(tensors["wo"].T)
            x = tensors["x"]
            y_torch, _ = mha(x, x, x, attn_mask=blocked, key_padding_mask=pad, need_weights=False)
            y = reference.forward(tensors, meta)
        if pad is not None:
            if float(y[pad].abs().max()) != 0.0:
                return False, f"{meta_extra}: padding rows are not zero"
            y, y_torch = y[~pad], y_torch[~pad]
        worst = max(worst, max_rel(y, y_torch))
    return worst <= 1e-12, f"5 masks, max rel err {worst:.1e}"


def check_rope_formula():
    """rope() == the rotation written out pair by pair, and scores depend on t - t' only."""
    rng = np.random.default_rng(5)
    X = torch.tensor(rng.standard_normal((2, 6, 3, 8)))
    pos = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    Y = reference.rope(X, pos, 50.0)
    want = X.clone()
    for b in range(2):
        for t in range(6):
            for i in range(4):
                a = float(pos[b, t]) * 50.0 ** (-2.0 * i / 8)
                x1, x2 = X[b, t, :, i], X[b, t, :, i + 4]
                want[b, t, :, i] = x1 * math.cos(a) - x2 * math.sin(a)
                want[b, t, :, i + 4] = x2 * math.cos(a) + x1 * math.sin(a)
    err = max_rel(Y, want)
    q, k = X[0], X[1]
    s0 = torch.einsum("thd,shd->hts", reference.rope(q[None], pos[:1], 50.0)[0],
                      reference.rope(k[None], pos[:1], 50.0)[0])
    s1 = torch.einsum("thd,shd->hts", reference.rope(q[None], pos[:1] + 100, 50.0)[0],
                      reference.rope(k[None], pos[:1] + 100, 50.0)[0])
    shift = max_rel(s1, s0)
    return err <= 1e-14 and shift <= 1e-10, f"formula err {err:.1e}, shift err {shift:.1e}"


# ----------------------------------------------------------------------------
# Properties of the reference
# ----------------------------------------------------------------------------

def check_gradcheck(variant):
    def run():
        tiny = dict(B=2, T=3, D=6, H=2, m=4)
        tensors, meta = torch_case(variant, steps=2, seed=3, shape=tiny)
        names = list(tensors)
        inputs = tuple(tensors[n].clone().requires_grad_(True) for n in names)

        def fn(*values):
            return reference.forward(dict(zip(names, values)), meta)

        ok = torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-7, rtol=1e-5,
                                      raise_exception=False)
        return ok, f"{sum(v.numel() for v in inputs)} inputs"
    return run


def check_zero_dynamics(variant):
    """With a = c = 0 (or Pq2 = Pk2 = 0) the dynamics are the identity."""
    def run():
        tensors, meta = torch_case(variant, steps=3, seed=4)
        if "uncoupled" in variant:
            zero = ("dyn.Pq2", "dyn.Pk2")
        elif "affine" in variant:
            zero = tuple(f"dyn.{c}.{n}" for c in "kq" for n in "SsTt")
        else:
            zero = ("dyn.a", "dyn.c")
        for name in zero:
            tensors[name] = torch.zeros_like(tensors[name])
        y = reference.forward(tensors, meta)
        plain = COUPLED_TO_PLAIN[variant]
        plain_tensors = {n: v for n, v in tensors.items() if not n.startswith("dyn.")}
        y_plain = reference.forward(plain_tensors, dict(meta, attention=plain))
        return torch.equal(y, y_plain), f"vs {plain}, max diff {float((y - y_plain).abs().max()):.1e}"
    return run


def check_velocity_zero_force(variant):
    """The velocity family at F2 = f2 = 0 (a = 0): q' = q + tau k, k' = k; at tau = 0 the identity."""
    def run():
        tensors, meta = torch_case(variant, steps=3, seed=4)
        integrator = reference.parse_variant(variant)[1]
        for name in ("dyn.F2", "dyn.f2", "dyn.a"):
            if name in tensors:
                tensors[name] = torch.zeros_like(tensors[name])
        dyn = reference.dynamics_tensors(tensors)
        B, T, D = tensors["x"].shape
        H = int(meta["heads"])
        gen = torch.Generator().manual_seed(9)
        q0 = torch.randn(B, T, H, D // H, generator=gen, dtype=torch.float64)
        k0 = torch.randn(B, T, H, D // H, generator=gen, dtype=torch.float64)
        h = reference.step_sizes(tensors["dyn.rho"], 3)
        q1, k1 = reference.integrate(q0, k0, dyn, integrator, 3, h)
        tau = F.softplus(tensors["dyn.rho"]).reshape(-1, 1)
        err = float((q1 - (q0 + tau * k0)).abs().max())
        q2, k2 = reference.integrate(q0, k0, dyn, integrator, 3, 0 * h)
        ok = err <= 1e-14 and torch.equal(k1, k0) and torch.equal(q2, q0) and torch.equal(k2, k0)
        return ok, f"max |q' - (q + tau k)| {err:.1e}"
    return run


def check_leapfrog_reversible():
    worst_back, least_moved = 0.0, float("inf")
    for steps in (1, 5):
        tensors, meta = torch_case("leapfrog", steps=steps, seed=5)
        dyn = reference.dynamics_tensors(tensors)
        B, T, D = tensors["x"].shape
        H = int(meta["heads"])
        gen = torch.Generator().manual_seed(steps)
        q0 = torch.randn(B, T, H, D // H, generator=gen, dtype=torch.float64)
        k0 = torch.randn(B, T, H, D // H, generator=gen, dtype=torch.float64)
        h = reference.step_sizes(tensors["dyn.rho"], steps)
        q1, k1 = reference.integrate(q0, k0, dyn, "leapfrog", steps, h)
        q2, k2 = reference.integrate(q1, k1, dyn, "leapfrog", steps, -h)
        worst_back = max(worst_back, float((q2 - q0).abs().max()), float((k2 - k0).abs().max()))
        least_moved = min(least_moved, float((q1 - q0).abs().max()), float((k1 - k0).abs().max()))
    # The round trip must return, and the forward trip must actually have moved.
    ok = worst_back <= 1e-12 and least_moved > 1e-3
    return ok, f"round-trip error {worst_back:.1e}, forward moved {least_moved:.1e}"


def check_affine_inverse():
    """The closed-form inverse undoes the affine coupling step by step (~1e-12), and log|det J|
    of one step, from autograd, equals h * (sum s_k + sum s_q)."""
    worst_back, least_moved, worst_det = 0.0, float("inf"), 0.0
    for steps in (1, 5):
        tensors, meta = torch_case("affine", steps=steps, seed=5)
        dyn = reference.dynamics_tensors(tensors)
        B, T, D = tensors["x"].shape
        H = int(meta["heads"])
        d = D // H
        gen = torch.Generator().manual_seed(steps)
        q0 = torch.randn(B, T, H, d, generator=gen, dtype=torch.float64)
        k0 = torch.randn(B, T, H, d, generator=gen, dtype=torch.float64)
        h = reference.step_sizes(tensors["dyn.rho"], steps).reshape(-1, 1)
        q1, k1 = reference.integrate(q0, k0, dyn, "affine", steps, h.reshape(-1))
        q2, k2 = q1, k1
        for _ in range(steps):
            q2, k2 = reference.affine_inverse_step(q2, k2, dyn, h)
        worst_back = max(worst_back, float((q2 - q0).abs().max()), float((k2 - k0).abs().max()))
        least_moved = min(least_moved, float((q1 - q0).abs().max()), float((k1 - k0).abs().max()))
        # one pair, one step: log|det| of the 2d x 2d Jacobian against the formula
        hq = h[0, 0]
        pair = torch.cat([q0[0, 0, 0], k0[0, 0, 0]])
        step = lambda z: torch.cat(reference.affine_step(z[:d], z[d:], dyn, hq))
        J = torch.autograd.functional.jacobian(step, pair)
        s_k, _ = reference.affine_conditioner(pair[:d], dyn, "k")
        k_new = step(pair)[d:]
        s_q, _ = reference.affine_conditioner(k_new, dyn, "q")
        formula = hq * (s_k.sum() + s_q.sum())
        worst_det = max(worst_det, float(abs(torch.linalg.slogdet(J)[1] - formula)))
    ok = worst_back <= 1e-12 and least_moved > 1e-3 and worst_det <= 1e-12
    return ok, (f"round-trip error {worst_back:.1e}, forward moved {least_moved:.1e}, "
                f"log-det error {worst_det:.1e}")


def check_causality(variant):
    def run():
        tensors, meta = torch_case(variant, steps=3, seed=6)
        y = reference.forward(tensors, meta)
        T = y.shape[1]
        gen = torch.Generator().manual_seed(7)
        for t in range(T - 1):
            changed = dict(tensors)
            x = tensors["x"].clone()
            x[:, t + 1:] = torch.randn(x[:, t + 1:].shape, generator=gen, dtype=torch.float64)
            changed["x"] = x
            y2 = reference.forward(changed, meta)
            if not torch.equal(y2[:, :t + 1], y[:, :t + 1]):
                return False, f"y[:, :{t + 1}] changed when x[:, {t + 1}:] changed"
            if torch.equal(y2[:, t + 1:], y[:, t + 1:]):
                return False, f"y[:, {t + 1}:] did not change (test is vacuous)"
        return True, f"T={T}, exact"
    return run


# ----------------------------------------------------------------------------
# The parity driver
# ----------------------------------------------------------------------------

def check_compare_detects_problems():
    rng = np.random.default_rng(8)
    case_tensors, meta = cases.random_case(rng, "diff-leapfrog", 2, **cases.ALT_SHAPE)
    ref = parity_test.reference_for(case_tensors, meta)
    good = {n: v.copy() for n, v in ref.items()}
    errors, problems = parity_test.compare(case_tensors, "F64", good, ref)
    if not parity_test.passed(errors, problems, "F64"):
        return False, f"exact output rejected: {problems}"
    faults = {
        "missing": lambda o: o.pop("grad.dyn.W"),
        "extra": lambda o: o.__setitem__("grad.dy", o["y"]),
        "shape": lambda o: o.__setitem__("grad.subln", o["grad.subln"][:-1]),
        "dtype": lambda o: o.__setitem__("y", o["y"].astype(np.float32)),
        "inaccurate": lambda o: o.__setitem__("grad.dyn.rho", o["grad.dyn.rho"] * (1 + 1e-5)),
        "nan": lambda o: o["grad.lq1"].__setitem__(0, np.nan),
    }
    missed = []
    for label, fault in faults.items():
        out = {n: v.copy() for n, v in ref.items()}
        fault(out)
        errors, problems = parity_test.compare(case_tensors, "F64", out, ref)
        if parity_test.passed(errors, problems, "F64"):
            missed.append(label)
    return not missed, ("missed: " + ", ".join(missed)) if missed else f"{len(faults)} faults caught"


def _driver(tool_command, *extra):
    """Run parity_test.py with a tool (list: executable + fixed args via a wrapper script)."""
    with tempfile.TemporaryDirectory(prefix="coupledqk_selftest_") as tmp:
        wrapper = os.path.join(tmp, "tool.sh")
        with open(wrapper, "w") as handle:
            handle.write("#!/bin/sh\nexec " + " ".join(tool_command) + ' "$@"\n')
        os.chmod(wrapper, 0o755)
        proc = subprocess.run([sys.executable, os.path.join(HERE, "parity_test.py"),
                               "--tool", wrapper, *extra],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, (lines[-1] if lines else ""), proc.stdout + proc.stderr


def check_driver_end_to_end():
    tool = ["/usr/bin/python3", os.path.join(HERE, "reference_tool.py")]
    rc, last, text = _driver(tool, "--variant", "leapfrog", "--variant", "diff-uncoupled")
    if rc != 0 or not last.endswith(" passed, 0 failed"):
        return False, f"reference tool did not pass (rc={rc}):\n{text}"
    for fault in ("perturb", "drop", "extra", "shape", "dtype", "crash"):
        rc_f, last_f, text_f = _driver(tool + ["--fault", fault], "--variant", "standard")
        if rc_f != 1 or not last_f.startswith("0 passed,"):
            return False, f"fault {fault} not caught (rc={rc_f}):\n{text_f}"
    rc_m, last_m, _ = _driver(["/nonexistent/tool"], "--variant", "standard")
    if rc_m != 1:
        return False, "a tool that cannot run did not fail the driver"
    return True, f"reference tool: {last}; 6 injected faults and a broken tool caught"


def main():
    quick = "--quick" in sys.argv[1:]

    run_check("safetensors round trip", check_safetensors_roundtrip)
    run_check("safetensors rejects malformed files", check_safetensors_rejects)
    for variant in VARIANTS:
        run_check(f"{variant}: matches loop-based numpy implementation", check_naive(variant))
    run_check("standard: matches torch.nn.MultiheadAttention", check_multihead_attention)
    run_check("standard, masks and padding: matches torch.nn.MultiheadAttention",
              check_multihead_attention_masks)
    run_check("rope: the rotate-half formula; scores depend on t - t' only", check_rope_formula)
    for variant in VARIANTS:
        run_check(f"{variant}: gradcheck", check_gradcheck(variant))
    for variant in COUPLED_TO_PLAIN:
        run_check(f"{variant}: zero dynamics == {COUPLED_TO_PLAIN[variant]}",
                  check_zero_dynamics(variant))
    for variant in VARIANTS:
        if reference.parse_variant(variant)[1] in ("drift", "unit-leapfrog") + reference.NEWTON:
            run_check(f"{variant}: zero force == q + tau k", check_velocity_zero_force(variant))
    run_check("leapfrog: forward then backward returns to start", check_leapfrog_reversible)
    run_check("affine: closed-form inverse and log-determinant", check_affine_inverse)
    for variant in VARIANTS:
        run_check(f"{variant}: causal", check_causality(variant))
    run_check("driver: compare() catches bad outputs", check_compare_detects_problems)
    if not quick:
        run_check("driver: end to end with reference_tool.py", check_driver_end_to_end)

    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
