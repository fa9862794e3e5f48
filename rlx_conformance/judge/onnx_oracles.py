"""The ONNX oracles: independent implementations of the ONNX custom ops, onnx.reference (the
ONNX project's Python reference evaluator) and onnxruntime, both optional. Used by the ONNX
oracle tests and by the judges: when the CPU reference and a backend disagree on an ONNX op,
:func:`verdict` says which side the ONNX implementations agree with. (Not the precise oracle,
precise.py, which computes the correctly rounded value of floating ops with MPFR.)

onnx and onnxruntime are optional dependencies: they are imported where a model is built or run,
so that the harness imports without them (:func:`available` says which are installed).

Known oracle quirks (as of onnx 1.23), which is why a verdict reports each oracle separately:
onnx.reference's ScatterElements max/min use Python's max/min (a NaN update is ignored, a NaN
already in the output stays), while its ScatterND uses np.maximum (NaN propagates); its
GatherElements wraps out-of-range indices (np.choose mode="wrap"), rejects indices smaller than
data on non-axis dims (data is cut to the indices' extent there before the call, which leaves
every gathered value in place) and mishandles a negative axis (normalised before the call).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx_conformance.judge.compare import Tolerance, compare

ONNX_OPS = {  # harness name -> (ONNX op type, opset)
    "onnx.ScatterElements": ("ScatterElements", 18),
    "onnx.GatherND": ("GatherND", 13),
    "onnx.ScatterND": ("ScatterND", 18),
    "onnx.GatherElements": ("GatherElements", 13),
}


def available() -> dict[str, bool]:
    out = {}
    for mod in ("onnx", "onnxruntime"):
        try:
            __import__(mod)
            out[mod] = True
        except ImportError:
            out[mod] = False
    return out


def _onnx_attrs(op: str, attrs: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(attrs)
    if "reduction" in out:
        out["reduction"] = str(out["reduction"])
    return out


def model(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any], out_shape=None):
    """A one-node ONNX model of the op (input names x0, x1, ...; output y)."""
    # optional dependency, imported where needed (module docstring)
    from onnx import helper

    op_type, opset = ONNX_OPS[op]
    names = [f"x{k}" for k in range(len(inputs))]
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))
           for n, x in zip(names, inputs)]
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(inputs[0].dtype),
                                        None if out_shape is None else list(out_shape))
    node = helper.make_node(op_type, names, ["y"], **_onnx_attrs(op, attrs))
    graph = helper.make_graph([node], f"{op_type}_oracle", ins, [out])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = min(m.ir_version, 10)  # onnxruntime releases lag the newest IR version
    return m


def run_onnx_reference(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator  # optional dependency

    if "axis" in attrs and inputs[0].ndim:  # its GatherElements slices shapes with axis + 1
        attrs = {**attrs, "axis": attrs["axis"] % inputs[0].ndim}
    if op == "onnx.GatherElements":  # it needs equal non-axis dims: cut data to the indices'
        data, idx = inputs           # extent there, which leaves every gathered value in place
        ax = attrs["axis"]
        data = data[tuple(slice(None) if d == ax else slice(0, n) for d, n in enumerate(idx.shape))]
        inputs = [data, idx]
    sess = ReferenceEvaluator(model(op, inputs, attrs))
    (y,) = sess.run(None, {f"x{k}": x for k, x in enumerate(inputs)})
    return np.asarray(y)


def run_onnxruntime(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    import onnxruntime as ort  # optional dependency

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    ort.set_default_logger_severity(4)
    sess = ort.InferenceSession(model(op, inputs, attrs).SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    (y,) = sess.run(None, {f"x{k}": x for k, x in enumerate(inputs)})
    return np.asarray(y)


ONNX_ORACLES: dict[str, Callable[..., np.ndarray]] = {
    "onnx.reference": run_onnx_reference,
    "onnxruntime": run_onnxruntime,
}


def _exact(x: np.ndarray, y: np.ndarray) -> bool:
    return compare(x, y, exact=True, signed_zero=False, tol=Tolerance()).ok


def verdict(op: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any],
            expected: np.ndarray, actual: np.ndarray,
            same: Callable[[np.ndarray, np.ndarray], bool] | None = None,
            sides: tuple[str, str] = ("CPU reference", "target")) -> str:
    """Which of ``expected`` (the CPU reference) and ``actual`` (the backend under test) each
    ONNX oracle agrees with, judged by ``same`` (default: bit-exact), as one line."""
    if op not in ONNX_OPS:
        return f"no ONNX oracle for {op}"
    same = same or _exact
    parts = []
    for name, fn in ONNX_ORACLES.items():
        try:
            y = fn(op, [np.asarray(x) for x in inputs], attrs)
        except ImportError:
            parts.append(f"{name}: not installed")
            continue
        except Exception as e:  # noqa: BLE001 — an oracle that rejects the input is a verdict too
            parts.append(f"{name}: rejects the input ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            continue
        if y.shape != expected.shape or y.dtype != expected.dtype:
            parts.append(f"{name}: returns {y.dtype}{list(y.shape)}, not comparable")
            continue
        agree = [s for s, v in zip(sides, (expected, actual)) if same(y, v)]
        parts.append(f"{name} agrees with " + (" and ".join(agree) if agree else "neither"))
    return "; ".join(parts)
