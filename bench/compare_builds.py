#!/usr/bin/python3
"""The same benchmark cases from several coupledqk-bench binaries, alternating, in one run.

    bench/compare_builds.py --bin avx512=build/bench/coupledqk-bench \\
        --bin avx2=build-avx2/bench/coupledqk-bench --threads 2 --rounds 3 \\
        --filter '^(sgemm/2048|layer/(standard|leapfrog)/1/fwdbwd/B4/T512/D512)/' [--min-time 0.5]

(Google Benchmark matches the filter against names that carry a suffix, e.g. /min_time:0.500/real_time:
end a pattern with '/' rather than '$'.)

For a comparison of builds (an AVX-512 build against one configured with -DCOUPLEDQK_NATIVE=OFF, or
a branch against main) on a shared machine: every round runs each binary once on the cases, in a
rotated order, so that a change of load hits every binary alike; the table gives the median over
rounds of each binary's time (ms; GFLOP/s for sgemm cases) and its ratio to the first binary's.
--cpu-time reports the main thread's CPU time instead of wall time: on one thread (--threads 1) it
is what a loaded machine disturbs least (other processes take turns on the cores, but they do not
stretch the CPU time of this one much), so use it when other work is running.
Prints Markdown, with the command, the CPU and the load before and after.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(binary, threads, pattern, min_time, cpu_time):
    cmd = [binary, "--threads", str(threads), f"--benchmark_filter={pattern}", "--benchmark_format=json",
           f"--benchmark_min_time={min_time}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        sys.exit(f"compare_builds: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    isa = next((line.split("instruction set:", 1)[1].strip() for line in out.stderr.splitlines()
                if "instruction set:" in line), "unknown (binary predates the line)")
    rows = {}
    for b in json.loads(out.stdout)["benchmarks"]:
        name = b["name"].split("/min_time")[0].replace("/real_time", "")
        if name.startswith("sgemm"):  # GFLOP/s over wall time, or over CPU time
            rows[name] = b["GFLOPS"] * (b["real_time"] / b["cpu_time"] if cpu_time else 1.0)
        else:
            rows[name] = b["cpu_time" if cpu_time else "real_time"]
    return rows, isa


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", action="append", required=True, help="label=path of a coupledqk-bench binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--filter", required=True, help="Google Benchmark --benchmark_filter regex")
    ap.add_argument("--min-time", default="0.5")
    ap.add_argument("--cpu-time", action="store_true", help="CPU time of the main thread instead of wall time")
    args = ap.parse_args()
    bins = []
    for b in args.bin:
        label, _, path = b.partition("=")
        if not path or not os.path.exists(path):
            sys.exit(f"compare_builds: --bin wants label=path of an existing binary; got '{b}'")
        bins.append((label, path))
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    times = {label: {} for label, _ in bins}
    isas = {}
    for r in range(args.rounds):
        order = bins[r % len(bins):] + bins[:r % len(bins)]
        for label, path in order:
            rows, isas[label] = run(path, args.threads, args.filter, args.min_time, args.cpu_time)
            for name, value in rows.items():
                times[label].setdefault(name, []).append(value)
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    cpu = "unknown CPU"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    print("```\n" + " ".join(["bench/compare_builds.py"] + [f"'{a}'" if "|" in a or "(" in a else a
                                                           for a in sys.argv[1:]]) + "\n```\n")
    print(f"{cpu}, {os.cpu_count()} cores, {args.threads} threads, {args.rounds} rounds (median of "
          f"{'CPU' if args.cpu_time else 'wall'} times); "
          f"load average before {load_before}, after {load_after}.\n")
    for label, path in bins:
        print(f"- {label}: `{path}`, {isas[label]}")
    print()
    first = bins[0][0]
    head = "| case | " + " | ".join(f"{label}" for label, _ in bins) + " | " + \
        " | ".join(f"{label} / {first}" for label, _ in bins[1:]) + " |"
    print(head)
    print("|---|" + "---:|" * (2 * len(bins) - 1))
    for name in times[first]:
        med = {label: statistics.median(times[label][name]) for label, _ in bins if name in times[label]}
        unit = " GFLOP/s" if name.startswith("sgemm") else " ms"
        cells = [f"{med[label]:.1f}{unit}" if label in med else "-" for label, _ in bins]
        ratios = [f"{med[label] / med[first]:.2f}x" if label in med else "-" for label, _ in bins[1:]]
        print(f"| {name} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
