#!/usr/bin/env python3
"""coupledqk's CUDA layers against PyTorch on the same GPU, in one run.

    bench/peers/gpu_side_by_side.py --build build-gpu [--out docs/performance-gpu.md] [--tests-log FILE]

Runs coupledqk-bench-cuda (Google Benchmark with CUDA events; it measures the GPU's cuBLAS GEMM
peak itself) and torch_cuda.py (PyTorch SDPA and the eager spec reference) on the issue's shape
(B=16, T=1024, D=512, H=8, d=64) in bf16 and float32, then writes a Markdown report: times,
tokens/s, TFLOP/s, MFU (FLOP formulas in bench/flops.hpp), the ratios the targets name, the GPU,
and the commands. scripts/gpu-check calls it after the CUDA tests.
"""
import argparse
import datetime
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SHAPE = (16, 1024, 512)
CASES = [("standard", 1), ("leapfrog", 1), ("leapfrog", 3), ("euler", 1), ("uncoupled", 1), ("diff", 1),
         ("diff-leapfrog", 1), ("affine", 1), ("diff-affine", 1)]


def run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if out.returncode != 0:
        sys.exit(f"gpu_side_by_side: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build-gpu"))
    ap.add_argument("--out", default=os.path.join(ROOT, "docs", "performance-gpu.md"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tests-log", help="ctest output to summarise in the report")
    args = ap.parse_args()

    binary = os.path.join(args.build, "bench", "coupledqk-bench-cuda")
    bench_cmd = [binary, "--benchmark_format=json"]
    out = run(bench_cmd)
    if out.stdout.startswith("skipped"):
        sys.exit("gpu_side_by_side: " + out.stdout.strip())
    ours = {b["name"].split("/iterations")[0].split("/manual_time")[0]: b for b in json.loads(out.stdout)["benchmarks"]}
    gpu = re.search(r"coupledqk-bench-cuda: (.*?);", out.stderr)
    peaks = re.search(r"f32 ([0-9.]+), bf16 ([0-9.]+) TFLOP/s", out.stderr)

    B, T, D = SHAPE
    torch_rows = {}
    torch_cmds = []
    for dtype in ("bf16", "f32"):
        cmd = [sys.executable, os.path.join(HERE, "torch_cuda.py"), "--dtype", dtype, "--reps", str(args.reps)]
        for v, s in CASES:
            cmd += ["--case", f"{v}:{s}:{B}:{T}:{D}"]
        torch_cmds.append(" ".join(cmd))
        for line in run(cmd).stdout.splitlines():
            r = json.loads(line)
            if "ms" in r:
                torch_rows[(r["variant"], r["steps"], dtype, r["impl"], r["pass"])] = r

    def ours_ms(v, s, dtype, p):
        b = ours.get(f"cuda/layer/{v}/{s}/{dtype}/{p}/B{B}/T{T}/D{D}")
        return (b["real_time"], b.get("TFLOPS"), b.get("mfu"), b.get("tokens_per_s")) if b else None

    lines = ["# GPU performance", "",
             f"Generated {datetime.date.today()} by `bench/peers/gpu_side_by_side.py` (via `scripts/gpu-check`).", "",
             f"- GPU: {gpu.group(1) if gpu else 'unknown'}",
             f"- measured cuBLAS GEMM peak (n = 8192): f32 {peaks.group(1) if peaks else '?'} TFLOP/s, "
             f"bf16 {peaks.group(2) if peaks else '?'} TFLOP/s (MFU below is against these)",
             f"- shape: B={B}, T={T}, D={D}, H={D // 64}, d=64; FLOP formulas in `bench/flops.hpp`",
             f"- commands: `{' '.join(bench_cmd)}`; " + "; ".join(f"`{c}`" for c in torch_cmds), ""]
    for dtype in ("bf16", "f32"):
        lines += [f"## Attention layer, {dtype}", "",
                  "| variant | steps | pass | coupledqk ms | TFLOP/s | MFU | tokens/s | PyTorch SDPA ms | PyTorch eager ms | vs SDPA | vs eager |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for v, s in CASES:
            for p in ("fwd", "fwdbwd"):
                o = ours_ms(v, s, dtype, p)
                sd = torch_rows.get((v, s, dtype, "sdpa", p))
                eg = torch_rows.get((v, s, dtype, "eager", p))
                fmt = lambda x, f="{:.3f}": f.format(x) if x is not None else "-"
                lines.append("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
                    v, s, p, fmt(o and o[0]), fmt(o and o[1], "{:.1f}"), fmt(o and o[2], "{:.2f}"),
                    fmt(o and o[3], "{:.3g}"), fmt(sd and sd["ms"]), fmt(eg and eg["ms"]),
                    fmt(o and sd and sd["ms"] / o[0], "{:.2f}x"), fmt(o and eg and eg["ms"] / o[0], "{:.2f}x")))
        lines.append("")
    # The targets (bf16, forward + backward).
    st, lf = ours_ms("standard", 1, "bf16", "fwdbwd"), ours_ms("leapfrog", 1, "bf16", "fwdbwd")
    sd = torch_rows.get(("standard", 1, "bf16", "sdpa", "fwdbwd"))
    lines += ["## Targets (bf16, forward + backward)", ""]
    if st and lf:
        r = lf[0] / st[0]
        lines.append(f"- coupled (leapfrog, 1 step) / standard: {r:.2f}x (target <= 1.10x: {'met' if r <= 1.10 else 'MISSED'})")
    if st and sd:
        r = st[0] / sd["ms"]
        lines.append(f"- coupledqk standard / PyTorch SDPA layer: {r:.2f}x (target <= 1.5x: {'met' if r <= 1.5 else 'MISSED'})")
    # GPT training step at the paper-like shape, against the same model in eager PyTorch (torch_gpt.py:
    # "sdpa" = eager dynamics + PyTorch's fused attention; "reference" = the spec reference throughout).
    gpt = {k: b for k, b in ours.items() if k.startswith("cuda/gpt/")}
    if gpt:
        GV, GD, GL, GH, GT, GB = 8192, 512, 8, 8, 1024, 16
        peer, gpt_cmds = {}, []
        for dtype in ("bf16", "f32"):
            for impl in ("sdpa", "reference"):
                cmd = [sys.executable, os.path.join(HERE, "torch_gpt.py"), "--device", "cuda", "--dtype", dtype,
                       "--attention-impl", impl, "--reps", "5", "--warmup", "2"]
                for v in ("standard", "leapfrog"):
                    cmd += ["--case", f"{v}:1:{GV}:{GD}:{GL}:{GH}:{GT}:{GB}"]
                gpt_cmds.append(" ".join(cmd))
                for line in run(cmd).stdout.splitlines():
                    r = json.loads(line)
                    if "ms" in r:
                        peer[(r["variant"], dtype, impl)] = r["ms"]
        lines += ["", f"## GPT training step (V={GV}, D={GD}, L={GL}, H={GH}, T={GT}, B={GB}; AdamW + clipping)", "",
                  "| variant | precision | coupledqk ms | tokens/s | TFLOP/s | MFU | PyTorch (SDPA) ms | PyTorch (reference) ms | vs SDPA | vs reference |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for v in ("standard", "leapfrog"):
            for dtype in ("bf16", "f32"):
                b = gpt.get(f"cuda/gpt/{v}/1/{dtype}/V{GV}/D{GD}/L{GL}/H{GH}/T{GT}/B{GB}")
                if not b:
                    continue
                ms = b["real_time"]
                ps, pr = peer.get((v, dtype, "sdpa")), peer.get((v, dtype, "reference"))
                lines.append(f"| {v} | {dtype} | {ms:.2f} | {b.get('tokens_per_s', 0):.3g} | {b.get('TFLOPS', 0):.1f} | "
                             f"{b.get('mfu', 0):.2f} | {ps if ps is None else f'{ps:.2f}'} | {pr if pr is None else f'{pr:.2f}'} | "
                             f"{'-' if ps is None else f'{ps / ms:.2f}x'} | {'-' if pr is None else f'{pr / ms:.2f}x'} |")
        lines += ["", "PyTorch commands: " + "; ".join(f"`{c}`" for c in gpt_cmds)]
    if args.tests_log and os.path.exists(args.tests_log):
        with open(args.tests_log) as f:
            tail = [l.rstrip() for l in f if "tests passed" in l or "Test #" in l]
        lines += ["", "## CUDA tests (this run)", "", "```"] + tail[-20:] + ["```"]
    notes = os.path.join(ROOT, "docs", "performance-gpu-notes.md")
    if os.path.exists(notes):
        lines += ["", open(notes).read().rstrip()]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
