"""Random test cases (tensors + metadata) for the coupledqk parity tests."""

import numpy as np

import reference

# Default shapes: the main one and an alternative (odd sizes, single differential head).
MAIN_SHAPE = dict(B=2, T=7, D=16, H=4, m=8)
ALT_SHAPE = dict(B=1, T=5, D=12, H=2, m=6)


def _normal(rng, shape, mean=0.0, std=1.0):
    return mean + std * rng.standard_normal(shape)


def random_case(rng, variant, steps, B, T, D, H, m, layer_index=None, dtype="F64"):
    """Random inputs with non-zero dynamics.

    Returns (tensors: dict name -> numpy array of dtype float64/float32, metadata: dict of str).
    F32 cases are drawn in float64 and rounded once, so the reference can use the
    exact float32 values.
    """
    if layer_index is None:
        layer_index = int(rng.integers(0, 4))
    d = D // H
    tensors = {}
    for name, shape in reference.input_shapes(variant, B, T, D, H, m).items():
        leaf = name.split(".")[-1]
        if name in ("x", "dy"):
            value = _normal(rng, shape)
        elif name.startswith(("dyn.k.", "dyn.q.")):  # affine conditioners: O(1) scales and shifts
            value = _normal(rng, shape, std={"A": 1.0 / np.sqrt(d), "a": 0.1, "S": 0.4, "s": 0.2,
                                             "T": 0.4, "t": 0.2}[leaf])
        elif name in ("wq", "wk", "wv", "wo"):
            value = _normal(rng, shape, std=0.3)
        elif leaf in ("F1", "F2", "f1", "f2"):  # the velocity family's force: O(1)
            value = _normal(rng, shape, std={"F1": 1.0 / np.sqrt(d), "F2": 0.5, "f1": 0.1,
                                             "f2": 0.1}[leaf])
        elif leaf in ("W", "U", "Pq1", "Pk1"):
            value = _normal(rng, shape, std=1.0 / np.sqrt(d))  # N(0, 1/d)
        elif leaf in ("a", "c", "Pq2", "Pk2"):
            value = _normal(rng, shape, std=0.5)
        elif leaf in ("b", "e", "pq", "pk"):
            value = _normal(rng, shape, std=0.1)
        elif leaf == "rho":
            value = _normal(rng, shape, mean=0.3, std=0.2)
        elif name in ("lq1", "lk1", "lq2", "lk2"):
            value = _normal(rng, shape, std=0.1)
        elif name == "subln":
            value = 1.0 + _normal(rng, shape, std=0.1)
        else:
            raise AssertionError(f"no distribution for tensor {name!r}")
        tensors[name] = value.astype(np.float32 if dtype == "F32" else np.float64)
    metadata = {"attention": variant, "steps": str(steps), "heads": str(H),
                "m": str(m), "layer_index": str(layer_index)}
    return tensors, metadata


def expected_output_shapes(case_tensors):
    """Ordered dict name -> shape the tool must write: y and grad.<every input but dy>."""
    shapes = {"y": case_tensors["x"].shape}
    for name, value in case_tensors.items():
        if name != "dy":
            shapes["grad." + name] = value.shape
    return shapes
