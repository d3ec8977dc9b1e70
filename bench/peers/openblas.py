#!/usr/bin/python3
"""OpenBLAS on its proper kernels for this CPU, and the machine's SGEMM peak as OpenBLAS reaches it.

Debian's OpenBLAS picks its kernels at load time from the CPU it recognises; a CPU it does not know
gets the generic SSE3 kernels ("Prescott"), several times slower on an AVX-512 machine, and a
PyTorch or numpy peer timed on them flatters coupledqk. `use_proper_kernels()` (called by the peer
scripts before they import numpy or torch; never by the project's tests) asks OpenBLAS which core it
detects and, when that core lacks instruction-set families the CPU has (AVX-512, AVX2), sets
OPENBLAS_CORETYPE to the best family the CPU supports. A user's own OPENBLAS_CORETYPE is kept.

    openblas.py --threads 2 [--n 2048] [--seconds 2]

prints one JSON object: the core OpenBLAS uses, how it was chosen, and the GFLOP/s of an n x n
float32 numpy matmul on that many threads (the result checked against float64).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

# OpenBLAS core names by the widest instruction set their SGEMM kernels use.
AVX512_CORES = {"SKYLAKEX", "COOPERLAKE", "SAPPHIRERAPIDS"}
AVX2_CORES = {"HASWELL", "ZEN", "SKYLAKE", "ATOMX"} | AVX512_CORES


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def best_core(flags):
    """The OpenBLAS core family with the widest kernels this CPU runs (None: leave OpenBLAS alone)."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "Cooperlake" if "avx512_bf16" in flags else "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def detected_core(env=None):
    """The core OpenBLAS (as loaded by numpy) reports, e.g. 'Cooperlake' or 'Prescott'."""
    env = dict(os.environ if env is None else env, OPENBLAS_VERBOSE="2")
    out = subprocess.run([sys.executable, "-c", "import numpy"], capture_output=True, text=True, env=env)
    m = re.search(r"Core:\s*(\S+)", out.stdout + out.stderr)
    return m.group(1) if m else "unknown"


def rank(core):
    c = core.upper()
    return 2 if c in AVX512_CORES else 1 if c in AVX2_CORES else 0


def use_proper_kernels():
    """Sets OPENBLAS_CORETYPE in os.environ when needed (before numpy/torch are imported).
    Returns (core in use, how it was chosen)."""
    best = best_core(cpu_flags())
    if os.environ.get("OPENBLAS_CORETYPE"):
        given = os.environ["OPENBLAS_CORETYPE"]
        if best and rank(given) < rank(best):  # kept, but a peak measured on it is not the machine's
            return given, (f"OPENBLAS_CORETYPE={given} set by the caller, narrower than this CPU's {best} "
                           f"kernels: OpenBLAS runs below the machine's peak (unset it for the real one)")
        return given, "OPENBLAS_CORETYPE set by the caller"
    found = detected_core()
    if best and rank(found) < rank(best):
        os.environ["OPENBLAS_CORETYPE"] = best
        return best, f"OPENBLAS_CORETYPE={best} (OpenBLAS detected {found}, generic for this CPU)"
    return found, "detected by OpenBLAS"


def sgemm_gflops(n, threads, seconds, cpu_time=False):
    """GFLOP/s of C = A B, float32 n x n, numpy on OpenBLAS with `threads` threads (in a child process
    so that the thread count takes effect); the product is checked against float64. cpu_time: over
    the process's CPU time instead of wall time (for one thread on a loaded machine)."""
    clock = "time.process_time" if cpu_time else "time.perf_counter"
    code = f"""
import json, time, numpy as np
rng = np.random.default_rng(0)
a = rng.standard_normal(({n}, {n}), dtype=np.float32); b = rng.standard_normal(({n}, {n}), dtype=np.float32)
c = a @ b
ref = a.astype(np.float64) @ b.astype(np.float64)
err = float(np.abs(c - ref).max() / np.abs(ref).max())
reps, t0 = 0, {clock}()
while True:
    c = a @ b; reps += 1
    el = {clock}() - t0
    if el >= {seconds}: break
print(json.dumps({{"gflops": 2.0 * {n}**3 * reps / el / 1e9, "max_rel_err": err}}))
"""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if not r["max_rel_err"] < 1e-4:
        sys.exit(f"openblas: the float32 product is wrong (max relative error {r['max_rel_err']:.3g})")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--cpu-time", action="store_true", help="GFLOP/s over CPU time (use with --threads 1)")
    args = ap.parse_args()
    core, how = use_proper_kernels()
    r = sgemm_gflops(args.n, args.threads, args.seconds, args.cpu_time)
    print(json.dumps({"core": core, "how": how, "threads": args.threads, "n": args.n, **r}))


if __name__ == "__main__":
    main()
