"""coupledqk for PyTorch: attention with coupled query-key dynamics, on the library's own kernels.

    import coupledqk
    attn = coupledqk.CoupledAttention(dim=256, heads=4, attention="leapfrog", steps=2)
    y = attn(x)                                   # x: [B, T, 256] -> y: [B, T, 256], causal
    y = attn(x, lengths=torch.tensor([7, 3]))     # right-padded sequences: padding rows give 0
    y = attn.forward_packed(xp, offsets)          # xp: [N, 256] packed, offsets (0, ..., N)
    enc = coupledqk.CoupledAttention(256, 4, causal=False, window=0, positions="rope")   # an encoder

    y = coupledqk.attention(x, params, attention="leapfrog", steps=2, heads=4)   # own parameters

Forward and backward are the C++ library's fused CPU kernels (the layer's analytic backward, the
reversible memory="recompute" mode), reached through one torch.autograd.Function; they use
torch.get_num_threads() threads. Every variant of the library's table (coupledqk.variants()) is
accepted by its run-time name; parameter names, shapes and layouts are the library's (wq, wk, wv, wo
[D, D] stored [in, out] so that q = x @ wq; dyn.*; lq1, lk1, lq2, lk2, subln), so a layer's
safetensors file and a module's state_dict load into each other unchanged.

This build of the extension runs on the CPU only: a CUDA tensor gets a ValueError.
"""
import functools
import numbers

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from . import _C
from .safetensors import load_file, save_file

__version__ = _C.version
#: Largest step count compiled into the library (steps must lie in 1..max_steps).
max_steps = _C.max_steps

_VARIANTS = {v["name"]: v for v in _C.variants()}
_DTYPES = (torch.float32, torch.float64)
_MEMORY = ("store", "recompute")
_POSITIONS = ("none", "rope")
_ROPE_ORDERS = ("dynamics-then-rotate", "rotate-then-dynamics")
#: The mask and position keywords and their defaults (the library's AttentionConfig defaults).
_MASK_DEFAULTS = dict(causal=True, window=0, positions="none", rope_base=10000.0, rope_order="dynamics-then-rotate")

__all__ = ["CoupledAttention", "attention", "variants", "variant_info", "parameter_shapes", "load_file",
           "save_file", "GPT", "max_steps"]


def variants():
    """Every attention variant the library registers, by run-time name, in the library's order."""
    return list(_VARIANTS)


def variant_info(name):
    """What the library says about a variant: its integrator and scoring, whether it has dynamics
    (dyn.* parameters; steps count) and whether its integrator is reversible (memory="recompute")."""
    return dict(_VARIANTS[_check_variant(name)])


def _check_variant(name):
    if not isinstance(name, str):
        raise TypeError(f"attention must be a variant name (str); got {type(name).__name__} {name!r}; "
                        f"accepted: {', '.join(_VARIANTS)}")
    if name not in _VARIANTS:
        raise ValueError(f"unknown attention variant {name!r}; accepted: {', '.join(_VARIANTS)}")
    return name


def _check_int(name, value, low=None, bits=64):
    """value as an int: TypeError unless it is one; ValueError when it does not fit the library's
    `bits`-bit signed field (or is below `low`, for the settings the library does not see, such as a
    seed). The rules on what a setting may be (dim, heads, steps, ...) are the library's own
    (_C.check_attention, _C.check_gpt), so that Python says what C++ and the tools say."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
    if low is not None and value < low:
        raise ValueError(f"{name} must be >= {low}; got {value}")
    if not -2**(bits - 1) <= value < 2**(bits - 1):
        raise ValueError(f"{name} is {value}; it must fit a {bits}-bit signed integer")
    return int(value)


def _check_float(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float; got {type(value).__name__} {value!r}")
    return float(value)


#: Sizes whose parameters would need more bytes than this are refused before anything is allocated
#: (no machine has 256 TiB; the library's Index arithmetic stays far from overflow).
_MAX_BYTES = 2**48


def _allocate(what, nbytes, make):
    """make(), or ValueError naming the setting and the bytes it needs when that cannot be allocated
    (instead of a bare MemoryError: std::bad_alloc or torch's allocator error)."""
    message = (f"{what}: the parameters need at least {nbytes} bytes ({nbytes / 2**30:.3g} GiB), "
               f"which cannot be allocated; choose smaller sizes")
    if nbytes > _MAX_BYTES:
        raise ValueError(message)
    try:
        return make()
    except MemoryError:
        raise ValueError(message) from None
    except RuntimeError as e:
        if "alloc" in str(e).lower() or "memory" in str(e).lower():
            raise ValueError(message) from None
        raise


def _check_settings(attention, steps, memory):
    """The types of the settings every layer shares; their values are the library's to judge."""
    _check_variant(attention)
    if not isinstance(memory, str):
        raise TypeError(f"memory must be 'store' or 'recompute' (a str); got {type(memory).__name__} {memory!r}")
    return _check_int("steps", steps, bits=32)


def _check_word(name, value, accepted):
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {', '.join(map(repr, accepted))} (a str); got "
                        f"{type(value).__name__} {value!r}")
    if value not in accepted:
        raise ValueError(f"{name} is {value!r}; accepted: {', '.join(map(repr, accepted))}")
    return value


