"""The case-independent part of a repro bundle's ``repro.py``: load the arrays, run the kernel on
MLX in the recorded mode, judge, print, exit. bundle.py extracts these functions (and what they
use: the MLX backend's array crossing, the harness's compare) into each repro.py with
portable.Extractor, so they must use only numpy, ml_dtypes, mlx and the standard library besides
harness code that extracts cleanly.

:func:`run_on_mlx` follows ``rlx_conformance.backends.mlx.MlxBackend._execute`` (widen to the compute dtypes,
kernel, narrow to the declared dtypes; eager: evaluate after each stage; compiled: mx.compile of
the whole); :func:`run_derivative_on_mlx` follows ``MlxBackend.run_derivative`` (mx.vjp, mx.jvp or
the JVP of the VJP over that same graph; compiled: mx.compile of the whole derivative function).
tests/test_bundle.py checks that each gives the backend's outputs bit for bit.
"""
from __future__ import annotations

import argparse
import json
import math
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from rlx_conformance.backends.mlx import MX_DTYPES, dtype_name, to_mlx, to_mlx_view, to_numpy
from rlx_conformance.core import dtypes as dt
from rlx_conformance.judge.compare import Bound, Comparison, Tolerance, compare

SHOW = 5  # elements beyond tolerance listed per output


def encode(a: np.ndarray) -> np.ndarray:
    """npz without pickle holds no ml_dtypes: bfloat16 is stored as its uint16 bits."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def load_arrays(path: Path, prefix: str, dtypes: Sequence[str | None]) -> list[Any]:
    """Arrays ``<prefix>0, <prefix>1, ...`` of an npz, bfloat16 restored from its bits; None
    where ``dtypes`` says None (a derivative seed that does not exist, not stored)."""
    with np.load(path, allow_pickle=False) as z:
        out: list[Any] = []
        for k, name in enumerate(dtypes):
            if name is None:
                out.append(None)
                continue
            a = z[f"{prefix}{k}"]
            out.append(a.view(dt.np_dtype(name)) if a.dtype.name != name else a)
        return out


def load_optional(path: Path, prefix: str, n: int) -> list[np.ndarray | None]:
    """Judging aids stored beside the expected outputs (error bounds, their order-dependent
    positions and legal outcomes, undefined-input masks)."""
    with np.load(path, allow_pickle=False) as z:
        return [z[f"{prefix}{k}"] if f"{prefix}{k}" in z.files else None for k in range(n)]


def bound_of(aux: dict[str, list[np.ndarray | None]], k: int) -> Bound | None:
    """Output k's error bound as compare() takes it (with its order-dependent positions)."""
    b = aux["bound"][k]
    if b is None:
        return None
    free = (aux.get("free") or [None] * (k + 1))[k]
    return Bound(b) if free is None else Bound(b, free, aux["allow"][k])


def _graph(kernel: Callable[..., Any], attrs: dict[str, Any], compute_dtypes: Sequence[str],
           out_dtypes: Sequence[str], mode: str) -> Callable[..., list[Any]]:
    """widen to the compute dtypes → kernel → narrow to the declared dtypes (eager: evaluate
    after each stage), as the MLX backend's graph."""
    def graph(*args):
        wide = [a.astype(MX_DTYPES[c]) if dtype_name(a) != c else a for a, c in zip(args, compute_dtypes)]
        if mode == "eager":
            mx.eval(wide)
        res = kernel(*wide, **attrs)
        res = list(res) if isinstance(res, (tuple, list)) else [res]
        if mode == "eager":
            mx.eval(res)
        return [r.astype(MX_DTYPES[d]) if dtype_name(r) != d else r for r, d in zip(res, out_dtypes)]
    return graph


def run_on_mlx(kernel: Callable[..., Any], inputs: Sequence[np.ndarray], attrs: dict[str, Any],
               in_dtypes: Sequence[str], compute_dtypes: Sequence[str], out_dtypes: Sequence[str],
               stream: str, mode: str, layouts: Sequence[str] | None = None) -> list[np.ndarray]:
    """The kernel on MLX as the harness's MLX backend runs it, outputs back as numpy arrays;
    ``layouts``: each input's memory layout (the view to_mlx_view builds from its buffer; None
    or "": contiguous)."""
    with mx.stream(mx.cpu if stream == "cpu" else mx.gpu):
        lays = list(layouts or [""] * len(inputs))
        args = [to_mlx_view(x, d, lay) for x, d, lay in zip(inputs, in_dtypes, lays)]
        graph = _graph(kernel, attrs, compute_dtypes, out_dtypes, mode)
        fn = mx.compile(graph) if mode == "compiled" else graph
        res = fn(*args)
        mx.eval(res)
    return [to_numpy(r) for r in res]


