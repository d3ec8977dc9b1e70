#!/usr/bin/python3
"""The attention layer in eager PyTorch, timed: the peer of coupledqk-bench's layer cases.

The layer is tests/parity/reference.py (the PyTorch implementation of the method spec that the
parity test checks coupledqk against), run in float32 on the CPU with the given thread count.

    torch_layer.py --threads 2 --case leapfrog:1:4:512:512 [--case ...] [--reps 5]

A case is variant:steps:B:T:D (head size 64), optionally :MASK, the peer of coupledqk-bench's
mask/MASK/... cases: causal, bidir, causal-wW, bidir-wW (a window of W), padded-half (B sequences
of T/2 tokens right-padded to T) and packed-half (the same sequences; eager PyTorch has no packed
form, so its peer is the padded batch a PyTorch user would run). The mask is applied as
F.scaled_dot_product_attention applies a boolean attn_mask (reference.py writes its math out).
Prints one JSON object per case and pass (fwd, fwdbwd): median milliseconds over the repetitions
after one warm-up.
"""
import argparse
import json
import os
import statistics
import sys
import time

# OpenBLAS on the kernels of this CPU (not its generic ones): before torch loads it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openblas  # noqa: E402

OPENBLAS_CORE, OPENBLAS_HOW = openblas.use_proper_kernels()

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "parity"))
import reference  # noqa: E402


def mask_metadata(mask, B, T):
    """The reference's metadata of a mask kind (see the top of this file)."""
    if mask in ("", "causal"):
        return {}
    if mask in ("padded-half", "packed-half"):
        return {"lengths": ",".join([str(T // 2)] * B)}
    kind, _, window = mask.partition("-w")
    if kind not in ("causal", "bidir") or (window and not window.isdigit()):
        raise SystemExit(f"torch_layer.py: unknown mask {mask!r}; expected causal, bidir, causal-wW, bidir-wW, "
                         "padded-half or packed-half")
    meta = {} if kind == "causal" else {"causal": "0"}
    if window:
        meta["window"] = window
    return meta


def make_case(variant, steps, B, T, D, generator, mask=""):
    H, m = D // 64, 64
    tensors = {"x": torch.randn(B, T, D, generator=generator)}
    for name, shape in reference.parameter_shapes(variant, D, H, m).items():
        scale = 0.02 if name.startswith("w") else 0.1
        tensors[name] = (scale * torch.randn(*shape, generator=generator)).requires_grad_(True)
    meta = {"attention": variant, "steps": str(steps), "heads": str(H), "m": str(m), "layer_index": "1"}
    meta.update(mask_metadata(mask, B, T))
    return tensors, meta


# --cpu-time: the process's CPU time instead of wall time (meaningful on one thread, on a loaded machine)
CLOCK = time.perf_counter


def time_ms(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = CLOCK()
        fn()
        times.append((CLOCK() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--case", action="append", required=True, help="variant:steps:B:T:D")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu-time", action="store_true", help="time by the process's CPU time (use with --threads 1)")
    args = ap.parse_args()
    global CLOCK
    if args.cpu_time:
        CLOCK = time.process_time
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    for case in args.case:
        fields = case.split(":")
        variant, steps, B, T, D = fields[:5]
        mask = fields[5] if len(fields) > 5 else ""
        steps, B, T, D = int(steps), int(B), int(T), int(D)
        tensors, meta = make_case(variant, steps, B, T, D, generator, mask)
        dy = torch.randn(B, T, D, generator=generator)

        def fwd():
            with torch.no_grad():
                reference.forward(tensors, meta)

        def fwdbwd():
            y = reference.forward(tensors, meta)
            y.backward(dy)

        for name, fn in (("fwd", fwd), ("fwdbwd", fwdbwd)):
            ms = time_ms(fn, args.reps)
            print(json.dumps({"variant": variant, "steps": steps, "B": B, "T": T, "D": D, "pass": name, "mask": mask,
                              "ms": ms, "tokens_per_s": B * T / (ms / 1e3), "threads": args.threads,
                              "torch": torch.__version__, "openblas_core": OPENBLAS_CORE}), flush=True)


if __name__ == "__main__":
    main()
