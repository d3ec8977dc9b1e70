#!/usr/bin/python3
"""Masks and sequence layouts: coupledqk against eager PyTorch, in one run, same machine and threads.

    bench/peers/masks_side_by_side.py --build build --threads 2 [--reps 3] [--min-time 0.5]
                                      [--out docs/performance-masks.md]

Runs coupledqk-bench's mask/... cases (bench/bench_attention.cpp: one sequence of T = 4096 under
the causal, bidirectional and windowed (w = 128) masks; 8 sequences of 512 tokens right-padded to
1024 or packed, beside 8 full sequences of 1024) and torch_layer.py's peers with the same masks
(tests/parity/reference.py: scores masked to -inf before the softmax, the math of
F.scaled_dot_product_attention with a boolean attn_mask; a packed batch's peer is the padded one,
as eager PyTorch has no packed form). Writes a Markdown report: times, GFLOP/s of the pairs each mask
lets through, fractions of OpenBLAS's SGEMM peak (measured first), PyTorch / coupledqk, and two
derived figures:

  * a window's cost against its ideal: the causal time scaled by the useful FLOPs of the window
    over those of the causal mask (projections + the visible pairs), i.e. w/T of the causal
    scoring plus the dense parts; 1.0 is ideal;
  * a packed batch of half-length sequences against the padded one (time ratio).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import openblas  # noqa: E402
import side_by_side  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
LONG = [("causal", 1, 4096), ("bidir", 1, 4096), ("causal-w128", 1, 4096), ("bidir-w128", 1, 4096)]
LAYOUTS = [("causal", 8, 1024), ("padded-half", 8, 1024), ("packed-half", 8, 1024)]
VARIANTS = ["standard", "leapfrog"]
PASSES = ["fwd", "fwdbwd"]
D = 512


def name(kind, variant, p, B, T):
    return f"mask/{kind}/{variant}/{p}/B{B}/T{T}/D{D}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="PyTorch repetitions (median)")
    ap.add_argument("--min-time", default="0.5")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "performance-masks.md"))
    args = ap.parse_args()
    binary = os.path.join(args.build, "bench", "coupledqk-bench")
    if not os.access(binary, os.X_OK):
        sys.exit(f"masks_side_by_side: {binary} is not built (cmake --build {args.build} --target coupledqk-bench)")
    core, core_how = openblas.use_proper_kernels()
    load_before = side_by_side.load_average()
    peak = openblas.sgemm_gflops(2048, args.threads, 3.0)["gflops"]
    cases = LONG + LAYOUTS
    ours, info, cmd = side_by_side.run_bench(binary, args.threads, "^mask/", args.min_time, peak)
    torch_cases = [f"{v}:1:{B}:{T}:{D}:{k}" for v in VARIANTS for k, B, T in cases]
    tcmd = [sys.executable, os.path.join(HERE, "torch_layer.py"), "--threads", str(args.threads), "--reps",
            str(args.reps)] + [a for c in torch_cases for a in ("--case", c)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OPENBLAS_NUM_THREADS=str(args.threads))
    out = subprocess.run(tcmd, check=True, capture_output=True, text=True, env=env)
    theirs = {}
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            theirs[(r["variant"], r["mask"], r["B"], r["T"], r["pass"])] = r
    load_after = side_by_side.load_average()

    lines = ["# CPU performance: masks and sequence layouts", "",
             f"Measured {datetime.date.today().isoformat()} on {side_by_side.cpu_name()}, {os.cpu_count()} cores, "
             f"{args.threads} threads, by:", "", "```",
             "bench/peers/masks_side_by_side.py " + " ".join(sys.argv[1:]), "```", "",
             f"Load average (1, 5, 15 min) before: {load_before}; after: {load_after}. coupledqk: `{cmd}` "
             f"(float32, {info['isa']}). PyTorch eager, float32, same threads: `tests/parity/reference.py` with "
             f"the same mask (boolean mask, scores set to -inf before the softmax: the math of "
             f"`F.scaled_dot_product_attention`, which Debian's torch 1.13 predates). OpenBLAS core {core} ({core_how}).",
             "", f"Peak: OpenBLAS SGEMM (numpy float32, n = 2048, {args.threads} threads) **{peak:.1f} GFLOP/s**. "
             "GFLOP/s count useful work only: the projections of the valid tokens and, per pair a mask lets "
             "through, q.k and p v (forward + backward: 3x). D = 512, head size 64.", "",
             "The machine is shared and noisy: compare the ratios within one run.", "",
             "| mask | variant | B | T | pass | coupledqk ms | GFLOP/s | % peak | PyTorch ms | PyTorch / coupledqk |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    ms = {}
    for v in VARIANTS:
        for k, B, T in cases:
            for p in PASSES:
                b = ours.get(name(k, v, p, B, T))
                t = theirs.get((v, k, B, T, p))
                if b is None:
                    continue
                ms[(v, k, p)] = b["real_time"]
                ratio = f"{t['ms'] / b['real_time']:.2f}x" if t else "-"
                lines.append(f"| {k} | {v} | {B} | {T} | {p} | {b['real_time']:.1f} | {b['GFLOPS']:.1f} | "
                             f"{100 * b['GFLOPS'] / peak:.0f}% | {t['ms']:.1f} | {ratio} |" if t else
                             f"| {k} | {v} | {B} | {T} | {p} | {b['real_time']:.1f} | {b['GFLOPS']:.1f} | "
                             f"{100 * b['GFLOPS'] / peak:.0f}% | - | - |")
    lines += ["", "## Derived", "",
              "| variant | pass | window 128 at T = 4096: time / ideal (causal) | bidirectional window / ideal "
              "| packed / padded (half-length sequences) |", "|---|---|---:|---:|---:|"]
    for v in VARIANTS:
        for p in PASSES:
            def ideal(window_kind, full_kind):
                w = ours.get(name(window_kind, v, p, 1, 4096))
                f = ours.get(name(full_kind, v, p, 1, 4096))
                if not (w and f):
                    return "-"
                # flops per iteration = GFLOPS * time; ideal time = full time * flops(w) / flops(full)
                fw, ff = w["GFLOPS"] * w["real_time"], f["GFLOPS"] * f["real_time"]
                return f"{w['real_time'] / (f['real_time'] * fw / ff):.2f}"
            pad, pack = ms.get((v, "padded-half", p)), ms.get((v, "packed-half", p))
            lines.append(f"| {v} | {p} | {ideal('causal-w128', 'causal')} | {ideal('bidir-w128', 'bidir')} | "
                         f"{pack / pad:.2f} |" if pad and pack else f"| {v} | {p} | - | - | - |")
    lines.append("")
    with open(args.out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
