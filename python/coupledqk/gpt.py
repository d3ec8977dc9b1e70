"""A GPT-2 style decoder on coupledqk's attention layers: the model of include/coupledqk/model/gpt.hpp.

    x      = wte[tokens] + wpe[positions]                          [B, T, D]
    block l (pre-LayerNorm):  x += attn_l(ln1_l(x));  x += proj_l(gelu_tanh(fc_l(ln2_l(x))))
    logits = ln_f(x) @ wte^T                                       tied output embedding

Parameter names are the C++ model's (wte, wpe, h.<l>.ln1.g, h.<l>.attn.wq, h.<l>.mlp.fc.w, ...,
ln_f.b), weights stored [in, out]; initialisation follows it too (GPT-2: N(0, init_std^2), the
residual projections wo and mlp.proj.w scaled by 1/sqrt(2L), LayerNorm gains 1, biases 0).
"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class _LayerNorm(nn.Module):
    def __init__(self, dim, dtype):
        super().__init__()
        self.g = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.b = nn.Parameter(torch.zeros(dim, dtype=dtype))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.g, self.b, 1e-5)


class _Linear(nn.Module):
    """y = x w + b, w stored [in, out]."""

    def __init__(self, n_in, n_out, std, dtype):
        super().__init__()
        self.w = nn.Parameter(torch.randn(n_in, n_out, dtype=dtype) * std)
        self.b = nn.Parameter(torch.zeros(n_out, dtype=dtype))

    def forward(self, x):
        return torch.addmm(self.b, x.reshape(-1, x.shape[-1]), self.w).reshape(*x.shape[:-1], -1)


class _Block(nn.Module):
    def __init__(self, dim, heads, layer, layers, std, dtype, **attention):
        super().__init__()
        from . import CoupledAttention
        self.ln1 = _LayerNorm(dim, dtype)
        self.attn = CoupledAttention(dim, heads, layer_index=layer, init_std=std, dtype=dtype, **attention)
        with torch.no_grad():
            self.attn.wo.mul_(1 / math.sqrt(2 * layers))
        self.ln2 = _LayerNorm(dim, dtype)
        self.mlp = nn.Module()
        self.mlp.fc = _Linear(dim, 4 * dim, std, dtype)
        self.mlp.proj = _Linear(4 * dim, dim, std / math.sqrt(2 * layers), dtype)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp.proj(F.gelu(self.mlp.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT(vocab, dim, layers, heads, context, attention="leapfrog", steps=1, **kw): tokens [B, T]
    (int64, T <= context) -> logits [B, T, vocab]; forward(tokens, targets) also returns the mean
    cross-entropy. Other keywords go to every CoupledAttention (hidden, dynamics_init_scale,
    init_time, memory); init_std and dtype apply to the whole model."""

    def __init__(self, vocab, dim, layers, heads, context, attention="leapfrog", steps=1, *, init_std=0.02,
                 dtype=torch.float32, **attention_kw):
        super().__init__()
        from . import _C, _allocate, _check_float, _check_int, _check_settings
        vocab, dim, layers = _check_int("vocab", vocab), _check_int("dim", dim), _check_int("layers", layers)
        heads, context = _check_int("heads", heads), _check_int("context", context)
        steps = _check_settings(attention, steps, attention_kw.get("memory", "store"))
        # The library's rules (validate(GptConfig), each layer's), in its words, before anything is built.
        _C.check_gpt(vocab, dim, layers, heads, context, _check_int("hidden", attention_kw.get("hidden", 0)), attention,
                     steps, _check_float("init_std", init_std),
                     _check_float("dynamics_init_scale", attention_kw.get("dynamics_init_scale", 0.0)),
                     _check_float("init_time", attention_kw.get("init_time", 1.0)), attention_kw.get("memory", "store"))
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}")
        self.vocab, self.context = vocab, context
        size = torch.empty((), dtype=dtype).element_size()
        # wte, wpe, and per layer the attention's 4 dim^2 and the MLP's 8 dim^2 weights
        nbytes = size * ((vocab + context) * dim + layers * 12 * dim * dim)
        what = f"GPT(vocab={vocab}, dim={dim}, layers={layers}, context={context})"
        _allocate(what, nbytes, lambda: None)
        self.wte = nn.Parameter(_allocate(what, nbytes, lambda: torch.randn(vocab, dim, dtype=dtype) * init_std))
        self.wpe = nn.Parameter(_allocate(what, nbytes, lambda: torch.randn(context, dim, dtype=dtype) * init_std))
        self.h = nn.ModuleList(_Block(dim, heads, l, layers, init_std, dtype, attention=attention, steps=steps,
                                      **attention_kw) for l in range(layers))
        self.ln_f = _LayerNorm(dim, dtype)

    def load_state_dict(self, state_dict, strict=True):
        """nn.Module.load_state_dict; a missing (strict) or misshapen attention tensor raises
        KeyError / ValueError naming it."""
        from . import _load_state_dict
        return _load_state_dict(self, state_dict, strict)

    def forward(self, tokens, targets=None):
        if not isinstance(tokens, torch.Tensor) or tokens.dtype != torch.int64:
            raise TypeError(f"tokens must be an int64 tensor [B, T]; got {getattr(tokens, 'dtype', type(tokens))}")
        if tokens.dim() != 2 or not 0 < tokens.shape[1] <= self.context:
            raise ValueError(f"tokens have shape {list(tokens.shape)}; expected [B, T] with 0 < T <= context = "
                             f"{self.context}")
        if tokens.shape[0] == 0:
            raise ValueError(f"tokens have shape {list(tokens.shape)}; expected [B, T] with B > 0")
        low, high = int(tokens.min()), int(tokens.max())
        if low < 0 or high >= self.vocab:
            raise ValueError(f"token ids must be in [0, vocab = {self.vocab}); got ids from {low} to {high}")
        if targets is not None:
            if not isinstance(targets, torch.Tensor) or targets.dtype != torch.int64 or targets.shape != tokens.shape:
                raise ValueError(f"targets must be an int64 tensor of the tokens' shape {list(tokens.shape)}; got "
                                 f"{getattr(targets, 'dtype', type(targets))} {list(getattr(targets, 'shape', []))}")
            valid = targets[targets != -100]  # torch's ignore_index
            if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= self.vocab):
                raise ValueError(f"target ids must be in [0, vocab = {self.vocab}) (or -100: ignored); got ids from "
                                 f"{int(valid.min())} to {int(valid.max())}")
        x = self.wte[tokens] + self.wpe[: tokens.shape[1]]
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.T
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
