#!/usr/bin/python3
"""coupledqk's PyTorch module against the same variant in eager PyTorch ops, side by side in one run.

    bench/peers/torch_module.py --build build --threads 2 [--reps 5] [--cpu-time] [--case leapfrog:1:4:512:512 ...]

For each case (variant:steps:B:T:D, head size 64, m = 64; default: the layer benchmark's shape
B=4, T=512, D=512 for the variants of side_by_side.py) the same float32 parameters run through
  - coupledqk.CoupledAttention (the library's fused kernels via torch.autograd.Function), and
  - tests/parity/reference.py (the spec's layer in eager PyTorch ops, as torch_layer.py),
both on torch.set_num_threads(threads). The two outputs are compared before timing. The two are
timed alternately, rep by rep (so load changes hit both), after one warm-up each: median ms of the
forward (no_grad) and of forward + backward (y.backward(dy), parameter gradients included).
Prints one JSON object per case and pass, then a Markdown table. --cpu-time measures the process's
CPU time instead of wall time (with --threads 1, a figure that other processes' load disturbs far
less than wall time on a shared machine).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "parity"))
import reference  # noqa: E402

CASES = ["standard:1", "leapfrog:1", "leapfrog:3", "euler:1", "uncoupled:1", "diff:1", "diff-leapfrog:1",
         "affine:1", "diff-affine:1"]


def make_case(variant, steps, B, T, D, generator):
    """The reference's tensors (as torch_layer.py draws them) and a module holding the same parameters."""
    import coupledqk
    H, m = D // 64, 64
    tensors = {"x": torch.randn(B, T, D, generator=generator)}
    for name, shape in reference.parameter_shapes(variant, D, H, m).items():
        scale = 0.02 if name.startswith("w") else 0.1
        tensors[name] = (scale * torch.randn(*shape, generator=generator)).requires_grad_(True)
    meta = {"attention": variant, "steps": str(steps), "heads": str(H), "m": str(m), "layer_index": "1"}
    module = coupledqk.CoupledAttention(D, H, variant, steps, hidden=m, layer_index=1, seed=0)
    module.load_state_dict({n: tensors[n].detach() for n in module.parameter_names()})
    return tensors, meta, module


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build folder holding python/coupledqk")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu-time", action="store_true", help="time.process_time instead of wall time")
    ap.add_argument("--case", action="append", help="variant:steps[:B:T:D] (default: the side-by-side list at 4:512:512)")
    args = ap.parse_args()
    sys.path.insert(0, os.path.join(args.build, "python"))
    import coupledqk
    torch.set_num_threads(args.threads)
    clock = time.process_time if args.cpu_time else time.perf_counter
    generator = torch.Generator().manual_seed(0)
    rows = []
    for case in args.case or CASES:
        parts = case.split(":")
        variant, steps = parts[0], int(parts[1])
        B, T, D = (int(p) for p in parts[2:5]) if len(parts) == 5 else (4, 512, 512)
        tensors, meta, module = make_case(variant, steps, B, T, D, generator)
        x, dy = tensors["x"], torch.randn(B, T, D, generator=generator)
        with torch.no_grad():
            ref, ours = reference.forward(tensors, meta), module(x)
        err = float((ref - ours).abs().max() / ref.abs().max())
        assert err < 1e-4, f"{case}: the module and the eager reference differ by {err:.3g}"

        def eager_fwd():
            with torch.no_grad():
                reference.forward(tensors, meta)

        def eager_fwdbwd():
            reference.forward(tensors, meta).backward(dy)

        def module_fwd():
            with torch.no_grad():
                module(x)

        def module_fwdbwd():
            module(x).backward(dy)

        for name, ours_fn, eager_fn in (("fwd", module_fwd, eager_fwd), ("fwdbwd", module_fwdbwd, eager_fwdbwd)):
            ours_fn(), eager_fn()  # warm-up
            times = {"coupledqk": [], "eager": []}
            for _ in range(args.reps):
                for key, fn in (("coupledqk", ours_fn), ("eager", eager_fn)):
                    t0 = clock()
                    fn()
                    times[key].append((clock() - t0) * 1e3)
            ms = {k: statistics.median(v) for k, v in times.items()}
            row = {"variant": variant, "steps": steps, "B": B, "T": T, "D": D, "pass": name,
                   "coupledqk_ms": round(ms["coupledqk"], 2), "eager_ms": round(ms["eager"], 2),
                   "speedup": round(ms["eager"] / ms["coupledqk"], 3), "max_rel_diff": err,
                   "threads": args.threads, "clock": "cpu" if args.cpu_time else "wall",
                   "torch": torch.__version__}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| variant | steps | pass | module ms | eager PyTorch ms | eager / module |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['variant']} | {r['steps']} | {r['pass']} | {r['coupledqk_ms']:.1f} | {r['eager_ms']:.1f} | "
              f"{r['speedup']:.2f}x |")


if __name__ == "__main__":
    main()