def run_derivative_on_mlx(kernel: Callable[..., Any], inputs: Sequence[np.ndarray], attrs: dict[str, Any],
                          in_dtypes: Sequence[str], compute_dtypes: Sequence[str], out_dtypes: Sequence[str],
                          stream: str, mode: str, kind: str, diff: Sequence[int], floats: Sequence[int],
                          cotangents: Sequence[np.ndarray | None], tangents: Sequence[np.ndarray | None]
                          ) -> list[np.ndarray | None]:
    """The kernel's derivative on MLX as the harness's MLX backend takes it: ``kind`` vjp
    (mx.vjp: one result per input, None where not in ``diff``), jvp (mx.jvp: one per output,
    None where not in ``floats``, the floating outputs) or hvp (the JVP of the VJP: one per
    input), seeded with the recorded cotangents (per output) and tangents (per input)."""
    with mx.stream(mx.cpu if stream == "cpu" else mx.gpu):
        args = [to_mlx(x, d) for x, d in zip(inputs, in_dtypes)]
        cots = [to_mlx(cotangents[k], out_dtypes[k]) for k in floats] if kind in ("vjp", "hvp") else []
        tans = [to_mlx(tangents[k], in_dtypes[k]) for k in diff] if kind in ("jvp", "hvp") else []
        fixed = [a for k, a in enumerate(args) if k not in diff]
        graph = _graph(kernel, attrs, compute_dtypes, out_dtypes, mode)

        def derivative(*flat):
            primals = list(flat[:len(diff)])
            consts, seeds = flat[len(diff):len(diff) + len(fixed)], list(flat[len(diff) + len(fixed):])

            def f(*p):
                it_p, it_c = iter(p), iter(consts)
                res = graph(*[next(it_p) if k in diff else next(it_c) for k in range(len(args))])
                return [res[k] for k in floats]
            if kind == "vjp":
                return mx.vjp(f, primals, seeds)[1]
            if kind == "jvp":
                return mx.jvp(f, primals, seeds)[1]
            c, t = seeds[:len(floats)], seeds[len(floats):]
            return mx.jvp(lambda *q: mx.vjp(f, list(q), c)[1], primals, t)[1]

        fn = mx.compile(derivative) if mode == "compiled" else derivative
        res = fn(*[args[k] for k in diff], *fixed, *cots, *tans)
        mx.eval(res)
    places = floats if kind == "jvp" else diff
    out: list[np.ndarray | None] = [None] * (len(out_dtypes) if kind == "jvp" else len(args))
    for k, r in zip(places, res):
        out[k] = to_numpy(r)
    return out


def run_graph_on_mlx(kernels: dict[str, Callable[..., Any]], node_attrs: Sequence[dict[str, Any]],
                     graph: dict[str, Any], inputs: Sequence[np.ndarray], mode: str) -> list[np.ndarray]:
    """A graph (case.json ``run.graph``: its input names and dtypes, its nodes in order, each with
    its op, the names it reads, its compute and output dtypes; its outputs) on MLX as
    ``MlxBackend.run_graph`` runs it: one function over the nodes' kernels (``kernels`` by op),
    each node widen → kernel → narrow; eager evaluates after every node, lazy once at the end,
    compiled runs mx.compile of the whole function."""
    def function(*args):
        env = dict(zip(graph["inputs"], args))
        for n, attrs in zip(graph["nodes"], node_attrs):
            res = _graph(kernels[n["op"]], attrs, n["compute_dtypes"], n["out_dtypes"], "lazy")(
                *[env[x] for x in n["inputs"]])
            if mode == "eager":
                mx.eval(res)
            env[n["name"]] = res[0]
            for k, r in enumerate(res[1:], 1):
                env[f"{n['name']}#{k}"] = r
        return [env[o] for o in graph["outputs"]]

    with mx.stream(mx.cpu if graph["stream"] == "cpu" else mx.gpu):
        args = [to_mlx(x, d) for x, d in zip(inputs, graph["in_dtypes"])]
        fn = mx.compile(function) if mode == "compiled" else function
        res = fn(*args)
        mx.eval(res)
    return [to_numpy(r) for r in res]