def _check_mask(causal=True, window=0, positions="none", rope_base=10000.0, rope_order="dynamics-then-rotate"):
    """The mask and position keywords, typed (their values are the library's to judge), as a tuple."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__} {causal!r}")
    return (causal, _check_int("window", window), _check_word("positions", positions, _POSITIONS),
            _check_float("rope_base", rope_base), _check_word("rope_order", rope_order, _ROPE_ORDERS))


def _check_layer(attention, steps, dim, heads, hidden, layer_index, init_std=0.02, dynamics_init_scale=0.0,
                 init_time=1.0, memory="store", mask=None):
    """ValueError, in the library's words (Attention::check_config, the table's name and step
    rules), unless the library's layer takes these settings; nothing is built. mask: the tuple of
    _check_mask (default: causal, no window, no positions)."""
    steps = _check_settings(attention, steps, memory)
    ints = (_check_int("dim", dim), _check_int("heads", heads), _check_int("hidden", hidden),
            _check_int("layer_index", layer_index, bits=32))
    floats = (_check_float("init_std", init_std), _check_float("dynamics_init_scale", dynamics_init_scale),
              _check_float("init_time", init_time))
    _C.check_attention(attention, steps, *ints, *floats, memory, *(mask or _check_mask()))
    return (steps, *ints, *floats)


def _check_input(x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [B, T, dim]; got {type(x).__name__}")
    return x


@functools.lru_cache(maxsize=64)
def _cached_layer(attention, steps, dim, heads, hidden, layer_index, memory, mask=None):
    # The functional form's layers: initialisation settings do not matter (the caller's parameters run).
    return _C.Layer(attention, steps, dim, heads, hidden, layer_index, 0.02, 0.0, 1.0, memory, False,
                    *(mask or _check_mask()))


def _sequences(x, lengths, offsets, dim="dim"):
    """The lengths / offsets keywords, checked against x's shape: (lengths, offsets) for _C.
    dim: the layer's width where known (it names the accepted shape in the message)."""
    if lengths is not None and offsets is not None:
        raise ValueError("give lengths (right-padded sequences) or offsets (packed ones), not both")
    for name, t in (("lengths", lengths), ("offsets", offsets)):
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a 1-D integer torch.Tensor; got {type(t).__name__}")
    if offsets is not None and x.dim() != 2:
        raise ValueError(f"packed x has shape {list(x.shape)} (rank {x.dim()}); expected [N, {dim}]")
    if offsets is None and x.dim() != 3:
        raise ValueError(f"x has shape {list(x.shape)} (rank {x.dim()}); expected [B, T, {dim}]")
    return lengths, offsets


def parameter_shapes(dim, heads, attention="leapfrog", steps=1, hidden=0):
    """{name: shape} of every parameter of a layer, in the library's order."""
    steps, dim, heads, hidden = _check_layer(attention, steps, dim, heads, hidden, 0)[:4]
    layer = _cached_layer(attention, steps, dim, heads, hidden, 0, "store")
    return {name: tuple(shape) for name, shape in layer.specs()}


class _AttentionFunction(torch.autograd.Function):
    """y = layer(x; params) by the library's forward; the library's analytic backward."""

    @staticmethod
    def forward(ctx, layer, lengths, offsets, x, *params):
        keep = any(ctx.needs_input_grad[3:])  # keep nothing for a pass nobody differentiates
        y, saved = layer.forward(x, list(params), keep, lengths, offsets)
        ctx.saved_pass = saved
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        dx, grads = ctx.saved_pass.backward(dy)
        return (None, None, None, dx, *grads)


