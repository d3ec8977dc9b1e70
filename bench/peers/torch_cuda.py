#!/usr/bin/env python3
"""The attention layer in PyTorch on the GPU, timed: the peer of coupledqk-bench-cuda's layer cases.

    torch_cuda.py --case standard:1:16:1024:512 --case leapfrog:1:16:1024:512 [--dtype bf16] [--reps 20]

A case is variant:steps:B:T:D (head size 64). Two PyTorch implementations per case:
  * "sdpa":  projections, the dynamics of the method spec written in eager PyTorch
             (tests/parity/reference.py's integrate) and torch.nn.functional.scaled_dot_product_attention
             (causal) -- for "standard" this is PyTorch's own fused attention;
  * "eager": the whole spec reference (tests/parity/reference.py's forward), probabilities and all.
Differential variants have no SDPA form here (two softmaxes with a learned lambda) and run "eager" only.
Prints one JSON object per case, implementation and pass (fwd, fwdbwd): milliseconds per call
(CUDA events, median of `reps` after warm-up), tokens/s.
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "parity"))
import reference  # noqa: E402


def make_case(variant, steps, B, T, D, dtype, generator):
    H, m = D // 64, 64
    dev = "cuda"
    tensors = {"x": torch.randn(B, T, D, generator=generator, device=dev).to(dtype)}
    for name, shape in reference.parameter_shapes(variant, D, H, m).items():
        scale = 0.02 if name.startswith("w") else 0.1
        tensors[name] = (scale * torch.randn(*shape, generator=generator, device=dev)).to(dtype).requires_grad_(True)
    meta = {"attention": variant, "steps": str(steps), "heads": str(H), "m": str(m), "layer_index": "1"}
    return tensors, meta


def sdpa_forward(tensors, meta):
    """Projections + eager spec dynamics + PyTorch's fused causal attention."""
    cfg = reference.config_from(tensors, meta)
    B, T, D, H, d = cfg["B"], cfg["T"], cfg["D"], cfg["H"], cfg["d"]
    x = tensors["x"]
    Q = (x @ tensors["wq"]).reshape(B, T, H, d)
    K = (x @ tensors["wk"]).reshape(B, T, H, d)
    V = (x @ tensors["wv"]).reshape(B, T, H, d)
    if cfg["integrator"] is not None:
        h = reference.step_sizes(tensors["dyn.rho"], cfg["steps"])
        Q, K = reference.integrate(Q, K, reference.dynamics_tensors(tensors), cfg["integrator"], cfg["steps"], h)
    O = F.scaled_dot_product_attention(Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2), is_causal=True)
    return O.transpose(1, 2).reshape(B, T, D) @ tensors["wo"]


def time_ms(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", required=True, help="variant:steps:B:T:D")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device visible to PyTorch"}))
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32, as in coupledqk
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    generator = torch.Generator(device="cuda").manual_seed(0)
    for case in args.case:
        variant, steps, B, T, D = case.split(":")
        steps, B, T, D = int(steps), int(B), int(T), int(D)
        tensors, meta = make_case(variant, steps, B, T, D, dtype, generator)
        dy = torch.randn(B, T, D, generator=generator, device="cuda").to(dtype)
        impls = [("eager", reference.forward)]
        if not variant.startswith("diff"):
            impls.insert(0, ("sdpa", sdpa_forward))
        for impl, forward in impls:
            def fwd():
                with torch.no_grad():
                    forward(tensors, meta)

            def fwdbwd():
                forward(tensors, meta).backward(dy)

            for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
                try:
                    ms = time_ms(fn, args.reps)
                except torch.cuda.OutOfMemoryError as e:  # the eager reference forms B*H*T*T probabilities
                    print(json.dumps({"variant": variant, "steps": steps, "impl": impl, "pass": name,
                                      "error": "out of memory: " + str(e).splitlines()[0]}), flush=True)
                    torch.cuda.empty_cache()
                    continue
                print(json.dumps({"variant": variant, "steps": steps, "B": B, "T": T, "D": D, "impl": impl,
                                  "pass": name, "dtype": args.dtype, "ms": ms, "tokens_per_s": B * T / (ms / 1e3),
                                  "torch": torch.__version__, "device": torch.cuda.get_device_name(0)}), flush=True)


if __name__ == "__main__":
    main()
