#!/usr/bin/python3
"""Parity test: the coupledqk C++ tool against the PyTorch reference.

Usage:
  parity_test.py --tool PATH [--workdir DIR] [--seed S] [--variant NAME ...] [--timeout SEC]
      Runs every case (all variants, steps 1 and 3 on the main shape, steps 2 on an
      alternative shape, a few F32 cases, and every case of a variant the tool's table
      (TOOL --variants) calls reversible again with --recompute).  A name of the tool's
      table without a reference in reference.VARIANTS fails.  Then the worst error per
      dtype.  Prints one line per run and finally "N passed, M failed".
      Exit status 1 if anything failed or the tool could not be run.
  parity_test.py --write-case PATH --variant NAME --steps N [--dtype F32|F64]
                 [--shape B,T,D,H,m] [--layer-index L] [--seed S]
      Only writes one random case file (for debugging the tool).
  parity_test.py --check CASE OUT
      Compares an existing tool output OUT for case file CASE against the
      reference and prints the error of every tensor.

The tool is invoked as `TOOL INPUT.safetensors OUTPUT.safetensors [--recompute]`.
Error metric per tensor: max|tool - ref| / max(max|ref|, 1e-30), except for a tensor that
is zero to float64 round-off in the reference (max|ref| <= ZERO_BY_SYMMETRY x the largest
reference entry of the case, e.g. grad.dyn.f2 after one newton-euler step: f2 only shifts
every key of a head, which softmax ignores): its error is max|tool - ref| over that largest
entry, an absolute error on the case's scale.  A case passes
when every tensor is within TOLERANCE[dtype] and the output holds exactly the
expected tensors (names, shapes, dtype).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
import reference  # noqa: E402
import safetensors_io  # noqa: E402

TOLERANCE = {"F64": 1e-6, "F32": 1e-4}
NUMPY_DTYPE = {"F64": np.float64, "F32": np.float32}
STEPS_MAIN = (1, 3)
STEPS_ALT = 2
# A few single-precision cases: (variant, steps).
F32_CASES = [("standard", 1), ("leapfrog", 3), ("euler", 1), ("uncoupled", 3),
             ("diff-leapfrog", 3), ("diff-euler", 3), ("diff-uncoupled", 1),
             ("affine", 3), ("diff-affine", 1), ("affine", 7)]
# The velocity family (spec 3c): every name at steps 1 and 3 in single precision too.
VELOCITY = ("drift", "newton-euler", "newton-leapfrog", "unit-leapfrog")
F32_CASES += [(prefix + name, steps) for prefix in ("", "diff-") for name in VELOCITY for steps in STEPS_MAIN]
# Masks, sequence layouts and rotary positions (issue 22): each mask kind x these variants x
# (no positions, rope after the dynamics, rope before them), in double precision.
MASK_VARIANTS = ("standard", "leapfrog", "affine", "diff-leapfrog")
PACKED_SHAPE = dict(B=1, T=12, D=16, H=4, m=8)  # x [1, N, D]: sequences of 5, 1 and 6 tokens
MASKS = [  # (tag, metadata, shape)
    ("causal", {}, cases.MAIN_SHAPE),
    ("bidir", {"causal": "0"}, cases.MAIN_SHAPE),
    ("win3", {"window": "3"}, cases.MAIN_SHAPE),
    ("bidir-win2", {"causal": "0", "window": "2"}, cases.MAIN_SHAPE),
    ("padded", {"lengths": "7,4"}, cases.MAIN_SHAPE),
    ("padded-bidir", {"causal": "0", "lengths": "3,7"}, cases.MAIN_SHAPE),
    ("packed", {"offsets": "0,5,6,12"}, PACKED_SHAPE),
    ("packed-bidir-win2", {"causal": "0", "window": "2", "offsets": "0,5,6,12"}, PACKED_SHAPE),
]
POSITIONS = [("", {}), ("-rope", {"positions": "rope", "rope_base": "100"}),
             ("-rope-first", {"positions": "rope", "rope_base": "100", "rope_order": "rotate-then-dynamics"})]
DEFAULT_SEED = 20240607


class Case:
    """One random case file plus the tool runs made on it."""

    def __init__(self, index, variant, steps, dtype, shape, shape_tag, extra=None, reversible=()):
        self.index = index
        self.variant = variant
        self.steps = steps
        self.dtype = dtype
        self.shape = shape          # dict B, T, D, H, m
        self.shape_tag = shape_tag  # "main" / "alt" / a mask's tag, for the report
        self.extra = extra or {}    # metadata of the mask and positions
        # The fused tool may recompute the dynamics in backward; test both paths for the
        # variants the tool's table calls reversible.
        self.modes = [False, True] if variant in reversible else [False]

    @property
    def name(self):
        return f"{self.index:02d}_{self.variant}_s{self.steps}_{self.dtype}_{self.shape_tag}"


def build_cases(variants, reversible=()):
    """The full case list, in a fixed order (the index also seeds each case). reversible: the
    variants that are also run with --recompute (the tool's table says which)."""
    specs = []
    for variant in reference.VARIANTS:
        for steps in STEPS_MAIN:
            specs.append((variant, steps, "F64", cases.MAIN_SHAPE, "main"))
    for variant in reference.VARIANTS:
        specs.append((variant, STEPS_ALT, "F64", cases.ALT_SHAPE, "alt"))
    for variant, steps in F32_CASES:
        specs.append((variant, steps, "F32", cases.MAIN_SHAPE, "main"))
    for variant in MASK_VARIANTS:
        for tag, meta, shape in MASKS:
            for ptag, pmeta in POSITIONS:
                specs.append((variant, 2, "F64", shape, tag + ptag, {**meta, **pmeta}))
    result = [Case(i, *spec, reversible=reversible) for i, spec in enumerate(specs)]
    if variants:
        result = [case for case in result if case.variant in variants]
    return result


# ----------------------------------------------------------------------------
# Comparison
# ----------------------------------------------------------------------------

ZERO_BY_SYMMETRY = 1e-10


def relative_error(tool, ref, case_scale=0.0):
    """max|tool - ref| / max(max|ref|, 1e-30), computed in float64; inf if tool is not finite."""
    tool = np.asarray(tool, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if ref.size == 0:
        return 0.0
    if not np.all(np.isfinite(tool)):
        return float("inf")
    scale = float(np.max(np.abs(ref)))
    if scale <= ZERO_BY_SYMMETRY * case_scale:
        scale = case_scale  # zero to round-off in the reference: compare on the case's scale
    return float(np.max(np.abs(tool - ref)) / max(scale, 1e-30))


def compare(case_tensors, dtype, out_tensors, ref):
    """Compare a tool output with the reference.

    Returns (errors: dict name -> relative error, problems: list of messages about
    missing/extra tensors or wrong shapes/dtypes).  Tensors with problems get no error.
    """
    expected = cases.expected_output_shapes(case_tensors)
    want_dtype = np.dtype(NUMPY_DTYPE[dtype])
    problems = []
    missing = [name for name in expected if name not in out_tensors]
    extra = sorted(name for name in out_tensors if name not in expected)
    if missing:
        problems.append("missing tensors: " + ", ".join(missing))
    if extra:
        problems.append("unexpected tensors: " + ", ".join(extra))
    errors = {}
    case_scale = max((float(np.max(np.abs(np.asarray(ref[n], dtype=np.float64))))
                      for n in expected if n in ref and np.asarray(ref[n]).size), default=0.0)
    for name, shape in expected.items():
        if name not in out_tensors:
            continue
        value = out_tensors[name]
        if tuple(value.shape) != tuple(shape):
            problems.append(f"{name}: shape {list(value.shape)}, expected {list(shape)}")
            continue
        if value.dtype != want_dtype:
            problems.append(f"{name}: dtype {value.dtype}, expected {want_dtype}")
            continue
        errors[name] = relative_error(value, ref[name], case_scale)
    return errors, problems


def worst(errors):
    """(name, error) of the largest error; NaN counts as the worst."""
    if not errors:
        return "-", float("nan")
    name = max(errors, key=lambda n: float("inf") if np.isnan(errors[n]) else errors[n])
    return name, errors[name]


def passed(errors, problems, dtype):
    return not problems and all(err <= TOLERANCE[dtype] for err in errors.values())


def reference_for(case_tensors, metadata):
    """Reference outputs in float64 from the case's (possibly float32) values."""
    arrays = {name: value.astype(np.float64) for name, value in case_tensors.items()}
    return reference.forward_and_grads(arrays, metadata)


# ----------------------------------------------------------------------------
# Running the tool
# ----------------------------------------------------------------------------

def run_tool(tool, in_path, out_path, recompute, timeout):
    """Run the tool once. Returns None on success, else a message (with the tool's stderr)."""
    if os.path.exists(out_path):
        os.remove(out_path)  # never read a stale output
    command = [tool, in_path, out_path] + (["--recompute"] if recompute else [])
    try:
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"tool timed out after {timeout} s: {' '.join(command)}"
    except OSError as exc:
        return f"could not run the tool: {exc}"
    stderr = proc.stderr.decode("utf-8", errors="replace").rstrip()
    if proc.returncode != 0:
        how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exited with status {proc.returncode}")
        return f"tool {how}: {' '.join(command)}\n--- tool stderr ---\n{stderr}\n---"
    if not os.path.exists(out_path):
        return f"tool exited 0 but wrote no {out_path}\n--- tool stderr ---\n{stderr}\n---"
    return None


def resolve_tool(path):
    """Absolute path of an executable tool, or None."""
    if os.path.isfile(path):
        return os.path.abspath(path) if os.access(path, os.X_OK) else None
    if os.sep not in path:
        return shutil.which(path)
    return None


def tool_table(tool, timeout):
    """The tool's variant table ({name: (has_dynamics, is_reversible)}) from `TOOL --variants`,
    or a message saying why it could not be read."""
    try:
        proc = subprocess.run([tool, "--variants"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"could not run {tool} --variants: {exc}"
    if proc.returncode != 0:
        return None, f"{tool} --variants exited {proc.returncode}: {proc.stderr.strip()}"
    table = {}
    for line in proc.stdout.splitlines():
        fields = line.split("\t")
        if len(fields) != 3 or fields[1] not in ("0", "1") or fields[2] not in ("0", "1"):
            return None, f"{tool} --variants printed an unexpected line {line[:80]!r}"
        table[fields[0]] = (fields[1] == "1", fields[2] == "1")
    if not table:
        return None, f"{tool} --variants printed no variant"
    return table, None


def run_all(args):
    tool = resolve_tool(args.tool)
    if tool is None:
        print(f"ERROR: tool {args.tool!r} not found or not executable", file=sys.stderr)
        print(f"0 passed, {len(build_cases(args.variant))} failed")
        return 1
    table, message = tool_table(tool, args.timeout)
    if table is None:
        print("ERROR: " + message, file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    # Every name of the library's table must have a reference here: a variant added to the table
    # without one fails this test instead of silently getting no parity coverage.
    uncovered = [name for name in table if name not in reference.VARIANTS]
    unknown = [name for name in (args.variant or []) if name not in table]
    reversible = {name for name, (dyn, rev) in table.items() if dyn and rev}
    selected = build_cases(args.variant, reversible)
    total_runs = sum(len(case.modes) for case in selected)

    print(f"parity_test: tool={tool} seed={args.seed} runs={total_runs}")
    tempdir = None
    if args.workdir:
        workdir = os.path.abspath(args.workdir)
        os.makedirs(workdir, exist_ok=True)
    else:
        tempdir = tempfile.TemporaryDirectory(prefix="coupledqk_parity_")
        workdir = tempdir.name

    n_pass = n_fail = 0
    for name in uncovered:
        print(f"FAIL: the tool's variant table has '{name}' but the PyTorch reference "
              f"(tests/parity/reference.py, VARIANTS) does not: add its formulas there")
        n_fail += 1
    for name in unknown:
        print(f"FAIL: --variant {name!r} is not in the tool's table ({', '.join(table)})")
        n_fail += 1
    worst_of = {}  # dtype -> (error, run label, tensor)
    try:
        for case in selected:
            rng = np.random.default_rng([args.seed, case.index])
            case_tensors, metadata = cases.random_case(rng, case.variant, case.steps,
                                                       dtype=case.dtype, **case.shape)
            metadata.update(case.extra)
            in_path = os.path.join(workdir, case.name + ".in.safetensors")
            safetensors_io.write(in_path, case_tensors, metadata)
            ref = reference_for(case_tensors, metadata)

            for recompute in case.modes:
                suffix = ".recompute" if recompute else ""
                out_path = os.path.join(workdir, case.name + suffix + ".out.safetensors")
                label = (f"{case.variant:<15} steps={case.steps} {case.dtype} "
                         f"{case.shape_tag:<4} {'recompute' if recompute else 'default  '}")
                message = run_tool(tool, in_path, out_path, recompute, args.timeout)
                errors, problems = {}, []
                if message is None:
                    try:
                        out_tensors, _ = safetensors_io.read(out_path)
                        errors, problems = compare(case_tensors, case.dtype, out_tensors, ref)
                    except safetensors_io.SafetensorsError as exc:
                        problems = [f"unreadable output: {exc}"]
                else:
                    problems = [message]
                ok = passed(errors, problems, case.dtype)
                name, err = worst(errors)
                if errors and not (worst_of.get(case.dtype, (-1.0,))[0] >= err):
                    worst_of[case.dtype] = (err, label.strip(), name)
                print(f"{label}  worst={name:<12} err={err:.3e}  {'PASS' if ok else 'FAIL'}")
                for problem in problems:
                    print("    " + problem.replace("\n", "\n    "))
                if ok:
                    n_pass += 1
                else:
                    n_fail += 1
                    # Show every tensor over tolerance, not just the worst.
                    for tensor, e in errors.items():
                        if not e <= TOLERANCE[case.dtype]:
                            print(f"    {tensor}: err={e:.3e} > {TOLERANCE[case.dtype]:.0e}")
                sys.stdout.flush()
    finally:
        if tempdir is not None:
            tempdir.cleanup()

    for dtype, (err, label, name) in sorted(worst_of.items()):
        print(f"worst {dtype} error: {err:.3e} ({name}, {' '.join(label.split())})")
    if n_fail and tempdir is not None:
        print("(rerun with --workdir DIR to keep the case and output files)")
    print(f"{n_pass} passed, {n_fail} failed")
    return 1 if n_fail else 0


# ----------------------------------------------------------------------------
# Debugging helpers
# ----------------------------------------------------------------------------

def write_case(args):
    if args.variant is None or len(args.variant) != 1 or args.steps is None:
        print("ERROR: --write-case needs exactly one --variant and --steps", file=sys.stderr)
        return 2
    shape = dict(cases.MAIN_SHAPE)
    if args.shape:
        try:
            values = [int(v) for v in args.shape.split(",")]
        except ValueError:
            values = []
        if len(values) != 5:
            print("ERROR: --shape must be B,T,D,H,m", file=sys.stderr)
            return 2
        shape = dict(zip(("B", "T", "D", "H", "m"), values))
    rng = np.random.default_rng(args.seed)
    case_tensors, metadata = cases.random_case(rng, args.variant[0], args.steps,
                                               layer_index=args.layer_index,
                                               dtype=args.dtype, **shape)
    # Validate the combination (divisibility, even heads...) before writing.
    reference.config_from(case_tensors, metadata)
    safetensors_io.write(args.write_case, case_tensors, metadata)
    print(f"wrote {args.write_case}: {metadata} "
          + " ".join(f"{n}{list(v.shape)}" for n, v in case_tensors.items()))
    return 0


def check(args):
    case_path, out_path = args.check
    case_tensors, metadata = safetensors_io.read(case_path)
    dtype = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32"}[case_tensors["x"].dtype]
    out_tensors, _ = safetensors_io.read(out_path)
    ref = reference_for(case_tensors, metadata)
    errors, problems = compare(case_tensors, dtype, out_tensors, ref)
    print(f"case {case_path}: {metadata} dtype={dtype} tolerance={TOLERANCE[dtype]:.0e}")
    for name in cases.expected_output_shapes(case_tensors):
        if name in errors:
            status = "ok" if errors[name] <= TOLERANCE[dtype] else "FAIL"
            print(f"  {name:<14} {str(list(out_tensors[name].shape)):<14} "
                  f"err={errors[name]:.3e}  {status}")
    for problem in problems:
        print("  " + problem)
    ok = passed(errors, problems, dtype)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tool", help="path of the C++ tool")
    parser.add_argument("--workdir", help="keep case and output files here (default: temp dir)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per tool run")
    parser.add_argument("--variant", action="append", choices=list(reference.VARIANTS),
                        help="restrict the run to this variant (repeatable); "
                             "the variant for --write-case")
    parser.add_argument("--write-case", metavar="PATH")
    parser.add_argument("--steps", type=int, help="steps for --write-case")
    parser.add_argument("--dtype", choices=["F64", "F32"], default="F64",
                        help="dtype for --write-case")
    parser.add_argument("--shape", help="B,T,D,H,m for --write-case (default 2,7,16,4,8)")
    parser.add_argument("--layer-index", type=int, help="layer_index for --write-case")
    parser.add_argument("--check", nargs=2, metavar=("CASE", "OUT"))
    args = parser.parse_args(argv)

    if args.write_case:
        return write_case(args)
    if args.check:
        return check(args)
    if not args.tool:
        parser.error("--tool is required (or use --write-case / --check)")
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
