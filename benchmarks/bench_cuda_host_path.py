"""The host's side of a custom op's CUDA launch: what a call costs before the GPU does anything.

    PYTHONPATH=. python benchmarks/bench_cuda_host_path.py [--size 1000000] [--calls 5000]

At 10^6 elements a gather's GPU work is ~10 us on an H200, and bench_gpu_custom.py measured
GatherElements at 38 us a call and GatherND at 67 us against ``cupy.take``'s 12-23 us: the call
was bound by the host's path (the op's kernel function, the mx.custom_function that carries the
VJP and JVP, the launch plan, the kernel call building MLX's graph). This script times that path
alone, per op: ``entry.fn(*inputs)`` building its (unevaluated) result, the mean over --calls
calls after a warm-up.

Runs anywhere. On MLX's CUDA build it times the real path (the graph is built, never
evaluated). Elsewhere ``cuda_kernels.active`` is made true and the kernel object is a stub that
returns zero arrays of the plan's output shapes (``mx.zeros``, about 1 us an output, counted): the
same Python and MLX graph building up to the launch, which is what the kernel sources do not
change. Compare two versions of the package by running this script with each on PYTHONPATH.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_gpu_custom, also under python -P
from bench_gpu_custom import inputs  # noqa: E402  (the same inputs as the GPU benchmark)

OPS = ["onnx.GatherElements", "onnx.GatherND", "onnx.ScatterElements", "onnx.ScatterND",
       "rlx_sparse.mat_vec", "rlx_sparse.values_grad"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=1e6)
    ap.add_argument("--calls", type=int, default=5000)
    args = ap.parse_args()
    import mlx.core as mx

    from rlx_conformance.backends import get_backend
    from rlx_conformance.backends.mlx import cuda_kernels as ck
    from rlx_conformance.backends.mlx import custom
    real = ck.available()
    if not real:
        def stub(name):
            def call(*, inputs, output_shapes, output_dtypes, **_):
                return [mx.zeros(s, d) for s, d in zip(output_shapes, output_dtypes)]
            return call
        ck._kernel = stub
        ck.active = lambda: True
        custom._cuda.active = ck.active
    mlx = get_backend("mlx")
    print(f"host path to the launch, {'CUDA' if real else 'stubbed kernel (no CUDA here)'}, "
          f"size {int(args.size):,}, mean of {args.calls} calls")
    for op in OPS:
        with mx.stream(mx.gpu if real else mx.cpu):
            arrays, attrs, _ = inputs(op, int(args.size))
            ins = [mx.array(a) for a in arrays]
            mx.eval(ins)
            fn = mlx.kernels[op].fn
            for _ in range(20):
                fn(*ins, **attrs)
            t0 = time.perf_counter()
            for _ in range(args.calls):
                fn(*ins, **attrs)
            t = time.perf_counter() - t0
        print(f"{op:24s} {1e6 * t / args.calls:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
