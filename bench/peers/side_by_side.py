#!/usr/bin/python3
"""coupledqk against eager PyTorch, in one run, on the same machine and threads.

    bench/peers/side_by_side.py --build build --threads 2 [--out docs/performance.md]
                                [--reps 5] [--min-time 1.0] [--gpt-reps 3] [--no-gpt]

Measures the machine's SGEMM peak first: OpenBLAS (numpy, float32, n=2048, same threads) on the
kernels of this CPU (openblas.py: OPENBLAS_CORETYPE is set for these peers when OpenBLAS would fall
back to generic kernels). Then runs coupledqk-bench with that peak (--peak-gflops; the binary also
measures and prints the library's own SGEMM, reported beside it) and torch_layer.py on the same
layer shapes, then the GPT training-step cases of coupledqk-bench
(gpt/...) and torch_gpt.py on the same models, and writes a Markdown report with times, tokens/s,
ratios and fractions of the measured peak, with the machine, the load, the thread count and the
command. docs/performance-notes.md, when present, is appended.
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import openblas  # noqa: E402
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# (variant, steps) at B=4, T=512, D=512 (the target shape), both passes.
LAYER_CASES = [("standard", 1), ("leapfrog", 1), ("leapfrog", 3), ("euler", 1), ("uncoupled", 1),
               ("diff", 1), ("diff-leapfrog", 1), ("affine", 1), ("diff-affine", 1),
               ("drift", 1), ("newton-euler", 1), ("newton-leapfrog", 1), ("unit-leapfrog", 1)]
SHAPE = (4, 512, 512)
# Attention forward at longer sequences (peak fraction target: T >= 512).
FORWARD_T = [512, 1024]
# GPT training step: (V, D, L, H, T, B). The main job's configuration (coupledqk-compare:
# examples/train/trainer.hpp Defaults with vocabulary 4096) and the paper's model shape (D=512, L=8,
# H=8, T=512) with V=8192 and B=4 (2048 tokens per step, like the main job's).
GPT_SHAPES = [("main job", (4096, 128, 2, 4, 128, 16)), ("paper shape", (8192, 512, 8, 8, 512, 4))]
GPT_VARIANTS = [("standard", 1), ("leapfrog", 1)]


def gpt_name(variant, steps, shape):
    V, D, L, H, T, B = shape
    return f"gpt/{variant}/{steps}/step/V{V}/D{D}/L{L}/H{H}/T{T}/B{B}"


def load_average():
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run_bench(binary, threads, pattern, min_time, peak, cpu_time=False):
    cmd = [binary, "--threads", str(threads), "--peak-gflops", f"{peak:.1f}", f"--benchmark_filter={pattern}",
           "--benchmark_format=json", f"--benchmark_min_time={min_time}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        sys.exit(f"side_by_side: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    data = json.loads(out.stdout)
    own = re.search(r"library SGEMM ([0-9.]+) GFLOP/s", out.stderr)
    isa = re.search(r"instruction set: (.*)", out.stderr)
    backend = re.search(r"gemm backend: (.*)", out.stderr)
    results = {}
    for b in data["benchmarks"]:
        if cpu_time:  # rates over the thread's CPU time instead of wall time
            f = b["real_time"] / b["cpu_time"]
            for key in ("GFLOPS", "peak_frac", "tokens_per_s"):
                if key in b:
                    b[key] *= f
            b["real_time"] = b["cpu_time"]
        results[b["name"].split("/min_time")[0].replace("/real_time", "")] = b
    info = {"own_sgemm": float(own.group(1)) if own else float("nan"),
            "isa": isa.group(1).strip() if isa else "unknown",
            "backend": backend.group(1).strip() if backend else "Eigen (the binary does not say)"}
    return results, info, " ".join(cmd)


def run_torch(threads, cases, reps, cpu_time=False):
    cmd = [sys.executable, os.path.join(HERE, "torch_layer.py"), "--threads", str(threads), "--reps", str(reps)]
    cmd += ["--cpu-time"] if cpu_time else []
    for c in cases:
        cmd += ["--case", c]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(r["variant"], r["steps"], r["T"], r["pass"]): r for r in rows}


def run_torch_gpt(threads, reps, cpu_time=False):
    cmd = [sys.executable, os.path.join(HERE, "torch_gpt.py"), "--threads", str(threads), "--reps", str(reps)]
    cmd += ["--cpu-time"] if cpu_time else []
    for _, shape in GPT_SHAPES:
        for v, s in GPT_VARIANTS:
            cmd += ["--case", ":".join(str(x) for x in (v, s) + shape)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {(r["variant"], r["steps"], (r["V"], r["D"], r["L"], r["H"], r["T"], r["B"])): r for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "performance.md"))
    ap.add_argument("--reps", type=int, default=5, help="PyTorch layer repetitions (median)")
    ap.add_argument("--min-time", default="1.0", help="Google Benchmark --benchmark_min_time for the layers "
                    "(the layer cases set 0.5 s themselves, which takes precedence)")
    ap.add_argument("--gpt-reps", type=int, default=3, help="PyTorch GPT steps timed per case (median)")
    ap.add_argument("--gpt-min-time", default="3.0", help="Google Benchmark --benchmark_min_time for the GPT steps "
                    "(seconds of timed steps per case, at least one step)")
    ap.add_argument("--no-gpt", action="store_true", help="layers only")
    ap.add_argument("--layers", default="", help="the layer cases, variant:steps,... (default: "
                    + ",".join(f"{v}:{s}" for v, s in LAYER_CASES) + ")")
    ap.add_argument("--cpu-time", action="store_true",
                    help="with --threads 1: every time and rate over CPU time (the benchmark thread's, the "
                    "PyTorch and numpy processes'), which a loaded machine disturbs far less than wall time")
    args = ap.parse_args()
    if args.cpu_time and args.threads != 1:
        sys.exit(f"side_by_side: --cpu-time needs --threads 1 (CPU time sums over threads); got --threads {args.threads}")
    ct = args.cpu_time
    layer_cases = LAYER_CASES
    if args.layers:
        layer_cases = []
        for item in args.layers.split(","):
            v, _, s = item.partition(":")
            if not re.fullmatch(r"[a-z][a-z0-9-]*", v) or not re.fullmatch(r"[1-7]", s or "1"):
                sys.exit(f"side_by_side: --layers '{item}': expected variant:steps (a variant name, steps 1..7)")
            layer_cases.append((v, int(s or "1")))
    binary = os.path.join(args.build, "bench", "coupledqk-bench")
    B, T, D = SHAPE

    names = []
    for v, s in layer_cases:
        for p in ("fwd", "fwdbwd"):
            names.append(f"layer/{v}/{s}/{p}/B{B}/T{T}/D{D}")
    for t in FORWARD_T:
        names.append(f"layer/standard/1/fwd/B{B}/T{t}/D{D}")
        names.append(f"layer/leapfrog/1/fwd/B{B}/T{t}/D{D}")
    # names hold only [A-Za-z0-9/-]: nothing to escape
    pattern = "^(sgemm/2048|sgemm-eigen/2048|" + "|".join(sorted(set(names))) + ")"
    load_before = load_average()
    core, core_how = openblas.use_proper_kernels()  # before any child loads OpenBLAS
    blas = openblas.sgemm_gflops(2048, args.threads, 3.0, ct)
    peak = blas["gflops"]
    ours, info, bench_cmd = run_bench(binary, args.threads, pattern, args.min_time, peak, ct)
    torch_cases = sorted({f"{v}:{s}:{B}:{T}:{D}" for v, s in layer_cases} |
                         {f"{v}:1:{B}:{t}:{D}" for t in FORWARD_T for v in ("standard", "leapfrog")})
    theirs = run_torch(args.threads, torch_cases, args.reps, ct)
    gpt_ours, gpt_theirs, gpt_cmd, gpt_info = {}, {}, "", info
    if not args.no_gpt:
        gpt_pattern = "^(" + "|".join(gpt_name(v, st, sh) for _, sh in GPT_SHAPES for v, st in GPT_VARIANTS) + ")"
        gpt_ours, gpt_info, gpt_cmd = run_bench(binary, args.threads, gpt_pattern, args.gpt_min_time, peak, ct)
        gpt_theirs = run_torch_gpt(args.threads, args.gpt_reps, ct)
    blas_after = openblas.sgemm_gflops(2048, args.threads, 3.0, ct)
    load_after = load_average()
    lib = ours.get("sgemm/2048")
    lib_gflops = lib["GFLOPS"] if lib else info["own_sgemm"]
    eig = ours.get("sgemm-eigen/2048")
    eig_gflops = eig["GFLOPS"] if eig else float("nan")

    def ours_row(v, s, p, t=T):
        return ours.get(f"layer/{v}/{s}/{p}/B{B}/T{t}/D{D}")

    lines = []
    lines.append("# CPU performance\n")
    lines.append(f"Measured {datetime.date.today().isoformat()} on {cpu_name()}, {os.cpu_count()} cores, "
                 f"{args.threads} threads, by:\n")
    lines.append("```\n" + " ".join(["bench/peers/side_by_side.py"] + sys.argv[1:]) + "\n```\n")
    lines.append(f"Load average (1, 5, 15 min) before the run: {load_before}; after: {load_after}.\n")
    lines.append(f"coupledqk: `{bench_cmd}` (float32, OpenMP; "
                 f"compiled for {info['isa']}; the kernel under `coupledqk::gemm`: {info['backend']}). PyTorch {theirs and next(iter(theirs.values()))['torch']}"
                 " eager, float32, same threads, the spec's implementation in `tests/parity/reference.py`"
                 " (Debian's python3-torch with OpenBLAS from libopenblas0-pthread, "
                 f"OpenBLAS core {core}: {core_how}).\n")
    lines.append(f"Peak: the machine's SGEMM, OpenBLAS (numpy float32, n = 2048, {args.threads} threads, core {core}; "
                 f"checked against float64), **{peak:.1f} GFLOP/s** before the run and {blas_after['gflops']:.1f} after. "
                 "'% peak' is useful GFLOP/s over the figure before (FLOP formulas in `bench/flops.hpp`: causal "
                 "attention counts only the unmasked half; forward + backward counts 3x the forward). "
                 f"The library's own SGEMM (`coupledqk::gemm`, same size and threads) in the same run: "
                 f"**{lib_gflops:.1f} GFLOP/s = {100 * lib_gflops / peak:.0f}% of OpenBLAS**; Eigen's own product "
                 f"driver: {eig_gflops:.1f} GFLOP/s.\n")
    if ct:
        lines.append("Every time and rate below is over **CPU time** (`--cpu-time`): the benchmark thread's for "
                     "coupledqk, the process's for PyTorch and numpy, all on one thread.\n")
    lines.append("The machine is shared and noisy: compare the ratios within one run, not absolute times across runs.\n")
    lines.append(f"## Attention layer, B={B}, T={T}, D={D}, head size 64\n")
    lines.append("| variant | steps | pass | coupledqk ms | tokens/s | GFLOP/s | % peak | PyTorch ms | PyTorch / coupledqk |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for v, s in layer_cases:
        for p in ("fwd", "fwdbwd"):
            o = ours_row(v, s, p)
            t = theirs.get((v, s, T, p))
            if not o or not t:
                continue
            ms = o["real_time"]
            lines.append(f"| {v} | {s} | {p} | {ms:.1f} | {o['tokens_per_s']:.0f} | {o['GFLOPS']:.1f} | "
                         f"{100 * o['peak_frac']:.0f}% | {t['ms']:.1f} | {t['ms'] / ms:.2f}x |")
    lines.append("")
    lines.append(f"## Attention forward at longer sequences, B={B}, D={D}\n")
    lines.append("| variant | T | coupledqk ms | GFLOP/s | % peak | PyTorch ms | PyTorch / coupledqk |")
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for t_ in FORWARD_T:
        for v in ("standard", "leapfrog"):
            o = ours_row(v, 1, "fwd", t_)
            t = theirs.get((v, 1, t_, "fwd"))
            if o and t:
                lines.append(f"| {v} | {t_} | {o['real_time']:.1f} | {o['GFLOPS']:.1f} | {100 * o['peak_frac']:.0f}% | "
                             f"{t['ms']:.1f} | {t['ms'] / o['real_time']:.2f}x |")
    lines.append("")
    if gpt_ours:
        lines.append("## GPT training step\n")
        lines.append("One step = zero_grad + forward + backward + AdamW update (clipping 1.0, decay 0.1 on matrices), "
                     "float32. coupledqk: `" + gpt_cmd + "`; the tape is reused from step to step and one step runs "
                     "before timing. PyTorch: `bench/peers/torch_gpt.py` (the same model in eager PyTorch, attention "
                     f"from `tests/parity/reference.py`, torch.optim.AdamW, clip_grad_norm_), median of {args.gpt_reps} "
                     "steps after one warm-up step. GFLOP/s and % peak count the same useful work for both "
                     "(formula in `bench/bench_gpt.cpp`: 6 x non-embedding parameters x tokens, the causal "
                     "half of attention, the dynamics, and 6 B T D V for the logits); the peak is OpenBLAS's SGEMM "
                     f"above, **{peak:.1f} GFLOP/s**. allocs/step: heap allocations "
                     "inside a timed step (every malloc of the process counted).\n")
        lines.append("| shape | variant | coupledqk ms/step | tokens/s | GFLOP/s | % peak | allocs/step | "
                     "PyTorch ms/step | PyTorch tokens/s | PyTorch % peak | speed-up |")
        lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, shape in GPT_SHAPES:
            V, D, L, H, T_, B_ = shape
            for v, st in GPT_VARIANTS:
                o = gpt_ours.get(gpt_name(v, st, shape))
                t = gpt_theirs.get((v, st, shape))
                if not o:
                    continue
                ms = o["real_time"]
                row = (f"| {label}: V={V} D={D} L={L} H={H} T={T_} B={B_} | {v} | {ms:.0f} | {o['tokens_per_s']:.0f} | "
                       f"{o['GFLOPS']:.1f} | {100 * o['peak_frac']:.0f}% | {o['allocs_per_step']:.0f} | ")
                if t:
                    t_peak = o["GFLOP_per_step"] / (t["ms"] / 1e3) / peak
                    row += f"{t['ms']:.0f} | {t['tokens_per_s']:.0f} | {100 * t_peak:.0f}% | {t['ms'] / ms:.2f}x |"
                else:
                    row += "- | - | - | - |"
                lines.append(row)
        lines.append("")
    std, lf = ours_row("standard", 1, "fwdbwd"), ours_row("leapfrog", 1, "fwdbwd")
    tstd, tlf = theirs.get(("standard", 1, T, "fwdbwd")), theirs.get(("leapfrog", 1, T, "fwdbwd"))
    lines.append("## Against the targets (issues: CPU performance; the machine's instruction set)\n")
    lines.append(f"- library SGEMM / OpenBLAS SGEMM: **{100 * lib_gflops / peak:.0f}%** (target >= 85%)")
    if std and lf:
        lines.append(f"- coupled (leapfrog, 1 step) / standard, forward + backward: **{lf['real_time'] / std['real_time']:.2f}x** "
                     "(target <= 1.10x, stretch 1.05x)")
    if std and lf and tstd and tlf:
        lines.append(f"- speed-up over PyTorch eager, forward + backward: standard **{tstd['ms'] / std['real_time']:.2f}x**, "
                     f"coupled **{tlf['ms'] / lf['real_time']:.2f}x** (target >= 2x)")
    fw = [ours_row("standard", 1, "fwd", t_) for t_ in FORWARD_T]
    if all(fw):
        lines.append("- attention forward, % of the machine's SGEMM peak: " +
                     ", ".join(f"T={t_}: **{100 * r['peak_frac']:.0f}%**" for t_, r in zip(FORWARD_T, fw)) +
                     " (target >= 50%)")
    for label, shape in GPT_SHAPES:
        pairs = [(gpt_ours.get(gpt_name(v, st, shape)), gpt_theirs.get((v, st, shape)), v) for v, st in GPT_VARIANTS]
        pairs = [(o, t, v) for o, t, v in pairs if o and t]
        if not pairs:
            continue
        speed = ", ".join(f"{v} **{t['ms'] / o['real_time']:.2f}x**" for o, t, v in pairs)
        peaks = ", ".join(f"{v} **{100 * o['peak_frac']:.0f}%**" for o, t, v in pairs)
        if label == "main job":
            lines.append(f"- GPT training step at the main job's configuration, speed-up over PyTorch eager: {speed} "
                         f"(target >= 2x); % of the machine's SGEMM peak: {peaks} (target >= 55%)")
        else:
            lines.append(f"- GPT training step at the paper's shape, speed-up over PyTorch eager: {speed} "
                         f"(target >= 1.5x); % of the machine's SGEMM peak: {peaks} (target >= 70%)")
    extra = os.path.join(ROOT, "docs", "performance-notes.md")
    if os.path.exists(extra):
        lines.append("")
        with open(extra) as f:
            lines.append(f.read().rstrip())
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
