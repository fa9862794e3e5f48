"""The MLX backend: mlx.core on the CPU or a GPU, in the RLX MLX backend's three modes.

* eager: evaluate after each stage of the op (widen, kernel, narrow), as RLX evaluates per node;
* lazy: build the whole graph and evaluate once;
* compiled: ``mx.compile`` of the whole function, cached per (op, attributes, dtypes, stream).

Inputs cross into MLX with explicit dtypes, outputs leave through exact views (bfloat16 as raw
bits). On a GPU device, float64 operands and ops flagged ``cpu_stream`` (linalg) run on the CPU
stream, never at another precision; the result records which stream ran.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from rlx_conformance.backends._loader import load_kernel_modules
from rlx_conformance.backends.mlx import _jit_pch, _nvrtc_pch
from rlx_conformance.backends.base import (
    Backend,
    KernelEntry,
    _as_list,
    check_inputs_unchanged,
    check_outputs,
    compute_dtypes,
    differentiable_arrays,
    prevalidate,
)
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import SpecError, UnsupportedError
from rlx_conformance.generate.layouts import layout_buffer, layout_view
from rlx_conformance.ops import get_op, graphs
from rlx_conformance.spec.registry import OpSpec, OutSpec

MX_DTYPES = {
    "float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16, "float64": mx.float64,
    "int8": mx.int8, "int16": mx.int16, "int32": mx.int32, "int64": mx.int64, "uint8": mx.uint8,
    "uint32": mx.uint32, "bool": mx.bool_,
}
_NAMES = {v: k for k, v in MX_DTYPES.items()}
MODES = ("eager", "lazy", "compiled")


def dtype_name(a: mx.array) -> str:
    try:
        return _NAMES[a.dtype]
    except KeyError:
        raise ValueError(f"MLX dtype {a.dtype} is outside the harness's dtype list") from None


def to_mlx(x: np.ndarray, dtype: str) -> mx.array:
    """numpy → MLX with the dtype given explicitly (mx.array would turn float64 into float32)."""
    return mx.array(x, dtype=MX_DTYPES[dtype])


def to_mlx_view(x: np.ndarray, dtype: str, layout: str) -> mx.array:
    """numpy → an MLX view in memory layout ``layout`` (layouts.LAYOUTS; "" contiguous) holding
    ``x``'s values: the buffer (layouts.layout_buffer) crosses into MLX as it is, then MLX's own
    view ops (swapaxes, stepped and negative-step slices, broadcast_to) make the view, outside
    any compiled function, so that the kernel (and mx.compile's trace) gets the strided input."""
    if not layout:
        return to_mlx(x, dtype)
    return layout_view(to_mlx(layout_buffer(x, layout), dtype), layout, x.shape, mx)


def to_numpy(a: mx.array) -> np.ndarray:
    """MLX → numpy, exactly; bfloat16 goes through its bits (numpy has no PEP 3118 bfloat16)."""
    if a.dtype == mx.bfloat16:
        return np.array(a.view(mx.uint16)).view(dt.np_dtype("bfloat16"))
    return np.array(a)


# The C++ compiler MLX's CPU build runs to JIT-compile a compiled function's fused kernels. MLX
# probes it (`g++ --version`) and, where it is missing, runs every compiled graph unfused without
# a word (measured with a PATH lacking g++, issue 18): the compiled mode's fused kernels then go
# untested while every case still passes.
CPU_JIT_COMPILER = "g++"


def mode_from_env(mode: str | None = None) -> str:
    """The option, else RLX_MLX_MODE (as RLX reads it, case-insensitive), else compiled."""
    if mode:
        return mode
    env = os.environ.get("RLX_MLX_MODE", "").lower()
    return env if env in MODES else "compiled"


class MlxBackend(Backend):
    name = "mlx"
    modes = MODES
    # No FTZ: MLX documents no flush-to-zero mode, and its CPU build keeps subnormals in plain
    # arithmetic (1e-40 * 1 = 1e-40, 2.8e-45 = 1e-45 + 1e-45, measured on 0.32.4). The subnormal
    # losses of its exp-based kernels are accuracy findings (cases/known_divergences.toml).
    ftz_devices: frozenset[str] = frozenset()
    layouts = "views"  # run(layout=...) hands the kernel views (to_mlx_view)

    def __init__(self) -> None:
        super().__init__()
        self._compiled: dict[Any, Any] = {}

    @property
    def default_mode(self) -> str:  # type: ignore[override]
        return mode_from_env()

    def all_devices(self) -> tuple[str, ...]:
        return ("cpu", "gpu")

    def devices(self) -> list[str]:
        return ["cpu"] + (["gpu"] if mx.is_available(mx.gpu) else [])

    def warm_up(self, devices: Iterable[str]) -> None:
        """One small evaluation on each of ``devices`` that this machine has: on MLX's CUDA build
        the CUDA context and MLX's device start there (about 1-4 s a process on an H100 host with
        15 workers starting), before the worker takes its first case."""
        for d in devices:
            if d in self.devices():
                mx.eval(mx.zeros((1,), stream=mx.gpu if d == "gpu" else mx.cpu))

    def stream_for(self, entry: KernelEntry, dtypes: list[str], device: str) -> str:
        """Which stream runs a call: float64 and cpu_stream kernels stay on the CPU."""
        if device == "gpu" and ("float64" in dtypes or entry.options.get("cpu_stream")):
            return "cpu"
        return device

    # TF32: on CUDA MLX runs float32 matmul and convolution (and what is built on them) with
    # TF32 tensor cores unless MLX_ENABLE_TF32=0, read once per process. float16/bfloat16 cases
    # compute in float32 here, so they are affected too. On a GPU their cases run as variant
    # tf32:on or tf32:off (the case id says which); --tf32 both runs each case both ways.
    TF32_OPS = ("mat_mul", "dot_general", "conv", "conv_transpose2d", "attention", "conv2d_backward_input",
                "conv2d_backward_weight")
    TF32_ENV = "MLX_ENABLE_TF32"

    def _tf32_affects(self, op: str) -> bool:
        """Whether TF32 changes ``op``'s numerics: one of TF32_OPS, or a graph case (``graph:NAME``)
        with a node of one (its float32 matmul runs under the same setting)."""
        if op.startswith(graphs.PREFIX):
            return any(n.op in self.TF32_OPS for n in graphs.get_graph(op).nodes)
        return op in self.TF32_OPS

    def variants(self, op: str, dtype: str, device: str, option: str | None = None) -> list[str]:
        if device != "gpu" or dt.compute_dtype(dtype) != "float32" or not self._tf32_affects(op):
            return [""]
        if option in (None, "env"):  # the setting the workers inherit
            option = "off" if os.environ.get(self.TF32_ENV, "1").strip() == "0" else "on"
        try:
            return {"on": ["tf32:on"], "off": ["tf32:off"], "both": ["tf32:on", "tf32:off"]}[option]
        except KeyError:
            raise SpecError(f"mlx: --tf32 takes on, off or both, not {option!r}") from None

    def environment_warnings(self, targets) -> list[str]:
        """A compiled-mode CPU target on a machine without the C++ compiler MLX JIT-compiles its
        fused kernels with (CPU_JIT_COMPILER): a green run there did not test them."""
        if not any(t.device == "cpu" and t.mode == "compiled" for t in targets) or shutil.which(CPU_JIT_COMPILER):
            return []
        return [f"no {CPU_JIT_COMPILER} on PATH: MLX's compiled mode on the CPU runs every graph unfused "
                "there, so its fused kernels go untested (install a C++ compiler)"]

    def worker_env(self) -> dict[str, str]:
        """PATH with a g++ that compiles the CPU JIT's kernels with a precompiled MLX preamble:
        the same kernels, 4x faster to build (_jit_pch.py); with MLX's CUDA build, NVRTC's
        precompiled headers for the CUDA JIT, a quarter less NVRTC time (_nvrtc_pch.py)."""
        return {**_jit_pch.worker_env(), **_nvrtc_pch.worker_env()}

    def variant_env(self, variant: str) -> dict[str, str]:
        return {"tf32:on": {self.TF32_ENV: "1"}, "tf32:off": {self.TF32_ENV: "0"}}.get(variant, {})

    def _execute(self, entry: KernelEntry, spec: OpSpec, inputs: list[np.ndarray],
                 in_dtypes: list[str], attrs: dict[str, Any], outs: list[OutSpec] | None, device: str,
                 mode: str, layout: Sequence[str] | None = None) -> list[np.ndarray]:
        """``layout``: each input's memory layout (to_mlx_view); None, all contiguous. A float16
        or bfloat16 input of an op computed in float32 is widened by an astype of the view (a
        strided read), so the op's own kernel gets a contiguous copy there."""
        cdts = compute_dtypes(spec, in_dtypes)
        lays = list(layout) if layout else [""] * len(inputs)
        out_dtypes = [d for _, d in outs] if outs is not None else []
        # Contributed kernels: the graph also returns the inputs as the kernel left them, compared
        # with the pristine inputs below (in compiled mode a write to an input is invisible outside
        # the traced function otherwise).
        check = outs is not None and bool(entry.options.get("check_inputs"))
        stream = mx.cpu if self.stream_for(entry, in_dtypes + out_dtypes, device) == "cpu" else mx.gpu
        with mx.stream(stream):
            args = [to_mlx_view(x, d, lay) for x, d, lay in zip(inputs, in_dtypes, lays)]
            if mode == "compiled":
                # Keyed by shapes too: the traced graph bakes in the declared output shapes; and
                # by layout, so that each layout is traced afresh as a model's first call is.
                key = (spec.name, repr(sorted(attrs.items())), tuple(in_dtypes),
                       tuple(x.shape for x in inputs), str(stream), id(entry.fn), outs is None, check,
                       tuple(lays))
                fn = self._compiled.get(key)
                if fn is None:
                    fn = self._compiled[key] = mx.compile(self._graph(entry, spec, attrs, cdts, outs, None, check))
                res = fn(*args)
                mx.eval(res)
            elif mode in ("eager", "lazy"):
                res = self._graph(entry, spec, attrs, cdts, outs, mx.eval if mode == "eager" else None,
                                  check)(*args)
                mx.eval(res)
            else:
                raise SpecError(f"mlx: unknown mode {mode!r}")
        res = [to_numpy(r) for r in res]
        if check:
            res, seen = res[:len(res) - len(inputs)], res[len(res) - len(inputs):]
            pristine = [x.astype(dt.np_dtype(c)) if c != d else x for x, d, c in zip(inputs, in_dtypes, cdts)]
            check_inputs_unchanged(self.name, spec, pristine, seen)
        return res

    def run_derivative(self, op: str, kind: str, inputs: Sequence[np.ndarray],
                       attrs: Mapping[str, Any] | None, cotangents: Sequence[np.ndarray | None],
                       tangents: Sequence[np.ndarray | None], device: str = "cpu",
                       mode: str | None = None) -> list[np.ndarray | None]:
        """``op``'s derivative through the same kernel graph :meth:`run` evaluates (widen →
        kernel → narrow), by MLX's own transforms: ``mx.vjp`` (kind vjp: one result per input,
        None for a non-differentiable one), ``mx.jvp`` (jvp: one per output, None for a
        non-floating one) or the JVP of the VJP (hvp: one per input). A kernel made with
        ``mx.custom_function`` brings its own VJP/JVP; MLX differentiates through any other.
        eager evaluates after each stage of the forward graph and the derivative; lazy builds the
        whole derivative graph once; compiled runs ``mx.compile`` over the whole derivative
        function (cached like the forward's)."""
        spec = get_op(op)
        mode = mode or self.default_mode
        if mode not in self.modes:
            raise SpecError(f"{self.name}: unknown mode {mode!r} (modes: {', '.join(self.modes)})")
        if device not in self.devices():
            raise UnsupportedError(f"{self.name}: device {device!r} is not available on this machine")
        arrays, in_dtypes, res_attrs, outs = prevalidate(spec, inputs, attrs)
        entry = self.entry(op)
        cdts = compute_dtypes(spec, in_dtypes)
        diff = [k for k, d in enumerate(differentiable_arrays(spec, len(arrays))) if d]
        floats = [k for k, (_, d) in enumerate(outs) if dt.is_float(d)]
        stream = mx.cpu if self.stream_for(entry, in_dtypes + [d for _, d in outs], device) == "cpu" else mx.gpu
        step = mx.eval if mode == "eager" else None
        with mx.stream(stream):
            args = [to_mlx(x, d) for x, d in zip(arrays, in_dtypes)]
            cots = [to_mlx(cotangents[k], outs[k][1]) for k in floats] if kind in ("vjp", "hvp") else []
            tans = [to_mlx(tangents[k], in_dtypes[k]) for k in diff] if kind in ("jvp", "hvp") else []
            fixed = [a for k, a in enumerate(args) if k not in diff]

            def derivative(*flat):
                primals, rest = list(flat[:len(diff)]), list(flat[len(diff):])
                n_fixed = len(fixed)
                consts, seeds = rest[:n_fixed], rest[n_fixed:]
                graph = self._graph(entry, spec, res_attrs, cdts, outs, step)

                def f(*p):
                    full, it_p, it_c = [], iter(p), iter(consts)
                    for k in range(len(args)):
                        full.append(next(it_p) if k in diff else next(it_c))
                    res = graph(*full)
                    return [res[k] for k in floats]
                if kind == "vjp":
                    return mx.vjp(f, primals, seeds)[1]
                if kind == "jvp":
                    return mx.jvp(f, primals, seeds)[1]
                c, t = seeds[:len(floats)], seeds[len(floats):]
                return mx.jvp(lambda *q: mx.vjp(f, list(q), c)[1], primals, t)[1]

            flat = [args[k] for k in diff] + fixed + cots + tans
            if kind not in ("vjp", "jvp", "hvp"):
                raise SpecError(f"mlx: unknown derivative {kind!r}")
            if mode == "compiled":
                key = ("grad", kind, spec.name, repr(sorted(res_attrs.items())), tuple(in_dtypes),
                       tuple(x.shape for x in arrays), str(stream), id(entry.fn))
                fn = self._compiled.get(key)
                if fn is None:
                    fn = self._compiled[key] = mx.compile(derivative)
                res = fn(*flat)
            else:
                res = derivative(*flat)
            mx.eval(res)
        res = [to_numpy(r) for r in res]
        if kind == "jvp":
            out: list[np.ndarray | None] = [None] * len(outs)
            for k, r in zip(floats, res):
                out[k] = r
            return out
        out = [None] * len(arrays)
        for k, r in zip(diff, res):
            out[k] = r
        return out

    # RLX's MLX backend compiles a whole graph only up to this many nodes (RLX_MLX_COMPILE_MAX_NODES,
    # default 1536) and runs larger ones lazily; run_graph compiles them anyway and says so.
    RLX_COMPILE_MAX_NODES = 1536

    def run_graph(self, graph: Any, inputs: Mapping[str, np.ndarray], device: str = "cpu",
                  mode: str | None = None) -> tuple[list[np.ndarray], dict[str, Any]]:
        """A graph case (ops/graphs.Resolved) as one MLX function over the nodes' registered
        kernels, each node as :meth:`run` runs it (widen to its compute dtypes → kernel →
        contract check → narrow to its declared dtype): eager evaluates after every node, lazy
        once at the end, compiled runs ``mx.compile`` of the whole function, one per (graph,
        dtype, attributes, stream) and so traced afresh at each new input shape (MLX's compile
        cache). A host-delegated kernel cannot be traced: compiled mode then runs lazily, as
        RLX's fallback does. Returns the outputs (numpy) and notes for the record."""
        mode, stream, key, notes = self._graph_setup(graph, device, mode)
        function = self._graph_function(key, [name for name, _ in graph.inputs], mode)
        with mx.stream(stream):
            args = [to_mlx(inputs[name], d) for name, (_, d) in graph.inputs]
            if mode == "compiled":
                fn = self._compiled.get(key)
                if fn is None:
                    fn = self._compiled[key] = mx.compile(function)
                res = fn(*args)
            else:
                res = function(*args)
            mx.eval(res)
        return [to_numpy(r) for r in res], notes

    def run_graph_vjp(self, graph: Any, inputs: Mapping[str, np.ndarray], primals: Sequence[str],
                      cotangents: Sequence[np.ndarray | None], device: str = "cpu",
                      mode: str | None = None) -> tuple[list[np.ndarray], dict[str, Any]]:
        """The VJP of a graph case (issue 17 item 6) by ``mx.vjp`` over the whole graph function
        :meth:`run_graph` evaluates, with respect to the graph inputs ``primals`` (the others held
        fixed), from one cotangent per graph output (None for a non-floating output, which gets
        none). An edge the registry declares non-differentiable (an op's non-differentiable input,
        or any input of a non-differentiable op; a float-to-float cast is differentiable, the
        identity) is cut by ``mx.stop_gradient``, as the reference's rules stop there. eager
        evaluates after every node of the forward inside the transform; lazy builds the whole VJP
        graph once; compiled runs ``mx.compile`` over the whole VJP function (one per graph,
        dtype, primals, stream; traced afresh per shape). Returns one result per primal and notes."""
        mode, stream, key, notes = self._graph_setup(graph, device, mode)
        names = [name for name, _ in graph.inputs]
        vkey = ("vjp", key, tuple(primals))
        self._compiled[("graph-current",)][vkey] = self._compiled[("graph-current",)][key]
        function = self._graph_function(vkey, names, mode, cut=True)
        floats = [k for k, c in enumerate(cotangents) if c is not None]
        pidx = [names.index(p) for p in primals]
        fixed = [k for k in range(len(names)) if k not in pidx]

        def vjp(*flat):
            ps, rest = list(flat[:len(pidx)]), list(flat[len(pidx):])
            consts, cots = rest[:len(fixed)], rest[len(fixed):]

            def f(*p):
                full: list[Any] = [None] * len(names)
                for k, a in zip(pidx, p):
                    full[k] = a
                for k, a in zip(fixed, consts):
                    full[k] = a
                res = function(*full)
                return [res[k] for k in floats]
            return mx.vjp(f, ps, cots)[1]

        with mx.stream(stream):
            args = [to_mlx(inputs[name], d) for name, (_, d) in graph.inputs]
            cots = [to_mlx(cotangents[k], dt.name_of(cotangents[k].dtype)) for k in floats]
            flat = [args[k] for k in pidx] + [args[k] for k in fixed] + cots
            if mode == "compiled":
                fn = self._compiled.get(vkey)
                if fn is None:
                    fn = self._compiled[vkey] = mx.compile(vjp)
                res = fn(*flat)
            else:
                res = vjp(*flat)
            mx.eval(res)
        return [to_numpy(r) for r in res], notes

    def _graph_setup(self, graph: Any, device: str, mode: str | None) -> tuple[str, Any, Any, dict[str, Any]]:
        """What :meth:`run_graph` and :meth:`run_graph_vjp` share: the mode (compiled falls back
        to lazy for a host-delegated kernel), the stream, the compile cache key (its graph and
        kernels registered for :meth:`_graph_function`) and the notes for the record."""
        mode = mode or self.default_mode
        if mode not in self.modes:
            raise SpecError(f"{self.name}: unknown mode {mode!r} (modes: {', '.join(self.modes)})")
        if device not in self.devices():
            raise UnsupportedError(f"{self.name}: device {device!r} is not available on this machine")
        notes: dict[str, Any] = {"nodes": len(graph.nodes)}
        entries, dtypes = [], []
        for n in graph.nodes:
            entry = self.entry(n.op)
            t = next((d for _, d in n.in_specs if dt.is_float(d)), n.in_specs[0][1])
            if not self.supports(n.op, t, device):
                raise UnsupportedError(f"{self.name} does not support {n.op} on {t} on device {device} "
                                       f"(graph node {n.name})")
            entries.append(entry)
            dtypes += [d for _, d in n.in_specs] + [d for _, d in n.outs]
        if mode == "compiled" and not all(e.native for e in entries):
            notes["fallback"] = "lazy: a host-delegated kernel cannot be traced (RLX's fallback)"
            mode = "lazy"
        if mode == "compiled" and len(graph.nodes) > self.RLX_COMPILE_MAX_NODES:
            notes["above_compile_limit"] = (f"{len(graph.nodes)} nodes > RLX_MLX_COMPILE_MAX_NODES "
                                            f"{self.RLX_COMPILE_MAX_NODES}: RLX runs it lazily; compiled here")
        on_cpu = device == "cpu" or "float64" in dtypes or any(e.options.get("cpu_stream") for e in entries)
        stream = mx.cpu if on_cpu else mx.gpu
        if stream == mx.cpu and device != "cpu":
            notes["stream"] = "cpu"
        names = [name for name, _ in graph.inputs]
        holder = self._compiled.setdefault(("graph-current",), {})
        # the structure (edges, inputs, outputs) and the kernels too: the shrinker and the fuzzer
        # run many graphs of one name, and a test may replace a kernel
        key = ("graph", graph.graph.name, graph.dtype, str(stream), tuple(names), graph.outputs,
               repr([(n.op, n.inputs, sorted(n.attrs.items())) for n in graph.nodes]),
               tuple(id(e.fn) for e in entries))
        holder[key] = (graph, entries)
        return mode, stream, key, notes

    def _graph_function(self, key: Any, names: Sequence[str], mode: str, cut: bool = False):
        """The graph as one function of its inputs (in ``names``' order) to its outputs, reading
        the graph and kernels registered under ``key`` at call time (the graph at the shapes of
        this call). ``cut``: stop the gradient at the edges the registry declares
        non-differentiable (:meth:`run_graph_vjp`)."""
        holder = self._compiled[("graph-current",)]

        def function(*args):
            g, ents = holder[key]
            env = dict(zip(names, args))
            for n, entry in zip(g.nodes, ents):
                spec = get_op(n.op)
                cdts = compute_dtypes(spec, [d for _, d in n.in_specs])
                xs = [env[x] for x in n.inputs]
                if cut:
                    keep = graphs.differentiable_edges(n)
                    xs = [x if k else mx.stop_gradient(x) for x, k in zip(xs, keep)]
                res = self._graph(entry, spec, n.attrs, cdts, list(n.outs), None)(*xs)
                if mode == "eager":
                    mx.eval(res)
                env[n.name] = res[0]
                for k, r in enumerate(res[1:], 1):
                    env[f"{n.name}#{k}"] = r
            return [env[o] for o in g.outputs]
        return function

    def _graph(self, entry, spec, attrs, cdts, outs, step, check=False):
        """widen → kernel → contract check → narrow, with ``step`` (mx.eval in eager mode) between.
        ``outs`` None (run_unchecked): the kernel's outputs as they come; ``check``: the kernel's
        inputs after the call are returned too, after the outputs."""
        def fn(*args):
            wide = [a.astype(MX_DTYPES[c]) if dtype_name(a) != c else a for a, c in zip(args, cdts)]
            if step:
                step(wide)
            res = _as_list(entry.fn(*wide, **attrs))
            if outs is None:
                return res
            check_outputs(self.name, spec, res, outs, lambda o: (o.shape, dtype_name(o)))
            if step:
                step(res)
            out = [r.astype(MX_DTYPES[d]) if dtype_name(r) != d else r for r, (_, d) in zip(res, outs)]
            return out + wide if check else out
        return fn


BACKEND = MlxBackend()

load_kernel_modules(__name__, __path__)  # every kernel module in this package registers itself
