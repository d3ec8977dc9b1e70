"""PyTorch reference implementation of the coupledqk attention layer.

One causal multi-head self-attention layer whose per-head queries and keys are
evolved by "coupled query-key dynamics" before scoring.  Written for clarity,
not speed; every function works in whatever floating dtype it is given (the
parity tests use float64).

Notation (shapes):
    x            [B, T, D]      input; H heads of size d = D / H
    wq wk wv wo  [D, D]         stored [in, out]:  Q = x @ wq  (no biases)
    Q, K, V      [B, T, H, d]   head h owns channels [h*d, (h+1)*d)
    dynamics     act on each (token, head) pair (q, k) in R^d x R^d independently,
                 with step size h = softplus(rho[head]) / steps for `steps` steps.

Tensor names follow the case-file convention: "x", "wq", ..., "dyn.W", "lq1", ...
Metadata values are strings: attention, steps, heads, m, layer_index, and optionally the mask and
the positions (absent: causal, no window, equal sequences, no positions):
    causal       "1" (default) or "0" (bidirectional)
    window       sliding window w, "0" = none (causal: t - w < t' <= t; bidirectional: |t - t'| < w)
    lengths      "L0,L1,..." valid lengths of the B right-padded sequences of x [B, T, D]
    offsets      "0,o1,...,N" packed sequences: x is [1, N, D], sequence b = tokens o_b..o_{b+1}-1
    positions    "none" (default) or "rope" (rotate-half, pairs (i, i + d/2), frequency base^(-2i/d),
                 position counted from 0 at each sequence's first token)
    rope_base    "10000" by default
    rope_order   "dynamics-then-rotate" (default) or "rotate-then-dynamics"
The mask is applied as torch's scaled_dot_product_attention applies a boolean attn_mask (its
documented math: scores masked to -inf before the softmax); padding rows of the output are zero.
"""

import math

import torch
import torch.nn.functional as F

# variant name -> (scoring, integrator); integrator None means identity dynamics.
VARIANTS = {
    "standard": ("softmax", None),
    "leapfrog": ("softmax", "leapfrog"),
    "euler": ("softmax", "euler"),
    "uncoupled": ("softmax", "uncoupled"),
    "diff": ("diff", None),
    "diff-leapfrog": ("diff", "leapfrog"),
    "diff-euler": ("diff", "euler"),
    "diff-uncoupled": ("diff", "uncoupled"),
    "affine": ("softmax", "affine"),
    "diff-affine": ("diff", "affine"),
    # the velocity family (spec 3c): k is the velocity of q (unit mass)
    "drift": ("softmax", "drift"),
    "newton-euler": ("softmax", "newton-euler"),
    "newton-leapfrog": ("softmax", "newton-leapfrog"),
    "unit-leapfrog": ("softmax", "unit-leapfrog"),
    "diff-drift": ("diff", "drift"),
    "diff-newton-euler": ("diff", "newton-euler"),
    "diff-newton-leapfrog": ("diff", "newton-leapfrog"),
    "diff-unit-leapfrog": ("diff", "unit-leapfrog"),
}

NEWTON = ("newton-euler", "newton-leapfrog")  # the integrators with the learned force F

AFFINE_CONDITIONERS = ("k", "q")  # dyn.k.* moves the key (reads q), dyn.q.* the query (reads k)

RMS_EPS = 1e-5  # epsilon inside the differential heads' RMS normalisation


def parse_variant(name):
    """Return (scoring, integrator) for a variant name; raise ValueError if unknown."""
    if name not in VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; expected one of {list(VARIANTS)}")
    return VARIANTS[name]


