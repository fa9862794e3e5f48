"""``rlx-conformance stability RESULTS.json [--update]``: the bit-stability classes of a run's
(op, dtype, device, mode) groups, and with ``--update`` the groups observed bit-stable written
into cases/bit_stable.toml (which later runs enforce: stability.enforce)."""
from __future__ import annotations

import datetime as _dt
from pathlib import Path

from rlx_conformance.core import results as res
from rlx_conformance.core.errors import RlxError
from rlx_conformance.judge import stability as st

# How the committed cases/bit_stable.toml is made (kept in its header).
RECIPE = """\
#   rlx-conformance run --device cpu --mode all --repeat 2 --sample 2 --workers 2 --ops "$OPS" --report R1
#   rlx-conformance run --device cpu --mode all --workers 2 --ops "$OPS" --report R2
#   rlx-conformance stability --update R1/results.json R2/results.json
# (R1: half the input sets, each mode twice in different workers; R2: every input set in every
# mode once; the two runs are repeats of each other), OPS = the ops named below."""


def register(sub) -> None:
    p = sub.add_parser("stability", help="bit-stability of a run's groups (repeats, modes); "
                       "--update records the bit-stable ones in cases/bit_stable.toml")
    p.add_argument("results", metavar="RESULTS.json", nargs="+",
                   help="a run's results.json (several modes or --repeat N); several runs of the same "
                        "cases count as repeats of each other")
    p.add_argument("--update", action="store_true",
                   help="write the groups observed bit-stable into cases/bit_stable.toml (groups of "
                        "the (op, dtype, backend, device) this run covered are replaced, others kept)")
    p.add_argument("--file", metavar="PATH", help="the file --update writes (default: cases/bit_stable.toml)")
    p.add_argument("--show", type=int, default=40, help="non-stable groups to list (default 40)")
    p.set_defaults(fn=cmd_stability)


def load_runs(paths: list[str]) -> tuple[list[dict], dict]:
    """The case records of one or more results.json files, and the first file's run metadata.
    Records of one id from several files become one record holding all their digests (runs of
    the same case are repeats of each other)."""
    merged: dict[str, dict] = {}
    run: dict | None = None
    for p in paths:
        try:
            doc = res.load_results(Path(p))
        except (OSError, ValueError) as e:
            raise RlxError(f"cannot read {p}: {e}") from None
        run = doc.get("run", {}) if run is None else run
        for rec in doc["cases"]:
            prev = merged.get(rec["id"])
            if prev is None:
                merged[rec["id"]] = rec
            else:
                prev["repeat_digests"] = (prev.get("repeat_digests") or [prev.get("output_digest")]) + \
                    (rec.get("repeat_digests") or [rec.get("output_digest")])
    return list(merged.values()), run or {}


def cmd_stability(args) -> int:
    cases, run = load_runs(args.results)
    section = st.classify(cases)
    bad = [g for g in section["groups"] if g["class"] in ("nondeterministic", "mode-dependent")]
    for g in bad[:args.show]:
        extra = f"differs from {', '.join(g['differs_from'])}: {g['mode_dependent_cases']}/{g['cases']} cases" \
            if g["class"] == "mode-dependent" else f"{g['nondeterministic_cases']}/{g['cases']} cases"
        print(f"{g['class']:16} {g['op']}/{g['dtype']}/{g['backend']}-{g['device']}-{g['mode']}  {extra}"
              f"  e.g. {g['examples'][0]}")
    if len(bad) > args.show:
        print(f"... and {len(bad) - args.show} more")
    print(st.summary_line(section))
    if args.update:
        from rlx_conformance.core.data import data_path

        path = Path(args.file) if args.file else data_path(st.RECORDED_FILE)
        n = update_file(path, section, run, len(args.results))
        print(f"{path}: {n} (op, dtype, backend, device) groups recorded bit-stable")
    return 0


def _read_groups(path: Path) -> list[dict]:
    import tomllib

    if not path.is_file():
        return []
    with path.open("rb") as f:
        return tomllib.load(f).get("group", [])


def _q(v) -> str:
    import json

    return json.dumps(v)  # TOML basic strings and arrays of them read the same as JSON's


def update_file(path: Path, section: dict, run: dict, runs: int = 1) -> int:
    """Merge the classification's bit-stable groups into the TOML file at ``path``: entries of
    the (op, dtype, backend, device) the classification covers are replaced (dropped where no
    longer stable), the rest kept. Returns the number of (op, dtype, backend, device) recorded."""
    where = st.host(run.get("platform"), run.get("machine"))
    covered = {(g["op"], g["dtype"], g["backend"], g["device"], where) for g in section["groups"]}
    recorded: dict[tuple[str, str, str, str, str], tuple[str, ...]] = {}
    for g in _read_groups(path):
        for d in g["dtypes"]:
            key = (g["op"], d, g["backend"], g["device"], g["host"])
            if key not in covered:
                recorded[key] = tuple(sorted(g["modes"]))
    for key, modes in st.stable_modes(section).items():
        recorded[(*key, where)] = tuple(sorted(modes))
    # one [[group]] per (op, backend, device, host, modes), its dtypes listed
    merged: dict[tuple[str, str, str, str, tuple[str, ...]], list[str]] = {}
    for (op, dtype, backend, device, h), modes in sorted(recorded.items()):
        merged.setdefault((op, backend, device, h, modes), []).append(dtype)
    ops = sorted({k[0] for k in covered})
    lines = [
        "# Bit-stable groups: (op, dtype, backend, device) whose outputs were bit-identical across",
        "# the listed modes and across repeated runs (in different worker processes). This is the",
        "# backend against itself, not against the reference. A run holding two or more of a group's",
        "# modes, or --repeat N, fails every case whose modes or repeats disagree bit-wise",
        "# (rlx_conformance/judge/stability.py: enforce). Groups absent here are mode-dependent,",
        "# nondeterministic or not measured; `rlx-conformance stability RESULTS.json` lists them.",
        "# A group applies on its host (OS-architecture) only: libm, SIMD and the JIT's compiler differ.",
        "#",
        "# Generated by `rlx-conformance stability --update RESULTS.json` (entries of the (op, dtype,",
        "# backend, device) the results cover are replaced, the others kept); made with:",
        RECIPE,
        f"# Last update: {_dt.date.today().isoformat()}, from {runs} run(s); the first: repeat "
        f"{run.get('repeat', 1)}, targets",
        f"#   {', '.join(run.get('targets', [])) or '?'};",
        f"# mlx {run.get('mlx', '?')}, numpy {run.get('numpy', '?')}, {run.get('platform', '?')}.",
        f"# {len(ops)} ops:",
    ]
    line = "#  "
    for k, op in enumerate(ops):
        word = f" {op}" + ("," if k + 1 < len(ops) else "")
        if len(line) + len(word) > 100:
            lines.append(line)
            line = "#  "
        line += word
    lines.append(line)
    for (op, backend, device, h, modes), dtypes in merged.items():
        lines += ["", "[[group]]", f"op = {_q(op)}", f"backend = {_q(backend)}", f"device = {_q(device)}",
                  f"host = {_q(h)}", f"modes = {_q(list(modes))}", f"dtypes = {_q(dtypes)}"]
    res.atomic_write_text(path, "\n".join(lines) + "\n")
    return len(recorded)
