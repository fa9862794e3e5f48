"""Where a cold run's time goes: MLX's CPU JIT compiles, per op family (issue 18 item 1).

    python benchmarks/bench_cold.py [--ops GLOB] [--dtypes GLOB] [--mode compiled] [--grad none|all|KINDS]
                                    [--layouts none|default|all] [--graphs none|all|GLOB] [--sample K]
                                    [--sample-grad K] [--skip-shapes G] [--workers N] [--order schedule|natural] [--no-pch] [--count-only]
                                    [--json PATH]

MLX's compiled mode on the CPU generates C++ for each new fused graph and compiles it with
``g++`` (a shell command, found on PATH), caching source and library under
``$TMPDIR/mlx/<version>/cpu``. This script runs a selection of the matrix, as ``rlx-conformance
run`` builds it, with a fresh empty TMPDIR (a cold cache) and a ``g++`` on PATH that logs each
call (start, end, library) before running the real compiler, and reports:

* the run's wall time (results.json's wall_s) and cases/s;
* the JIT compiles: how many, seconds each (from the log: the compiler's own time, not an
  estimate), their sum and its share of the worker time (wall x workers);
* ``--workers 0`` (in-process, one case at a time; not with --count-only, whose garbage outputs
  may crash a case, which in-process takes the benchmark down): each compile is attributed to the case that
  was running when it started, so the compiles and cases per kernel are given per op family
  (``rlx_conformance.ops``: the registry's family of the case's op; ``graph`` for graph cases)
  and per case kind (forward, vjp, jvp, hvp, layout), and the cases that compiled nothing.

``--order natural`` runs the cases in the matrix's order (session.execute's scheduling off): the
before/after comparison of the schedule. The machine's load (``os.getloadavg``) before and after
is printed: the figures are only comparable on a machine equally loaded.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

WRAPPER = """#!/bin/sh
# bench_cold.py's g++: log the call's start, end and output, then the real compiler's status
s=$(date +%s.%N)
{compile}
rc=$?
e=$(date +%s.%N)
out=""
prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
src=""
for a in "$@"; do case "$a" in *.cpp) src="$a";; esac; done
name=$([ -n "$src" ] && grep -o "^void [A-Za-z0-9_]*" "$src" | head -1 | cut -c6-)
[ -n "$out" ] && echo "$s $e $rc $name" >> "{log}"
exit $rc
"""
CHILD = "BENCH_COLD_DIR"  # set in the measuring child: its scratch folder
REAL = '"{real}" "$@"'
# --count-only: (MLX probes ``g++ --version`` first and, if that fails, runs every graph unfused
# without a word: the probe goes to the real compiler) a library with the kernel's symbol and an empty body, compiled without MLX's
# preamble (~50 ms instead of ~1 s): the number and names of the kernels a selection generates,
# exactly, in a fraction of the time; the cases' MLX outputs are then garbage (not judged).
STUB = ('src=""; for a in "$@"; do case "$a" in *.cpp) src="$a";; esac; done; '
        # MLX probes the compiler first (`g++ --version`); the precompiled preamble is built
        # from a header, not a .cpp: both go to the real compiler
        'if [ -z "$src" ]; then "{real}" "$@"; else '
        'name=$(grep -o "^void [A-Za-z0-9_]*" "$src" | head -1 | cut -c6-); '
        'printf "extern \\"C\\" void %s(int*, long**, void**) {}\\n" "$name" > "$src.stub.cpp"; '
        'o=""; p=""; for a in "$@"; do [ "$p" = "-o" ] && o="$a"; p="$a"; done; '
        '"{real}" -shared -fPIC "$src.stub.cpp" -o "$o"; fi')


def kind_of(case) -> str:
    """forward, vjp/jvp/hvp (a derivative), layout (a forward case on views)."""
    if case.grad:
        return case.grad
    return "layout" if case.layout else "forward"


def family_of(case) -> str:
    from rlx_conformance.generate.graphs import is_graph
    from rlx_conformance.ops import get_op

    return "graph" if is_graph(case) else get_op(case.op).family


def build(argv: list[str]):
    """The cases ``rlx-conformance run ARGV`` would run (its own selection)."""
    from rlx_conformance.cli import run as cli_run
    from rlx_conformance.cli.main import build_parser
    from rlx_conformance.cli.options import sample

    args = build_parser().parse_args(["run", *argv])
    cases = cli_run.select_cases(args)
    return sample(cases, args.sample) if args.sample > 1 else cases


def read_log(log: Path) -> list[tuple[float, float, str]]:
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        parts = line.split(maxsplit=3)
        if len(parts) == 4:
            out.append((float(parts[0]), float(parts[1]), parts[3]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=None)
    ap.add_argument("--dtypes", default=None)
    ap.add_argument("--mode", default="compiled")
    ap.add_argument("--grad", default="all")
    ap.add_argument("--layouts", default="default")
    ap.add_argument("--graphs", default=None)
    ap.add_argument("--sample", type=int, default=1, help="every K-th input set of each op and dtype")
    ap.add_argument("--sample-grad", type=int, default=1, help="run's --sample-grad K (tox -e mlx: 8)")
    ap.add_argument("--skip-shapes", default="", help="run's --skip-shapes GLOBS (tox -e mlx: huge)")
    ap.add_argument("--workers", type=int, default=2, help="0: in-process, with per-family attribution")
    ap.add_argument("--order", choices=("schedule", "natural"), default="schedule")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    ap.add_argument("--no-pch", action="store_true",
                    help="without the precompiled MLX preamble (RLX_CONFORMANCE_JIT_PCH=0): the before of it")
    ap.add_argument("--count-only", action="store_true",
                    help="stub compiler: count the kernels (exactly) without paying for them")
    args = ap.parse_args()
    real = shutil.which("g++")
    if real is None:
        sys.exit("bench_cold.py: no g++ on PATH (MLX's CPU compiled mode needs one)")

    argv = ["--mode", args.mode, "--grad", args.grad, "--layouts", args.layouts, "--sample", str(args.sample)]
    argv += ["--ops", args.ops] if args.ops else []
    argv += ["--dtypes", args.dtypes] if args.dtypes else []
    argv += ["--graphs", args.graphs] if args.graphs else []
    argv += ["--sample-grad", str(args.sample_grad)] if args.sample_grad > 1 else []
    argv += ["--skip-shapes", args.skip_shapes] if args.skip_shapes else []
    tmp_env = os.environ.get(CHILD)
    if tmp_env is None:
        # MLX reads TMPDIR once per process: the measurement runs in a fresh interpreter whose
        # environment has the empty TMPDIR and the logging g++ from its start (and its workers too)
        tmp = Path(tempfile.mkdtemp(prefix="bench-cold-"))
        (tmp / "bin").mkdir()
        (tmp / "tmpdir").mkdir()
        wrapper = tmp / "bin" / "g++"
        compile_line = (STUB if args.count_only else REAL).replace("{real}", real)
        wrapper.write_text(WRAPPER.format(compile=compile_line, log=tmp / "gpp.log"))
        wrapper.chmod(0o755)
        env = {**os.environ, CHILD: str(tmp), "TMPDIR": str(tmp / "tmpdir"),
               "PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               **({"RLX_CONFORMANCE_JIT_PCH": "0"} if args.no_pch else {})}
        try:
            code = subprocess.run([sys.executable, __file__, *sys.argv[1:]], env=env).returncode
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        sys.exit(code)
    tmp = Path(tmp_env)
    log, jit_tmp = tmp / "gpp.log", tmp / "tmpdir"
    t0 = time.perf_counter()
    cases = build(argv)
    gen = time.perf_counter() - t0

    from rlx_conformance.run import session
    from rlx_conformance.run.runner import backend_env

    ends: list[tuple[float, str]] = []  # (time.time(), id) as each result came back, in that order
    load0 = os.getloadavg()
    run = session.execute(cases, tmp / "report", workers=args.workers, timeout=600,
                          strict_divergences=False, on_result=lambda r: ends.append((time.time(), r.id)),
                          schedule=args.order == "schedule")
    load1 = os.getloadavg()
    wall = run.meta["wall_s"]
    calls = read_log(log)
    libs = list((jit_tmp / "mlx").rglob("*.so")) if (jit_tmp / "mlx").exists() else []
    secs = [e - s for s, e, _ in calls]
    workers = max(args.workers, 1)
    doc: dict = {
        "selection": argv, "order": args.order, "count_only": args.count_only, "workers": args.workers,
        # the precompiled MLX preamble (backends/mlx/_jit_pch.py), built within the run (its fresh
        # TMPDIR): in the wall time, not among the compiles below (a compile without a .cpp source)
        "jit_pch": bool(backend_env(cases)),
        "cases": len(cases),
        "generation_s": round(gen, 2), "wall_s": wall, "cases_per_s": round(len(cases) / wall, 1),
        "load_before": [round(x, 2) for x in load0], "load_after": [round(x, 2) for x in load1],
        "outcomes": dict(Counter(r.outcome for r in run.results)),
        "jit": {"compiles": len(calls), "libraries": len(libs), "kernels": len({n for _, _, n in calls}),
                "seconds": round(sum(secs), 1),
                "per_compile_s": {"mean": round(statistics.fmean(secs), 3) if secs else None,
                                  "median": round(statistics.median(secs), 3) if secs else None,
                                  "max": round(max(secs), 3) if secs else None},
                "share_of_worker_time": round(sum(secs) / (wall * workers), 3)},
    }
    if args.workers == 0:
        # in-process the cases run one at a time, in the order they came back (run.results is
        # put back in case order): case i ran in (end of case i-1, end of case i]
        by_id = {c.id: c for c in cases}
        durations = {r.id: r.duration_s for r in run.results}
        order = [by_id[i] for _, i in ends]
        first = ends[0][0] - durations[ends[0][1]] if ends else 0.0
        starts = [first] + [t for t, _ in ends[:-1]]
        fam: dict[str, Counter] = defaultdict(Counter)
        kinds: dict[str, Counter] = defaultdict(Counter)
        per_case: dict[str, list[str]] = {}
        k = 0
        calls.sort()
        for case, a, (b, _) in zip(order, starts, ends):
            n, s = 0, 0.0
            while k < len(calls) and calls[k][0] <= b:
                per_case.setdefault(case.id, []).append(calls[k][2])
                n, s, k = n + 1, s + calls[k][1] - calls[k][0], k + 1
            for table, key in ((fam, family_of(case)), (kinds, kind_of(case))):
                table[key].update(cases=1, compiles=n, compile_s=s, case_s=b - a,
                                  cases_that_compiled=1 if n else 0)
        doc["per_family"] = {f: _row(c) for f, c in sorted(fam.items(), key=lambda kv: -kv[1]["compile_s"])}
        doc["per_kind"] = {f: _row(c) for f, c in sorted(kinds.items(), key=lambda kv: -kv[1]["compile_s"])}
        doc["per_case"] = per_case  # the kernels each case compiled (its id: their names)
    print(json.dumps({k: v for k, v in doc.items() if k != "per_case"}, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")


def _row(c: Counter) -> dict:
    return {"cases": c["cases"], "compiles": c["compiles"], "compile_s": round(c["compile_s"], 1),
            "case_s": round(c["case_s"], 1), "cases_per_compile": round(c["cases"] / max(c["compiles"], 1), 1),
            "cases_that_compiled": c["cases_that_compiled"]}


if __name__ == "__main__":
    main()