def lambda_init(layer_index):
    """Differential attention's depth-dependent lambda offset."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


def parameter_shapes(variant, D, H, m):
    """Ordered dict name -> shape of every parameter tensor of a variant (x, dy excluded)."""
    scoring, integrator = parse_variant(variant)
    d = D // H
    shapes = {"wq": (D, D), "wk": (D, D), "wv": (D, D), "wo": (D, D)}
    if integrator in ("leapfrog", "euler"):
        shapes.update({"dyn.W": (m, d), "dyn.U": (m, d),
                       "dyn.b": (m,), "dyn.a": (m,), "dyn.e": (m,), "dyn.c": (m,),
                       "dyn.rho": (H,)})
    elif integrator == "uncoupled":
        half = m // 2
        shapes.update({"dyn.Pq1": (half, d), "dyn.Pk1": (half, d),
                       "dyn.pq": (half,), "dyn.pk": (half,),
                       "dyn.Pq2": (d, half), "dyn.Pk2": (d, half),
                       "dyn.rho": (H,)})
    elif integrator == "affine":
        for c in AFFINE_CONDITIONERS:
            shapes.update({f"dyn.{c}.A": (m, d), f"dyn.{c}.a": (m,),
                           f"dyn.{c}.S": (d, m), f"dyn.{c}.s": (d,),
                           f"dyn.{c}.T": (d, m), f"dyn.{c}.t": (d,)})
        shapes["dyn.rho"] = (H,)
    elif integrator in NEWTON:
        shapes.update({"dyn.F1": (m, d), "dyn.f1": (m,), "dyn.F2": (d, m), "dyn.f2": (d,),
                       "dyn.rho": (H,)})
    elif integrator == "unit-leapfrog":
        shapes.update({"dyn.W": (m, d), "dyn.b": (m,), "dyn.a": (m,), "dyn.rho": (H,)})
    elif integrator == "drift":
        shapes["dyn.rho"] = (H,)
    if scoring == "diff":
        shapes.update({"lq1": (d,), "lk1": (d,), "lq2": (d,), "lk2": (d,), "subln": (2 * d,)})
    return shapes


def input_shapes(variant, B, T, D, H, m):
    """Ordered dict name -> shape of every tensor in a case file (x, dy and parameters)."""
    shapes = {"x": (B, T, D), "dy": (B, T, D)}
    shapes.update(parameter_shapes(variant, D, H, m))
    return shapes


def config_from(tensors, meta):
    """Validate metadata against tensor shapes; return a dict of parsed settings."""
    variant = meta["attention"]
    scoring, integrator = parse_variant(variant)
    steps, H, m, layer = (int(meta[k]) for k in ("steps", "heads", "m", "layer_index"))
    B, T, D = tensors["x"].shape
    if H < 1 or D % H:
        raise ValueError(f"D={D} is not divisible by heads={H}")
    if scoring == "diff" and H % 2:
        raise ValueError(f"differential attention needs an even number of heads, got {H}")
    causal = meta.get("causal", "1")
    if causal not in ("0", "1"):
        raise ValueError(f"causal must be '0' or '1', got {causal!r}")
    window = int(meta.get("window", "0"))
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    lengths = [int(v) for v in meta["lengths"].split(",")] if "lengths" in meta else None
    offsets = [int(v) for v in meta["offsets"].split(",")] if "offsets" in meta else None
    if lengths is not None and (len(lengths) != B or not all(1 <= n <= T for n in lengths)):
        raise ValueError(f"lengths {lengths} must be B={B} values in 1..{T}")
    if offsets is not None and (B != 1 or offsets[0] != 0 or offsets[-1] != T
                                or any(b <= a for a, b in zip(offsets, offsets[1:]))):
        raise ValueError(f"offsets {offsets} must rise strictly from 0 to N={T} (x is [1, N, D])")
    positions = meta.get("positions", "none")
    if positions not in ("none", "rope"):
        raise ValueError(f"positions must be 'none' or 'rope', got {positions!r}")
    rope_order = meta.get("rope_order", "dynamics-then-rotate")
    if rope_order not in ("dynamics-then-rotate", "rotate-then-dynamics"):
        raise ValueError(f"unknown rope_order {rope_order!r}")
    if integrator is not None and steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if integrator == "uncoupled" and m % 2:
        raise ValueError(f"uncoupled dynamics need an even m, got {m}")
    for name, shape in parameter_shapes(variant, D, H, m).items():
        if name not in tensors:
            raise ValueError(f"variant {variant!r} needs tensor {name!r}")
        if tuple(tensors[name].shape) != tuple(shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(tensors[name].shape)}, "
                             f"expected {tuple(shape)}")
    return dict(variant=variant, scoring=scoring, integrator=integrator, steps=steps,
                B=B, T=T, D=D, H=H, d=D // H, m=m, layer_index=layer, causal=causal == "1",
                window=window, lengths=lengths, offsets=offsets, positions=positions,
                rope_base=float(meta.get("rope_base", "10000")), rope_order=rope_order)


# ----------------------------------------------------------------------------
# Dynamics
# ----------------------------------------------------------------------------

def grad_V(q, dyn):
    """gradV(q) = W^T (a * tanh(W q + b)) for every vector q[..., :] (shape [..., d])."""
    # q @ W^T computes W q for each vector: [..., d] x [d, m] -> [..., m].
    return (dyn["a"] * torch.tanh(q @ dyn["W"].T + dyn["b"])) @ dyn["W"]


def grad_T(k, dyn):
    """gradT(k) = U^T (c * tanh(U k + e)) for every vector k[..., :] (shape [..., d])."""
    return (dyn["c"] * torch.tanh(k @ dyn["U"].T + dyn["e"])) @ dyn["U"]


def force(q, dyn):
    """F(q) = F2 silu(F1 q + f1) + f2 for every vector q[..., :] (spec 3c)."""
    return F.silu(q @ dyn["F1"].T + dyn["f1"]) @ dyn["F2"].T + dyn["f2"]


def affine_conditioner(c, dyn, which):
    """Log-scale s and shift t read from c [..., d] by conditioner `which` ("k" or "q").

    u = tanh(A c + a);  s = 2 tanh((S u + s0) / 2);  t = T u + t0.
    """
    p = lambda name: dyn[f"{which}.{name}"]
    u = torch.tanh(c @ p("A").T + p("a"))
    s = 2 * torch.tanh((u @ p("S").T + p("s")) / 2)
    t = u @ p("T").T + p("t")
    return s, t


def affine_step(q, k, dyn, h):
    """One step of the invertible affine coupling; h broadcasts like q."""
    s, t = affine_conditioner(q, dyn, "k")
    k = k * torch.exp(h * s) + h * t          # the key update reads q
    s, t = affine_conditioner(k, dyn, "q")
    q = q * torch.exp(h * s) + h * t          # the query update reads the updated k
    return q, k


def affine_inverse_step(q, k, dyn, h):
    """The closed-form inverse of affine_step: undo q (its conditioner reads k), then k."""
    s, t = affine_conditioner(k, dyn, "q")
    q = (q - h * t) * torch.exp(-h * s)
    s, t = affine_conditioner(q, dyn, "k")
    k = (k - h * t) * torch.exp(-h * s)
    return q, k


def step_sizes(rho, steps):
    """Per-head step size h = softplus(rho) / steps, shape [H]."""
    return F.softplus(rho) / steps


def integrate(q, k, dyn, integrator, steps, h):
    """Evolve (q, k) for `steps` steps.

    q, k: [B, T, H, d]; h: per-head step size [H] (may be negative, to run backwards).
    dyn:  dict of dynamics tensors with the "dyn." prefix stripped.
    """
    if integrator is None:
        return q, k
    h = h.reshape(-1, 1)  # [H, 1] broadcasts over [B, T, H, d]
    for _ in range(steps):
        if integrator == "leapfrog":
            # kick - drift - kick
            k = k - (h / 2) * grad_V(q, dyn)
            q = q + h * grad_T(k, dyn)
            k = k - (h / 2) * grad_V(q, dyn)
        elif integrator == "euler":
            # simultaneous update: both right-hand sides use the old (q, k)
            q, k = q + h * grad_T(k, dyn), k - h * grad_V(q, dyn)
        elif integrator == "uncoupled":
            # q and k each follow their own one-hidden-layer flow, no coupling
            q = q + h * (torch.tanh(q @ dyn["Pq1"].T + dyn["pq"]) @ dyn["Pq2"].T)
            k = k + h * (torch.tanh(k @ dyn["Pk1"].T + dyn["pk"]) @ dyn["Pk2"].T)
        elif integrator == "affine":
            q, k = affine_step(q, k, dyn, h)
        elif integrator == "drift":
            # q moves with velocity k; no force
            q = q + h * k
        elif integrator == "newton-euler":
            # simultaneous: both right-hand sides use the old (q, k)
            q, k = q + h * k, k + h * force(q, dyn)
        elif integrator == "newton-leapfrog":
            k = k + (h / 2) * force(q, dyn)
            q = q + h * k
            k = k + (h / 2) * force(q, dyn)
        elif integrator == "unit-leapfrog":
            # H = V(q) + |k|^2 / 2: grad T(k) = k
            k = k - (h / 2) * grad_V(q, dyn)
            q = q + h * k
            k = k - (h / 2) * grad_V(q, dyn)
        else:
            raise ValueError(f"unknown integrator {integrator!r}")
    return q, k


def dynamics_tensors(tensors):
    """The "dyn.*" tensors of a case, keyed without the prefix."""
    return {name[4:]: value for name, value in tensors.items() if name.startswith("dyn.")}


# ----------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------

def layout(cfg):
    """The mask and positions of a case, from its settings.

    Returns (allowed [B, T, T] bool: query i may read key j; valid [B, T] bool: row is a token,
    not padding; positions [B, T] long: each token's position in its own sequence).
    """
    B, T = cfg["B"], cfg["T"]
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    seq = torch.zeros(B, T, dtype=torch.long)    # which sequence a row belongs to
    pos = torch.arange(T).repeat(B, 1)           # position within it
    valid = torch.ones(B, T, dtype=torch.bool)
    if cfg["lengths"] is not None:
        for b, n in enumerate(cfg["lengths"]):
            valid[b, n:] = False
    if cfg["offsets"] is not None:
        for b in range(len(cfg["offsets"]) - 1):
            lo, hi = cfg["offsets"][b], cfg["offsets"][b + 1]
            seq[0, lo:hi] = b
            pos[0, lo:hi] = torch.arange(hi - lo)
    allowed = (seq.unsqueeze(2) == seq.unsqueeze(1)) & valid.unsqueeze(1)  # same sequence, a real key
    pi, pj = pos.unsqueeze(2), pos.unsqueeze(1)
    if cfg["causal"]:
        allowed &= pj <= pi
    w = cfg["window"]
    if w > 0:
        allowed &= (pi - pj < w) if cfg["causal"] else ((pi - pj).abs() < w)
    # a padding row reads its own key only (finite everywhere); its output is zeroed afterwards
    eye = (i == j).unsqueeze(0)
    allowed = torch.where(valid.unsqueeze(2), allowed, eye)
    return allowed, valid, pos


def masked_softmax(q, k, allowed):
    """Attention probabilities under a boolean mask.

    q, k: [B, heads, T, d]; allowed [B, T, T] -> P [B, heads, T, T], zero where not allowed.
    """
    d = q.shape[-1]
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    return torch.softmax(scores.masked_fill(~allowed.unsqueeze(1), float("-inf")), dim=-1)


def softmax_attention(Q, K, V, allowed):
    """Standard attention per head under `allowed` [B, T, T]. Q, K, V: [B, T, H, d] -> O [B, T, H*d].

    With torch >= 2.0 this is F.scaled_dot_product_attention(q, k, v, attn_mask=allowed); the
    Debian torch (1.13) has no such function, so its documented math is written out.
    """
    B, T, H, d = Q.shape
    heads_first = lambda X: X.transpose(1, 2)  # [B, T, H, d] -> [B, H, T, d]
    if hasattr(F, "scaled_dot_product_attention"):
        O = F.scaled_dot_product_attention(heads_first(Q), heads_first(K), heads_first(V),
                                           attn_mask=allowed.unsqueeze(1))
    else:
        P = masked_softmax(heads_first(Q), heads_first(K), allowed)  # [B, H, T, T]
        O = P @ heads_first(V)  # [B, H, T, d]
    return O.transpose(1, 2).reshape(B, T, H * d)


def rope(X, positions, base):
    """Rotary positions, rotate-half convention: X [B, T, H, d], positions [B, T].

    y = x cos(p w) + rotate_half(x) sin(p w), rotate_half(x) = (-x[d/2:], x[:d/2]), w_i = base^(-2i/d).
    """
    d = X.shape[-1]
    half = d // 2
    w = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / d)
    angle = positions.to(torch.float64).unsqueeze(-1) * w  # [B, T, d/2]
    cos = torch.cat([torch.cos(angle)] * 2, dim=-1).unsqueeze(2).to(X.dtype)  # [B, T, 1, d]
    sin = torch.cat([torch.sin(angle)] * 2, dim=-1).unsqueeze(2).to(X.dtype)
    rotate_half = torch.cat([-X[..., half:], X[..., :half]], dim=-1)
    return X * cos + rotate_half * sin


def differential_attention(Q, K, V, tensors, layer_index, allowed):
    """Differential attention under `allowed` [B, T, T]. Q, K, V: [B, T, H, d], H even -> O [B, T, H*d].

    Differential head g pairs sub-heads 2g (Q1, K1) and 2g+1 (Q2, K2) and reads the
    value channels [g*2d, (g+1)*2d).
    """
    B, T, H, d = Q.shape
    G = H // 2
    # [B, T, H, d] -> [B, T, G, 2, d]: index 0 / 1 of dim 3 is sub-head 2g / 2g+1.
    Qp, Kp = Q.reshape(B, T, G, 2, d), K.reshape(B, T, G, 2, d)
    Q1, Q2 = Qp[:, :, :, 0].transpose(1, 2), Qp[:, :, :, 1].transpose(1, 2)  # [B, G, T, d]
    K1, K2 = Kp[:, :, :, 0].transpose(1, 2), Kp[:, :, :, 1].transpose(1, 2)
    Vg = V.reshape(B, T, G, 2 * d).transpose(1, 2)  # [B, G, T, 2d]

    lam_init = lambda_init(layer_index)
    lam = (torch.exp(torch.sum(tensors["lq1"] * tensors["lk1"]))
           - torch.exp(torch.sum(tensors["lq2"] * tensors["lk2"])) + lam_init)
    A = masked_softmax(Q1, K1, allowed) - lam * masked_softmax(Q2, K2, allowed)  # [B, G, T, T]
    Og = A @ Vg  # [B, G, T, 2d]
    # RMS-normalise each head's 2d channels per token, then scale.
    Ng = Og / torch.sqrt(torch.mean(Og ** 2, dim=-1, keepdim=True) + RMS_EPS)
    Ng = Ng * tensors["subln"] * (1 - lam_init)
    return Ng.transpose(1, 2).reshape(B, T, H * d)


# ----------------------------------------------------------------------------
# The layer
# ----------------------------------------------------------------------------

def forward(tensors, meta):
    """y [B, T, D] of the layer. tensors: dict name -> torch tensor; meta: string metadata."""
    cfg = config_from(tensors, meta)
    B, T, D, H, d = cfg["B"], cfg["T"], cfg["D"], cfg["H"], cfg["d"]
    x = tensors["x"]
    Q = (x @ tensors["wq"]).reshape(B, T, H, d)
    K = (x @ tensors["wk"]).reshape(B, T, H, d)
    V = (x @ tensors["wv"]).reshape(B, T, H, d)
    allowed, valid, pos = layout(cfg)
    rotary = cfg["positions"] == "rope"
    rotate_first = rotary and cfg["rope_order"] == "rotate-then-dynamics"
    if rotate_first:
        Q, K = rope(Q, pos, cfg["rope_base"]), rope(K, pos, cfg["rope_base"])

    if cfg["integrator"] is not None:
        h = step_sizes(tensors["dyn.rho"], cfg["steps"])
        Q, K = integrate(Q, K, dynamics_tensors(tensors), cfg["integrator"], cfg["steps"], h)

    if rotary and not rotate_first:
        Q, K = rope(Q, pos, cfg["rope_base"]), rope(K, pos, cfg["rope_base"])

    if cfg["scoring"] == "softmax":
        O = softmax_attention(Q, K, V, allowed)
    else:
        O = differential_attention(Q, K, V, tensors, cfg["layer_index"], allowed)
    O = O * valid.unsqueeze(-1).to(O.dtype)  # padding rows give zero
    return O @ tensors["wo"]


def forward_and_grads(arrays, meta, dtype=torch.float64):
    """Reference outputs for a case.

    arrays: dict name -> numpy array (must include "dy"); computed in `dtype`.
    Returns dict name -> numpy array: "y" and "grad.<name>" for every input except
    "dy", the gradients of the scalar loss sum(y * dy).
    """
    leaves = {name: torch.tensor(value, dtype=dtype, requires_grad=(name != "dy"))
              for name, value in arrays.items()}
    y = forward(leaves, meta)
    loss = torch.sum(y * leaves["dy"])
    names = [name for name in leaves if name != "dy"]
    grads = torch.autograd.grad(loss, [leaves[n] for n in names], allow_unused=True)
    result = {"y": y.detach().numpy()}
    for name, grad in zip(names, grads):
        # A tensor the loss does not depend on has zero gradient.
        grad = torch.zeros_like(leaves[name]) if grad is None else grad
        result["grad." + name] = grad.detach().numpy()
    return result