def judge_outputs(case: dict[str, Any], inputs: list[np.ndarray], expected: list[np.ndarray],
                  actual: list[np.ndarray], aux: dict[str, list[np.ndarray | None]],
                  check: Callable[..., list[Comparison]] | None,
                  judge_attrs: dict[str, Any]) -> list[Comparison]:
    """The harness's verdict: the op's own judge, or compare() per output with the recorded policy
    (tolerance, error bound, undefined-input mask)."""
    with np.errstate(all="ignore"):
        if check is not None:
            return check(inputs, judge_attrs, expected, actual)
        if len(actual) != len(expected):
            return [Comparison(False, message=f"{len(actual)} outputs, expected {len(expected)}")]
        comps = []
        for k, (e, a, p) in enumerate(zip(expected, actual, case["judge"]["outputs"])):
            name = p.get("name") or f"output {k}"
            if a is None:  # a derivative the backend did not give
                comps.append(Comparison(False, message=f"{name}: no result"))
                continue
            comps.append(compare(e, a, exact=p["exact"], signed_zero=p["signed_zero"],
                                 tol=Tolerance(**p["tolerance"]), bound=bound_of(aux, k),
                                 skip=aux["skip"][k], name=name))
        return comps


def beyond_tolerance(e: np.ndarray, a: np.ndarray, p: dict[str, Any], bound: np.ndarray | Bound | None,
                     skip: np.ndarray | None, limit: int = SHOW) -> list[str]:
    """The first elements that fail the comparison on their own, one line each."""
    if e.shape != a.shape or e.dtype != a.dtype:
        return []
    ef, af = e.reshape(-1), a.reshape(-1)
    b = Bound.of(bound)
    bf = None if b is None else b.map(lambda v: np.broadcast_to(v, e.shape).reshape(-1))
    sf = None if skip is None else np.broadcast_to(skip, e.shape).reshape(-1)
    with np.errstate(all="ignore"):
        e64, a64 = ef.astype(np.float64), af.astype(np.float64)
        differ = ~((e64 == a64) | (np.isnan(e64) & np.isnan(a64))) | (np.signbit(e64) != np.signbit(a64))
        lines = []
        for i in np.flatnonzero(differ)[:2000]:
            c = compare(ef[i:i + 1], af[i:i + 1], exact=p["exact"], signed_zero=p["signed_zero"],
                        tol=Tolerance(**p["tolerance"]),
                        bound=None if bf is None else bf.map(lambda v, i=i: v[i:i + 1]),
                        skip=None if sf is None else sf[i:i + 1])
            if not c.ok:
                idx = tuple(int(v) for v in np.unravel_index(i, e.shape)) if e.shape else ()
                lines.append(f"    at {idx}: expected {ef[i]!r}, got {af[i]!r} (abs {c.max_abs_err:.3g}, "
                             f"rel {c.max_rel_err:.3g}, ulp {c.max_ulp:g})")
                if len(lines) >= limit:
                    break
    return lines


def _call(here: Path, case: dict[str, Any], kernel: Callable[..., Any], kernel_attrs: dict[str, Any],
          inputs: list[np.ndarray]) -> list[np.ndarray | None]:
    """The recorded MLX call: the forward, or (case.json ``grad``) the derivative with the seeds
    of seeds.npz, as the list of the results the expected ones stand for."""
    run = case["run"]
    if run.get("graph"):  # a graph case's minimal graph: kernels by op, attributes per node
        return list(run_graph_on_mlx(kernel, kernel_attrs, run["graph"], inputs, case["mode"]))
    if not case.get("grad"):
        return list(run_on_mlx(kernel, inputs, kernel_attrs, run["in_dtypes"], run["compute_dtypes"],
                               run["out_dtypes"], run["stream"], case["mode"], run.get("layouts")))
    g = run["grad"]
    seeds = {kind: load_arrays(here / "seeds.npz", kind[:3], dtypes) for kind, dtypes in case["seeds"].items()}
    res = run_derivative_on_mlx(kernel, inputs, kernel_attrs, run["in_dtypes"], run["compute_dtypes"],
                                run["out_dtypes"], run["stream"], case["mode"], case["grad"], g["diff"],
                                g["floats"], seeds["cotangents"], seeds["tangents"])
    return [res[k] for k in g["results"]]


