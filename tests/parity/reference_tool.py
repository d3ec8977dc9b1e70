#!/usr/bin/python3
"""A Python stand-in for the C++ tool, built on the reference implementation.

Usage: reference_tool.py INPUT.safetensors OUTPUT.safetensors [--recompute] [--fault KIND]

It has the same interface as the C++ tool, so `parity_test.py --tool reference_tool.py`
exercises the whole driver without any C++.  --recompute is accepted and ignored.
--fault injects one error so self_test.py can check the driver notices it:
  perturb  y gets a relative error of ~1e-3
  drop     grad.x is missing
  extra    an extra tensor "bogus" is written
  shape    grad.wq is transposed-reshaped to a wrong shape
  dtype    y is written as float32 in an F64 case (or float64 in an F32 case)
  crash    exits with status 3 after writing a message to stderr
"""

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402
import safetensors_io  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("output")
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--fault", choices=["perturb", "drop", "extra", "shape", "dtype", "crash"])
    args = parser.parse_args(argv)

    if args.fault == "crash":
        print("reference_tool: simulated crash", file=sys.stderr)
        return 3
    tensors, metadata = safetensors_io.read(args.input)
    dtype = tensors["x"].dtype
    arrays = {name: value.astype(np.float64) for name, value in tensors.items()}
    outputs = {name: value.astype(dtype)
               for name, value in reference.forward_and_grads(arrays, metadata).items()}

    if args.fault == "perturb":
        outputs["y"] = (outputs["y"] * (1 + 1e-3)).astype(dtype)
    elif args.fault == "drop":
        del outputs["grad.x"]
    elif args.fault == "extra":
        outputs["bogus"] = np.zeros(1, dtype=dtype)
    elif args.fault == "shape":
        outputs["grad.wq"] = outputs["grad.wq"].reshape(-1)
    elif args.fault == "dtype":
        other = np.float32 if dtype == np.float64 else np.float64
        outputs["y"] = outputs["y"].astype(other)

    safetensors_io.write(args.output, outputs, {"producer": "reference_tool.py"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
