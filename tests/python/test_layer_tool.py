#!/usr/bin/python3
"""The torch module against the library's C++ layer tool (coupledqk-layer) on the same parameters.

Each case is a random layer-tool case file (tests/parity/cases.py, written by the parity test's own
safetensors writer): the tool runs it; the module is loaded from the same file with
CoupledAttention.from_safetensors and runs forward and backward on the file's x and dy. Output and
every gradient must agree to 1e-12 (float64; relative to max(max|tool|, 1)). Every variant at steps
1 and 3, memory="recompute" for the reversible ones, and two float32 cases.

    test_layer_tool.py --tool build/examples/coupledqk-layer
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "parity"))
import cases  # noqa: E402
import safetensors_io  # noqa: E402

import coupledqk  # noqa: E402
from harness import main as run_tests  # noqa: E402

# float32: a few hundred ulps of slack, as the package is compiled with AVX2 + FMA and the tool may not be.
TOLERANCE = {"F64": 1e-12, "F32": 2e-5}
TOOL = None
WORK = None


def run_tool(case_path, recompute):
    out_path = case_path.replace(".safetensors", ".out.safetensors")
    cmd = [TOOL, case_path, out_path] + (["--recompute"] if recompute else [])
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed: {done.stderr}"
    tensors, _ = safetensors_io.read(out_path)
    return tensors


def module_outputs(case_path, recompute):
    """y, grad.x and grad.<name> of sum(y * dy) from the module loaded from the case file."""
    layer = coupledqk.CoupledAttention.from_safetensors(case_path, memory="recompute" if recompute else "store")
    data = coupledqk.load_file(case_path)
    x = data["x"].clone().requires_grad_(True)
    y = layer(x)
    y.backward(data["dy"])
    out = {"y": y.detach(), "grad.x": x.grad}
    out.update({"grad." + n: layer.get_parameter(n).grad for n in layer.parameter_names()})
    return out


def compare(case_path, dtype, recompute=False):
    expected = run_tool(case_path, recompute)
    got = module_outputs(case_path, recompute)
    assert sorted(got) == sorted(expected), (sorted(got), sorted(expected))
    worst = 0.0
    for name, ref in expected.items():
        ref = np.asarray(ref, dtype=np.float64)
        value = got[name].double().numpy()
        assert value.shape == ref.shape, (name, value.shape, ref.shape)
        err = float(np.max(np.abs(value - ref))) / max(float(np.max(np.abs(ref))), 1.0)
        assert err <= TOLERANCE[dtype], f"{case_path}: {name} differs from the C++ layer by {err:.3g}"
        worst = max(worst, err)
    return worst


def write_case(variant, steps, dtype, seed):
    rng = np.random.default_rng(seed)
    tensors, meta = cases.random_case(rng, variant, steps, dtype=dtype, **cases.MAIN_SHAPE)
    path = os.path.join(WORK, f"{variant}_s{steps}_{dtype}.safetensors")
    safetensors_io.write(path, tensors, meta)
    return path


def test_every_variant_equals_the_cpp_layer():
    worst = 0.0
    for i, variant in enumerate(coupledqk.variants()):
        for steps in (1, 3):
            worst = max(worst, compare(write_case(variant, steps, "F64", 100 * i + steps), "F64"))
    print(f"     largest difference: {worst:.3g}")


def test_recompute_equals_the_cpp_layer():
    for i, variant in enumerate(coupledqk.variants()):
        if coupledqk.variant_info(variant)["is_reversible"]:
            compare(write_case(variant, 3, "F64", 7000 + i), "F64", recompute=True)


def test_float32_equals_the_cpp_layer():
    for variant, steps in (("leapfrog", 3), ("diff-affine", 2)):
        path = write_case(variant, steps, "F32", 31)
        assert coupledqk.CoupledAttention.from_safetensors(path).wq.dtype == torch.float32
        compare(path, "F32")


def test_module_saves_a_file_the_tool_reads():
    # The other direction: a module (the library's own init, non-zero dynamics) writes its state_dict
    # and metadata; the C++ tool runs that file.
    torch.manual_seed(3)
    layer = coupledqk.CoupledAttention(16, 4, "uncoupled", 2, hidden=8, layer_index=2, dynamics_init_scale=0.3,
                                       dtype=torch.float64)
    path = os.path.join(WORK, "from_module.safetensors")
    layer.save_safetensors(path)
    back = coupledqk.CoupledAttention.from_safetensors(path)
    assert back.state_dict().keys() == layer.state_dict().keys()
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), layer.state_dict().values()))
    tensors = {n: t.numpy() for n, t in coupledqk.load_file(path).items()}
    tensors["x"], tensors["dy"] = np.random.default_rng(5).standard_normal((2, 2, 7, 16))
    safetensors_io.write(path, tensors, layer.metadata())
    compare(path, "F64")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True, help="path of the coupledqk-layer executable")
    args = ap.parse_args()
    TOOL = args.tool
    with tempfile.TemporaryDirectory(prefix="coupledqk-python-") as WORK:
        run_tests(globals())