def main(here: Path, kernel: Callable[..., Any], kernel_attrs: dict[str, Any],
         check: Callable[..., list[Comparison]] | None, judge_attrs: dict[str, Any]) -> int:
    """repro.py's entry point: 0 when MLX now agrees with the expected outputs, 1 while it does not
    (or raises); a crash kills the process, as it killed the harness's worker. A derivative
    case's expected outputs are the reference derivative's results (case.json ``grad``)."""
    case = json.loads((here / "case.json").read_text())
    ap = argparse.ArgumentParser(description=f"Reproduce {case['id']} on MLX (exit 1 while it fails).")
    ap.add_argument("--save", metavar="NPZ", help="write MLX's outputs to this .npz (bfloat16 as uint16 bits)")
    ap.add_argument("--timeout", type=float, default=case.get("timeout_s") or 0,
                    help="kill the process (SIGALRM) after this many seconds; 0: never (default: the run's)")
    args = ap.parse_args()
    ins, outs = case["inputs"], case["outputs"]
    inputs = load_arrays(here / "inputs.npz", "in", [x["dtype"] for x in ins])
    expected = load_arrays(here / "expected.npz", "out", [x["dtype"] for x in outs])
    aux = {k: load_optional(here / "expected.npz", k, len(outs)) for k in ("bound", "skip", "free", "allow")}
    run = case["run"]
    print(f"case     {case['id']}")
    print(f"recorded {case['outcome']}: {case['message'].splitlines()[0] if case['message'] else ''}")
    print(f"versions recorded mlx {case['versions'].get('mlx')}, numpy {case['versions'].get('numpy')}; "
          f"now mlx {mx.__version__}, numpy {np.__version__}")
    if case["device"] == "gpu" and not mx.is_available(mx.gpu):
        print("this machine has no MLX GPU device; the case needs one")
        return 2
    what = f"the {case['grad']} of {case['op']}" if case.get("grad") else case["op"]
    views = [f"input {k} {lay}" for k, lay in enumerate(run.get("layouts") or []) if lay]
    print(f"running  {what} on MLX {case['device']} (stream {run['stream']}), {case['mode']} mode"
          + (f", inputs as views: {', '.join(views)}" if views else "") + " ...", flush=True)
    if args.timeout and hasattr(signal, "alarm"):
        signal.alarm(math.ceil(args.timeout))  # SIGALRM's default action ends a native hang too
    try:
        actual = _call(here, case, kernel, kernel_attrs, inputs)
    except Exception as e:  # noqa: BLE001 — a raising kernel is a reproduced error
        import traceback

        traceback.print_exc()
        print(f"STILL FAILS: the MLX call raised {type(e).__name__}: {e}")
        return 1
    finally:
        if args.timeout and hasattr(signal, "alarm"):
            signal.alarm(0)
    if args.save:
        np.savez(args.save, **{f"out{k}": encode(a) for k, a in enumerate(actual) if a is not None})
    comps = judge_outputs(case, inputs, expected, actual, aux, check, judge_attrs)
    ok = all(c.ok for c in comps)
    for k, c in enumerate(comps):
        print(f"  {'ok  ' if c.ok else 'FAIL'} " + (c.message or f"output {k}: max abs {c.max_abs_err:.3g}, "
                                                   f"max rel {c.max_rel_err:.3g}, max ulp {c.max_ulp:g}"))
        if not c.ok and check is None and k < len(expected) and actual[k] is not None:
            lines = beyond_tolerance(expected[k], actual[k], case["judge"]["outputs"][k],
                                     bound_of(aux, k), aux["skip"][k])
            if lines:
                print("  first elements beyond tolerance:")
                print("\n".join(lines))
    print("FIXED: MLX agrees with the expected outputs" if ok
          else "STILL FAILS: MLX disagrees with the expected outputs")
    return 0 if ok else 1
