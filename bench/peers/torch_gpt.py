#!/usr/bin/python3
"""One GPT training step in eager PyTorch, timed: the peer of coupledqk-bench's gpt/ cases.

The model is the one coupledqk trains (docs/model.md): GPT-2 pre-LayerNorm blocks, GELU (tanh form),
tied input/output embedding, learned positions, mean cross-entropy. The attention layer is
tests/parity/reference.py (the PyTorch implementation of the method spec that the parity test checks
coupledqk against): standard attention, or leapfrog coupled query-key dynamics (spec sections 1-3).
A step is what coupledqk's trainer does: zero the gradients, forward, backward, clip the global
gradient norm to 1.0, and one torch.optim.AdamW update (betas 0.9/0.95, eps 1e-8, weight decay 0.1
on matrices and embeddings only). float32 on the CPU, torch.set_num_threads(threads).

    torch_gpt.py --threads 2 --case leapfrog:1:4096:128:2:4:128:16 [--case ...] [--reps 3]
    torch_gpt.py --device cuda --dtype bf16 --attention-impl sdpa --case standard:1:8192:512:8:8:1024:16

On the GPU (--device cuda): --dtype bf16 runs the step under torch.autocast(bfloat16) with float32
master weights (as coupledqk's bf16 mode), and --attention-impl sdpa replaces the reference's
T x T softmax by torch.nn.functional.scaled_dot_product_attention (the dynamics stay the eager spec
code; Differential variants always use the reference).

A case is variant:steps:V:D:L:H:T:B (head size D/H, dynamics width m = D/H). Prints one JSON object
per case: the median milliseconds of a step over the repetitions, after warm-up steps.
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import sys
import time

# OpenBLAS on the kernels of this CPU (not its generic ones): before torch loads it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openblas  # noqa: E402

OPENBLAS_CORE, OPENBLAS_HOW = openblas.use_proper_kernels()

import torch  # noqa: E402
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "parity"))
import reference  # noqa: E402


class Gpt(torch.nn.Module):
    """GPT-2 style decoder whose attention layers are reference.forward."""

    def __init__(self, variant, steps, V, D, L, H, T, generator, init_std=0.02, dynamics_scale=0.1):
        super().__init__()
        self.variant, self.steps, self.D, self.L, self.H = variant, steps, D, L, H
        d = D // H

        def normal(*shape, std):
            return torch.nn.Parameter(std * torch.randn(*shape, generator=generator))

        def const(*shape, value):
            return torch.nn.Parameter(torch.full(shape, float(value)))

        residual_std = init_std / math.sqrt(2 * L)
        self.wte = normal(V, D, std=init_std)
        self.wpe = normal(T, D, std=init_std)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln1_g, b.ln1_b = const(D, value=1), const(D, value=0)
            b.ln2_g, b.ln2_b = const(D, value=1), const(D, value=0)
            b.attn = torch.nn.ParameterDict()
            for name, shape in reference.parameter_shapes(variant, D, H, d).items():
                key = name.replace(".", "_")
                if name == "wo":
                    b.attn[key] = normal(*shape, std=residual_std)
                elif name.startswith("w"):
                    b.attn[key] = normal(*shape, std=init_std)
                elif name in ("dyn.W", "dyn.U"):
                    b.attn[key] = normal(*shape, std=1 / math.sqrt(d))
                elif name in ("dyn.a", "dyn.c"):
                    b.attn[key] = normal(*shape, std=dynamics_scale)
                elif name == "dyn.rho":
                    b.attn[key] = const(*shape, value=math.log(math.expm1(1.0)))  # tau = 1
                else:
                    b.attn[key] = const(*shape, value=0)
            b.names = list(reference.parameter_shapes(variant, D, H, d))
            b.fc_w, b.fc_b = normal(D, 4 * D, std=init_std), const(4 * D, value=0)
            b.proj_w, b.proj_b = normal(4 * D, D, std=residual_std), const(D, value=0)
            self.blocks.append(b)
        self.lnf_g, self.lnf_b = const(D, value=1), const(D, value=0)
        self.meta = {"attention": variant, "steps": str(steps), "heads": str(H), "m": str(d)}

    attention = staticmethod(reference.forward)

    def loss(self, tokens, targets):
        B, T = tokens.shape
        D = self.D
        x = self.wte[tokens] + self.wpe[:T]
        for l, b in enumerate(self.blocks):
            tensors = {"x": F.layer_norm(x, (D,), b.ln1_g, b.ln1_b, 1e-5)}
            for name in b.names:
                tensors[name] = b.attn[name.replace(".", "_")]
            x = x + self.attention(tensors, dict(self.meta, layer_index=str(l)))
            m = F.layer_norm(x, (D,), b.ln2_g, b.ln2_b, 1e-5)
            m = F.gelu(m @ b.fc_w + b.fc_b, approximate="tanh")
            x = x + (m @ b.proj_w + b.proj_b)
        x = F.layer_norm(x, (D,), self.lnf_g, self.lnf_b, 1e-5)
        logits = x @ self.wte.T
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def optimiser(model, lr=6e-4):
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() != 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--case", action="append", required=True, help="variant:steps:V:D:L:H:T:B")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per case (median reported)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="time by the process's CPU time instead of wall time (CPU, use with --threads 1)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="bf16: autocast (GPU only)")
    ap.add_argument("--attention-impl", choices=["reference", "sdpa"], default="reference")
    args = ap.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device visible to PyTorch"}))
        return
    if args.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32, as in coupledqk
    if args.dtype == "bf16" and args.device != "cuda":
        sys.exit("torch_gpt.py: --dtype bf16 needs --device cuda")
    for case in args.case:
        variant, steps, V, D, L, H, T, B = case.split(":")
        steps, V, D, L, H, T, B = (int(v) for v in (steps, V, D, L, H, T, B))
        generator = torch.Generator().manual_seed(0)
        model = Gpt(variant, steps, V, D, L, H, T, generator).to(args.device)
        if args.attention_impl == "sdpa" and not variant.startswith("diff"):
            from torch_cuda import sdpa_forward  # projections + eager dynamics + fused causal attention
            model.attention = sdpa_forward
        opt = optimiser(model)
        tokens = torch.randint(0, V, (B, T), generator=generator).to(args.device)
        targets = torch.randint(0, V, (B, T), generator=generator).to(args.device)
        autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if args.dtype == "bf16"
                    else contextlib.nullcontext())

        def step():
            opt.zero_grad(set_to_none=True)
            with autocast:
                loss = model.loss(tokens, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            return loss.item()

        for _ in range(args.warmup):
            step()
        times = []
        for _ in range(args.reps):
            t0 = clock()
            step()
            times.append((clock() - t0) * 1e3)
        ms = statistics.median(times)
        print(json.dumps({"variant": variant, "steps": steps, "V": V, "D": D, "L": L, "H": H, "T": T, "B": B,
                          "ms": ms, "tokens_per_s": B * T / (ms / 1e3), "threads": args.threads,
                          "device": args.device, "dtype": args.dtype, "attention_impl": args.attention_impl,
                          "params": sum(p.numel() for p in model.parameters()), "torch": torch.__version__,
                          "openblas_core": OPENBLAS_CORE}),
              flush=True)


if __name__ == "__main__":
    main()
