"""coupledqk for PyTorch: attention with coupled query-key dynamics, on the library's own kernels.

    import coupledqk
    attn = coupledqk.CoupledAttention(dim=256, heads=4, attention="leapfrog", steps=2)
    y = attn(x)                                   # x: [B, T, 256] -> y: [B, T, 256], causal

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


def _check_layer(attention, steps, dim, heads, hidden, layer_index, init_std=0.02, dynamics_init_scale=0.0,
                 init_time=1.0, memory="store"):
    """ValueError, in the library's words (Attention::check_config, the table's name and step
    rules), unless the library's layer takes these settings; nothing is built."""
    steps = _check_settings(attention, steps, memory)
    ints = (_check_int("dim", dim), _check_int("heads", heads), _check_int("hidden", hidden),
            _check_int("layer_index", layer_index, bits=32))
    floats = (_check_float("init_std", init_std), _check_float("dynamics_init_scale", dynamics_init_scale),
              _check_float("init_time", init_time))
    _C.check_attention(attention, steps, *ints, *floats, memory)
    return (steps, *ints, *floats)


def _check_input(x):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor [B, T, dim]; got {type(x).__name__}")
    return x


@functools.lru_cache(maxsize=64)
def _cached_layer(attention, steps, dim, heads, hidden, layer_index, memory):
    # The functional form's layers: initialisation settings do not matter (the caller's parameters run).
    return _C.Layer(attention, steps, dim, heads, hidden, layer_index, 0.02, 0.0, 1.0, memory, False)


def parameter_shapes(dim, heads, attention="leapfrog", steps=1, hidden=0):
    """{name: shape} of every parameter of a layer, in the library's order."""
    steps, dim, heads, hidden = _check_layer(attention, steps, dim, heads, hidden, 0)[:4]
    layer = _cached_layer(attention, steps, dim, heads, hidden, 0, "store")
    return {name: tuple(shape) for name, shape in layer.specs()}


class _AttentionFunction(torch.autograd.Function):
    """y = layer(x; params) by the library's forward; the library's analytic backward."""

    @staticmethod
    def forward(ctx, layer, x, *params):
        keep = any(ctx.needs_input_grad[1:])  # keep nothing for a pass nobody differentiates
        y, saved = layer.forward(x, list(params), keep)
        ctx.saved_pass = saved
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        dx, grads = ctx.saved_pass.backward(dy)
        return (None, dx, *grads)


def attention(x, params, attention="leapfrog", steps=1, heads=None, layer_index=0, hidden=0, memory="store"):
    """The attention layer as a function of its input and a mapping of its parameters.

    x: [B, T, dim] float32 or float64; params: {name: tensor} with exactly the library's names and
    shapes (parameter_shapes(dim, heads, attention, steps, hidden)), same dtype as x. Returns y
    [B, T, dim]; differentiable in x and every parameter.
    """
    _check_input(x)
    if heads is None:
        raise TypeError("attention() needs heads= (the number of query/key pairs per token)")
    if x.dim() != 3:
        raise ValueError(f"x has shape {list(x.shape)} (rank {x.dim()}); expected [B, T, dim]")
    steps, dim, heads, hidden, layer_index = _check_layer(attention, steps, int(x.shape[-1]), heads, hidden,
                                                          layer_index, memory=memory)[:5]
    layer = _cached_layer(attention, steps, dim, heads, hidden, layer_index, memory)
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
    return _AttentionFunction.apply(layer, x, *tensors)


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
    """Causal multi-head self-attention with coupled query-key dynamics: [B, T, dim] -> [B, T, dim].

    attention: a variant name (coupledqk.variants()); steps: integration sub-steps 1..max_steps
    (ignored by variants without dynamics). The keyword arguments are the library's
    AttentionConfig fields: hidden (dynamics width m; 0 = dim/heads), layer_index (Differential's
    lambda_init), init_std, dynamics_init_scale, init_time (tau at init), memory ("store" or
    "recompute", reversible integrators only); dtype is torch.float32 or torch.float64. The
    parameters start as the library's own initialisation drawn with `seed` (default: a seed taken
    from torch's global generator, so torch.manual_seed makes them reproducible).

    state_dict keys are the library's tensor names (wq, wk, wv, wo, dyn.W, ..., dyn.rho, lq1, ...,
    subln), each with the library's shape and row-major layout.
    """

    def __init__(self, dim, heads, attention="leapfrog", steps=1, *, hidden=0, layer_index=0, init_std=0.02,
                 dynamics_init_scale=0.0, init_time=1.0, memory="store", dtype=torch.float32, seed=None):
        super().__init__()
        steps, dim, heads, hidden, layer_index, *init = _check_layer(
            attention, steps, dim, heads, hidden, layer_index, init_std, dynamics_init_scale, init_time, memory)
        if dtype not in _DTYPES:
            raise TypeError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}")
        if seed is None:
            seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
        seed = _check_int("seed", seed, 0)
        self.dim, self.heads, self.attention, self.steps = dim, heads, attention, steps
        self.hidden, self.layer_index, self.memory = hidden, layer_index, memory
        # wq, wk, wv, wo: 4 dim^2 values, and a dynamics width's dim * hidden, built in float64 first
        what = f"CoupledAttention(dim={dim}, heads={heads}, hidden={hidden})"
        nbytes = 8 * (4 * dim * dim + dim * hidden)
        self._layer = _allocate(what, nbytes, lambda: _C.Layer(attention, steps, dim, heads, hidden, layer_index,
                                                              *init, memory, False))
        self._specs = [(name, tuple(shape)) for name, shape in self._layer.specs()]
        values = _allocate(what, nbytes, lambda: self._layer.initial_parameters(seed, dtype))
        for (name, _), value in zip(self._specs, values):
            *path, leaf = name.split(".")
            _container(self, path).register_parameter(leaf, nn.Parameter(value))

    def parameter_names(self):
        """The library's tensor names, in its order."""
        return [name for name, _ in self._specs]

    def forward(self, x):
        _check_input(x)
        return _AttentionFunction.apply(self._layer, x, *[self.get_parameter(n) for n, _ in self._specs])

    def extra_repr(self):
        return (f"dim={self.dim}, heads={self.heads}, attention={self.attention!r}, steps={self.steps}, "
                f"hidden={self.hidden}, layer_index={self.layer_index}, memory={self.memory!r}")

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
        """The string metadata the layer tool (coupledqk-layer) reads: attention, steps, heads, m, layer_index."""
        return {"attention": self.attention, "steps": str(self.steps), "heads": str(self.heads),
                "m": str(self.hidden), "layer_index": str(self.layer_index)}

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

        dim = int(tensors["wq"].shape[0])
        dtype = dtype or tensors["wq"].dtype
        layer = cls(dim, integer("heads"), meta["attention"], integer("steps"), hidden=integer("m", "0"),
                    layer_index=integer("layer_index", "0"), memory=memory, dtype=dtype, seed=0)
        layer.load_state_dict({n: tensors[n] for n in layer.parameter_names() if n in tensors})
        return layer


from .gpt import GPT  # noqa: E402  (uses CoupledAttention)