def attention(x, params, attention="leapfrog", steps=1, heads=None, layer_index=0, hidden=0, memory="store", *,
              causal=True, window=0, positions="none", rope_base=10000.0, rope_order="dynamics-then-rotate",
              lengths=None, offsets=None):
    """The attention layer as a function of its input and a mapping of its parameters.

    x: [B, T, dim] float32 or float64 (or [N, dim] packed, with offsets); params: {name: tensor}
    with exactly the library's names and shapes (parameter_shapes(dim, heads, attention, steps,
    hidden)), same dtype as x. The mask and positions keywords are CoupledAttention's; lengths /
    offsets as in CoupledAttention.forward / forward_packed. Returns y, shaped like x;
    differentiable in x and every parameter.
    """
    _check_input(x)
    if heads is None:
        raise TypeError("attention() needs heads= (the number of query/key pairs per token)")
    lengths, offsets = _sequences(x, lengths, offsets)
    mask = _check_mask(causal, window, positions, rope_base, rope_order)
    steps, dim, heads, hidden, layer_index = _check_layer(attention, steps, int(x.shape[-1]), heads, hidden,
                                                          layer_index, memory=memory, mask=mask)[:5]
    layer = _cached_layer(attention, steps, dim, heads, hidden, layer_index, memory, mask)
    names = [name for name, _ in layer.specs()]
    if not hasattr(params, "keys"):
        raise TypeError(f"params must be a mapping name -> tensor; got {type(params).__name__}")
    missing = [n for n in names if n not in params]
    if missing:
        raise KeyError(f"params has no tensor {', '.join(map(repr, missing))}; attention {attention!r} "
                       f"takes exactly: {', '.join(names)}")
    unexpected = [n for n in params.keys() if n not in names]
    if unexpected:
        raise KeyError(f"params has unexpected tensor {', '.join(map(repr, unexpected))}; attention "
                       f"{attention!r} takes exactly: {', '.join(names)}")
    tensors = [params[n] for n in names]
    for n, t in zip(names, tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"params[{n!r}] must be a torch.Tensor; got {type(t).__name__}")
    return _AttentionFunction.apply(layer, lengths, offsets, x, *tensors)


def _container(module, path):
    """The sub-module at a dotted path below `module`, made (plain nn.Module) where missing."""
    for part in path:
        if not hasattr(module, part):
            module.add_module(part, nn.Module())
        module = getattr(module, part)
    return module


def _check_layer_state(layer, state_dict, prefix, strict):
    names = ", ".join(n for n, _ in layer._specs)
    for name, shape in layer._specs:
        key = prefix + name
        if key not in state_dict:
            if strict:
                raise KeyError(f"state_dict has no tensor {key!r}; attention {layer.attention!r} needs {names}"
                               + (f" (under the prefix {prefix!r})" if prefix else ""))
            continue
        t = state_dict[key]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state_dict[{key!r}] must be a torch.Tensor; got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"state_dict[{key!r}] has dtype {t.dtype}; expected a floating-point tensor "
                            f"(torch.float32 or torch.float64)")
        if tuple(t.shape) != shape:
            raise ValueError(f"state_dict[{key!r}] has shape {list(t.shape)}; expected {list(shape)} for "
                             f"attention {layer.attention!r} with dim={layer.dim}, heads={layer.heads}, "
                             f"hidden={layer.hidden or layer.dim // layer.heads}")


def _load_state_dict(model, state_dict, strict):
    """model.load_state_dict after checking every CoupledAttention inside it (KeyError when strict
    and a tensor is missing; torch's RuntimeError still reports other modules' keys)."""
    for prefix, module in model.named_modules():
        if isinstance(module, CoupledAttention):
            _check_layer_state(module, state_dict, prefix + "." if prefix else "", strict)
    return nn.Module.load_state_dict(model, state_dict, strict)


