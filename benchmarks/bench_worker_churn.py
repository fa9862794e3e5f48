"""What a crashing case costs a run: the worker it kills must be replaced (issue 19 item 2).

    python benchmarks/bench_worker_churn.py [--workers 2] [--repeat 3] [--json PATH]

A GPU run meets about 1,000 known crashes (MLX's CUDA build aborts on every empty array in
compiled mode: cases/known_divergences.toml, cuda-compiled-mode-empty-arrays), and each kills its
worker; on an H100 host a diagnostic run found every fresh worker's first case 1-4 s slower than
the rest (its MLX import and CUDA start-up). This measures the harness's share on the CPU: the
Runner (as ``run`` drives it) over MLX's ``neg`` cases, once with MLX's kernel and once with one
that aborts on every input of odd size (tests/fail_fast_kernels.py), and reports the wall time of
each, the crashes, and the extra seconds per crash. Median of ``--repeat`` runs each.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # fail_fast_kernels, for the workers

from rlx_conformance.generate import matrix  # noqa: E402
from rlx_conformance.generate.matrix import Target  # noqa: E402
from rlx_conformance.run import runner, worker  # noqa: E402


def one(cases, workers: int, init: str | None) -> tuple[float, Counter]:
    r = runner.Runner(workers=workers, timeout=60.0, init=init, max_failures=0)
    t0 = time.perf_counter()
    out = Counter(res.outcome for res in r.run(cases))
    return time.perf_counter() - t0, out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    worker.prestart()
    cases = [c for c in matrix.generate([Target("mlx", "cpu", "compiled")], ops=["neg"]) if not c.grad]
    one(cases, args.workers, None)  # MLX's JIT cache warm for these kernels
    rows = {}
    for name, init in (("mlx", None), ("aborts-on-odd", "fail_fast_kernels:install_neg_aborts_on_odd_sizes")):
        runs = [one(cases, args.workers, init) for _ in range(args.repeat)]
        rows[name] = {"wall_s": round(statistics.median(w for w, _ in runs), 2), "outcomes": dict(runs[0][1])}
    crashes = rows["aborts-on-odd"]["outcomes"].get("crash", 0)
    extra = (rows["aborts-on-odd"]["wall_s"] - rows["mlx"]["wall_s"]) / max(1, crashes)
    for name, row in rows.items():
        print(f"{name:>14}: {len(cases)} cases in {row['wall_s']} s with {args.workers} workers {row['outcomes']}")
    print(f"{crashes} crashes cost {extra * 1000:.0f} ms each")
    if args.json:
        Path(args.json).write_text(json.dumps({"cases": len(cases), "workers": args.workers, "runs": rows,
                                               "ms_per_crash": round(extra * 1000)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