class CoupledAttention(nn.Module):
    """Multi-head self-attention with coupled query-key dynamics: [B, T, dim] -> [B, T, dim].

    attention: a variant name (coupledqk.variants()); steps: integration sub-steps 1..max_steps
    (ignored by variants without dynamics). The keyword arguments are the library's
    AttentionConfig fields: hidden (dynamics width m; 0 = dim/heads), layer_index (Differential's
    lambda_init), init_std, dynamics_init_scale, init_time (tau at init), memory ("store" or
    "recompute", reversible integrators only), and the mask and positions: causal (False: an
    encoder), window (a sliding window of that many keys; 0: none), positions ("none" or "rope":
    rotary embeddings, pairs (i, i + d/2) at frequency rope_base^(-2i/d), each sequence's first
    token at position 0), rope_base, rope_order ("dynamics-then-rotate": the dynamics see
    position-free q, k; or "rotate-then-dynamics"); dtype is torch.float32 or torch.float64. The
    parameters start as the library's own initialisation drawn with `seed` (default: a seed taken
    from torch's global generator, so torch.manual_seed makes them reproducible).

    state_dict keys are the library's tensor names (wq, wk, wv, wo, dyn.W, ..., dyn.rho, lq1, ...,
    subln), each with the library's shape and row-major layout.
    """

    def __init__(self, dim, heads, attention="leapfrog", steps=1, *, hidden=0, layer_index=0, init_std=0.02,
                 dynamics_init_scale=0.0, init_time=1.0, memory="store", causal=True, window=0, positions="none",
                 rope_base=10000.0, rope_order="dynamics-then-rotate", dtype=torch.float32, seed=None):
        super().__init__()
        mask = _check_mask(causal, window, positions, rope_base, rope_order)
        steps, dim, heads, hidden, layer_index, *init = _check_layer(
            attention, steps, dim, heads, hidden, layer_index, init_std, dynamics_init_scale, init_time, memory, mask)
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}")
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        seed = _check_int("seed", seed, 0)
        self.dim, self.heads, self.attention, self.steps = dim, heads, attention, steps
        self.hidden, self.layer_index, self.memory = hidden, layer_index, memory
        self.causal, self.window, self.positions, self.rope_base, self.rope_order = mask
        # wq, wk, wv, wo: 4 dim^2 values, and a dynamics width's dim * hidden, built in float64 first
        what = f"CoupledAttention(dim={dim}, heads={heads}, hidden={hidden})"
        nbytes = 8 * (4 * dim * dim + dim * hidden)
        self._layer = _allocate(what, nbytes, lambda: _C.Layer(attention, steps, dim, heads, hidden, layer_index,
                                                              *init, memory, False, *mask))
        self._specs = [(name, tuple(shape)) for name, shape in self._layer.specs()]
        values = _allocate(what, nbytes, lambda: self._layer.initial_parameters(seed, dtype))
        for (name, _), value in zip(self._specs, values):
            *path, leaf = name.split(".")
            _container(self, path).register_parameter(leaf, nn.Parameter(value))

    def parameter_names(self):
        """The library's tensor names, in its order."""
        return [name for name, _ in self._specs]

    def forward(self, x, lengths=None):
        """y [B, T, dim] for x [B, T, dim]. lengths: None, or a [B] integer tensor of the valid
        lengths of right-padded sequences (1..T each); padding rows of y are zero and get zero
        gradient."""
        _check_input(x)
        lengths, _ = _sequences(x, lengths, None, self.dim)
        return _AttentionFunction.apply(self._layer, lengths, None, x,
                                        *[self.get_parameter(n) for n, _ in self._specs])

    def forward_packed(self, x, offsets):
        """y [N, dim] for sequences packed end to end in x [N, dim]; offsets: a [B+1] integer tensor
        (0, ..., N; flash-attention's cu_seqlens): sequence b is rows offsets[b]..offsets[b+1]-1."""
        _check_input(x)
        if offsets is None:
            raise TypeError("forward_packed needs offsets (a [B+1] integer tensor 0, ..., N)")
        _, offsets = _sequences(x, None, offsets, self.dim)
        return _AttentionFunction.apply(self._layer, None, offsets, x,
                                        *[self.get_parameter(n) for n, _ in self._specs])

    def extra_repr(self):
        mask = "".join(f", {k}={getattr(self, k)!r}" for k, v in _MASK_DEFAULTS.items() if getattr(self, k) != v)
        return (f"dim={self.dim}, heads={self.heads}, attention={self.attention!r}, steps={self.steps}, "
                f"hidden={self.hidden}, layer_index={self.layer_index}, memory={self.memory!r}{mask}")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Checked here, for this layer's every tensor (its dyn.* live in child modules), so that a
        # misshapen or non-float tensor raises ValueError / TypeError naming it, in any model.
        _check_layer_state(self, state_dict, prefix, strict=False)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def load_state_dict(self, state_dict, strict=True):
        """nn.Module.load_state_dict, with a KeyError naming a missing tensor (when strict) and a
        ValueError / TypeError naming a misshapen or non-float one."""
        return _load_state_dict(self, state_dict, strict)

    def metadata(self):
        """The string metadata the layer tool (coupledqk-layer) reads: attention, steps, heads, m,
        layer_index, and the mask and positions settings that differ from the defaults (causal,
        window, positions, rope_base, rope_order)."""
        meta = {"attention": self.attention, "steps": str(self.steps), "heads": str(self.heads),
                "m": str(self.hidden), "layer_index": str(self.layer_index)}
        for key, default in _MASK_DEFAULTS.items():
            value = getattr(self, key)
            if value != default:
                meta[key] = ("1" if value else "0") if key == "causal" else repr(value) if key == "rope_base" \
                    else str(value)
        return meta

    def save_safetensors(self, path):
        """Writes the parameters and metadata() as a safetensors file (the layer tool's format)."""
        save_file({n: p.detach() for n, p in self.state_dict().items()}, path, self.metadata())

    @classmethod
    def from_safetensors(cls, path, memory="store", dtype=None):
        """A layer built from a safetensors file of the layer tool's format: metadata attention,
        steps, heads, m (optional), layer_index; the parameters under their library names (other
        tensors, such as a case file's x and dy, are ignored). dtype: the file's unless given."""
        tensors, meta = load_file(path, with_metadata=True)
        for key in ("attention", "steps", "heads"):
            if key not in meta:
                raise KeyError(f"safetensors file {path!r} has no metadata {key!r}; expected attention, steps, "
                               f"heads (and optionally m, layer_index); present: {', '.join(meta) or 'none'}")
        if "wq" not in tensors:
            raise KeyError(f"safetensors file {path!r} has no tensor 'wq'; present: {', '.join(tensors)}")
        wq = tensors["wq"]
        if wq.dim() != 2 or wq.shape[0] != wq.shape[1] or not wq.is_floating_point():
            raise ValueError(f"safetensors file {path!r}: tensor 'wq' has shape {list(wq.shape)} and dtype {wq.dtype}; "
                             f"expected a floating-point matrix [dim, dim]")

        def integer(key, default=None):
            value = meta.get(key, default)
            if not isinstance(value, str) or not value.isascii() or not value.isdigit():
                shown = value if not isinstance(value, str) or len(value) <= 40 else value[:40] + "..."
                raise ValueError(f"safetensors file {path!r}: metadata {key!r} is {shown!r}; expected a "
                                 f"non-negative integer")
            return int(value)

        def word(key, accepted):
            value = meta.get(key, accepted[0])
            if value not in accepted:
                shown = value if len(value) <= 40 else value[:40] + "..."
                raise ValueError(f"safetensors file {path!r}: metadata {key!r} is {shown!r}; expected one of "
                                 f"{', '.join(map(repr, accepted))}")
            return value

        rope_base = meta.get("rope_base", "10000")
        try:
            rope_base = float(rope_base)
        except ValueError:
            raise ValueError(f"safetensors file {path!r}: metadata 'rope_base' is {rope_base[:40]!r}; expected a "
                             f"number") from None
        dim = int(tensors["wq"].shape[0])
        dtype = dtype or tensors["wq"].dtype
        layer = cls(dim, integer("heads"), meta["attention"], integer("steps"), hidden=integer("m", "0"),
                    layer_index=integer("layer_index", "0"), memory=memory, dtype=dtype, seed=0,
                    causal=word("causal", ("1", "0")) == "1", window=integer("window", "0"),
                    positions=word("positions", _POSITIONS), rope_base=rope_base,
                    rope_order=word("rope_order", _ROPE_ORDERS))
        layer.load_state_dict({n: tensors[n] for n in layer.parameter_names() if n in tensors})
        return layer


from .gpt import GPT  # noqa: E402  (uses CoupledAttention)
