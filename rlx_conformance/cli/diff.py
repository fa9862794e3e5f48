"""``rlx-conformance diff BASE NEW``: what changed between two runs, and whether it is a regression
(exit 1: new failures, newly excused cases, error drift and distribution drift of passing and of
excused cases, tolerance-lock violations and lock lines above their accuracy budget; see diff.py).
The terminal view lists every case-level change, regressions first, each case id on a line of its
own; ``--format json`` prints the diff as one document (schema rlx-conformance/diff/v1: the keys
of report/diff.py's Diff.to_json, which ``--json OUT`` writes). A subset run is compared over its
selection (report/diff.py). The helpers here (threshold and lock options, the terminal view) are
shared with ``nightly``."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlx_conformance.cli import _output as out
from rlx_conformance.core.errors import RlxError
from rlx_conformance.core.results import atomic_write_text
from rlx_conformance.report import lockfile, records
from rlx_conformance.report.diff import Diff, Thresholds, compare
from rlx_conformance.report.html import fmt

SHOW = 20  # rows per list in the terminal; the JSON has them all


def add_diff_options(p: argparse.ArgumentParser, lock_update: bool = True) -> None:
    t = Thresholds()
    g = p.add_argument_group("drift thresholds (an error must pass both the factor and the floor)")
    g.add_argument("--ulp-growth", type=float, default=t.ulp_growth, metavar="X",
                   help=f"max ULP (of a case, or a group's p99/max) grew more than X times (default {t.ulp_growth:g})")
    g.add_argument("--ulp-floor", type=float, default=t.ulp_floor, metavar="N",
                   help=f"... and by more than N ULP (default {t.ulp_floor:g})")
    g.add_argument("--rel-growth", type=float, default=t.rel_growth, metavar="Y",
                   help=f"max relative error grew more than Y times (default {t.rel_growth:g})")
    g.add_argument("--rel-floor-eps", type=float, default=t.rel_floor_eps, metavar="K",
                   help=f"... and by more than K machine epsilons of the dtype (default {t.rel_floor_eps:g})")
    lk = p.add_argument_group("tolerance lock (cases/tolerance_lock.toml)")
    lk.add_argument("--lock", metavar="FILE", help="lock file (default: cases/tolerance_lock.toml)")
    lk.add_argument("--no-lock", action="store_true", help="do not check the lock")
    if lock_update:
        lk.add_argument("--update-lock", action="store_true",
                        help="write the proposals: tighter entries and groups the lock lacks")
        lk.add_argument("--lock-reason", metavar="TEXT",
                        help="with --update-lock, also loosen violated entries to the observed errors, with this reason")


def thresholds(args) -> Thresholds:
    t = Thresholds(args.ulp_growth, args.ulp_floor, args.rel_growth, args.rel_floor_eps)
    if t.ulp_growth < 1 or t.rel_growth < 1 or t.ulp_floor < 0 or t.rel_floor_eps < 0:
        raise RlxError("growth factors must be >= 1 and floors >= 0")
    return t


def check_lock(args, new: records.Report) -> lockfile.LockCheck | None:
    """Compare NEW with the lock and, with --update-lock, write the proposals (printing what) and
    return the check against the lock as written."""
    update, reason = getattr(args, "update_lock", False), getattr(args, "lock_reason", None)
    if args.no_lock:
        if update:
            raise RlxError("--update-lock and --no-lock contradict each other")
        return None
    if reason and not update:
        raise RlxError("--lock-reason goes with --update-lock")
    path = Path(args.lock) if args.lock else lockfile.default_path()
    if args.lock and not path.is_file() and not update:
        raise RlxError(f"no lock file at {path}")
    lock = lockfile.load(path)
    chk = lockfile.check(lock, lockfile.observe(new.cases), path)
    if update:
        new_lock, refused = lockfile.updated(lock, chk, reason)
        lockfile.write(new_lock, path)
        lined = {f["group"] for f in chk.lines_over_budget}
        for f in chk.lines_over_budget:
            print(f"lock: removed the line of {f['group']}: above its accuracy budget ({f['why']}); "
                  "a failure or a capped known divergence, not a lock line", file=sys.stderr)
        for g in chk.over_budget:
            if g["group"] not in lined:
                print(f"lock: not locking {g['group']}: above its accuracy budget ({g['why']})", file=sys.stderr)
        print(f"lock: wrote {path} ({len(chk.tighter)} tightened, {len(chk.unlocked)} added"
              + (f", {len(chk.violations)} loosened with reason" if reason else "") + ")")
        if refused:
            print(f"lock: refused to loosen {refused} entr{'y' if refused == 1 else 'ies'} without "
                  "--lock-reason (they stay violations)", file=sys.stderr)
        # What the run gates on is now the written lock: accepted loosenings no longer count.
        chk = lockfile.check(new_lock, lockfile.observe(new.cases), path)
    return chk


def _num(v) -> str:
    return fmt(v)


def _outcome(b) -> str:
    return "absent" if b is None or b.get("outcome") is None else b["outcome"]


def _changes(d: Diff) -> list[tuple[str, list[tuple[str, str, list[str]]]]]:
    """The case-level outcome changes, regressions first, as (heading, [(label, id, details)])."""
    def msg(x) -> list[str]:
        return out.message_lines((x["new"] or {}).get("message") or "", limit=300, where="diff.json / results.json")

    def moved(x) -> str:
        return f"{_outcome(x['base'])} → {_outcome(x['new'])}"

    return [
        ("new failures (regression)", [(moved(x), x["id"], msg(x)) for x in d.new_failures]),
        ("newly excused: passed in the baseline, xfail now (regression)",
         [(moved(x), x["id"], [f"entry {x['entry']} (was {x['was'] or 'fail'})"]) for x in d.newly_excused]),
        ("new, excused by an entry the baseline never named (regression)",
         [(moved(x), x["id"], [f"entry {x['entry']} (was {x['was'] or 'fail'})"]) for x in d.new_excused_by_new_entry]),
        ("new, excused by an entry the baseline already used",
         [(moved(x), x["id"], [f"entry {x['entry']} (was {x['was'] or 'fail'})"])
          for x in d.new_excused if not x["new_entry"]]),
        ("fixed", [(moved(x), x["id"], []) for x in d.fixed]),
        ("other outcome changes", [(f"{x['base']} → {x['new']}", x["id"], []) for x in d.outcome_changes]),
        ("error drift (passing in both, error grew: regression)",
         [("drift", x["id"], [f"{x['metric']} {_num(x['base'])} → {_num(x['new'])}"]) for x in d.error_drift]),
        ("excused error drift (xfail in both, error grew: regression)",
         [("drift", x["id"], [f"{x['metric']} {_num(x['base'])} → {_num(x['new'])}, entry {x.get('entry')}"])
          for x in d.excused_drift]),
    ]


def print_diff(d: Diff, show: int = SHOW) -> None:
    """The diff for a terminal or a log: counts, what the subset was, then every case-level change
    (regressions first; each case id on a line of its own, never wrapped, its old → new outcome
    before it and its message under it), then the group tables; each list capped at ``show``."""
    c = d.counts()
    out.line(f"diff {d.base or '(no baseline)'} → {d.new}")
    if d.subset is not None:
        out.line(f"subset: the new run holds {d.subset.describe()}")
        out.line(f"  compared over the cases it shares with the baseline; {d.not_in_subset} baseline "
                 f"case(s) not run in this subset (not listed, not counted as removed)")
    out.line("counts: " + ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in c.items()))
    for heading, items in _changes(d):
        if not items:
            continue
        out.line()
        out.line(f"{heading}: {len(items)}" + (f" (first {show}; --format json lists all)" if len(items) > show else ""))
        for label, cid, details in items[:show]:
            out.case_item(label, cid, details)
    if d.removed:
        out.line()
        out.line(f"removed (in the new run's selection, absent from it): {len(d.removed)}"
                 + (f" (first {show})" if len(d.removed) > show else ""))
        for cid in d.removed[:show]:
            out.line(f"  {cid}")

    def table(title: str, cols: list[str], rows: list[list[str]]) -> None:
        if rows:
            out.table(f"{title} ({len(rows)}{'' if len(rows) <= show else f', first {show}'})", cols, rows[:show])

    for title, rows in (("distribution drift (p99/max ULP per group, passing cases)", d.distribution_drift),
                        ("excused distribution drift (p99/max ULP per group, xfail cases)",
                         d.excused_distribution_drift)):
        table(title, ["group", "worse", "p99", "max", "all pass"],
              [[x["group"], ", ".join(x["metrics"]), f"{_num(x['base']['p99'])} → {_num(x['new']['p99'])}",
                f"{_num(x['base']['max'])} → {_num(x['new']['max'])}", "yes" if x["all_pass"] else "no"]
               for x in rows])
    if d.lock is not None:
        lk = d.lock
        table("tolerance lock violations (errors past the lock)", ["group", "metric", "locked", "observed"],
              [[v["group"], v["metric"], _num(v["locked"]), _num(v["observed"])] for v in lk.violations])
        table("tolerance lock lines above their accuracy budget (remove them: --update-lock does)",
              ["group", "max ulp", "max rel", "why"],
              [[v["group"], _num(v["max_ulp"]), _num(v["max_rel_err"]), v["why"]] for v in lk.lines_over_budget])
        table("groups above their accuracy budget (not lockable: a failure or a capped divergence)",
              ["group", "max ulp", "max rel", "why"],
              [[v["group"], _num(v["max_ulp"]), _num(v["max_rel_err"]), v["why"]] for v in lk.over_budget])
        table("tolerance lock: proposed tighter entries (--update-lock writes them)",
              ["group", "metric", "locked", "proposed"],
              [[v["group"], v["metric"], _num(v["locked"]), _num(v["proposed"])] for v in lk.tighter])
        if lk.unlocked:
            out.line(f"tolerance lock: {len(lk.unlocked)} group(s) not in {lk.path} (--update-lock adds them)")
    out.line(f"verdict: {'REGRESSION' if d.regression else 'no regression'}")


def write_json(d: Diff, path: Path) -> None:
    atomic_write_text(Path(path), json.dumps(d.to_json(), indent=1, allow_nan=False) + "\n")


def cmd_diff(args) -> int:
    base = records.load(args.base)
    new = records.load(args.new)
    d = compare(base, new, thresholds(args))
    d.lock = check_lock(args, new)
    if args.json:
        write_json(d, args.json)
    if args.format == "json":
        out.emit_json("diff", d.to_json())
        return 1 if d.regression else 0
    print_diff(d, args.show)
    if args.json:
        out.line(f"diff: {args.json}")
    return 1 if d.regression else 0


def register(sub) -> None:
    p = sub.add_parser("diff", help="compare two runs (report dirs or results.json): new failures, fixed, drift",
                       description=(__doc__ or "").splitlines()[0])
    p.add_argument("base", metavar="BASE", help="baseline report dir or results.json")
    p.add_argument("new", metavar="NEW", help="new report dir or results.json")
    p.add_argument("--json", metavar="OUT", help="also write the diff as JSON")
    p.add_argument("--show", type=int, default=SHOW, help=f"rows per list in the terminal (default {SHOW})")
    out.add_format_option(p, help="text (default: case ids on lines of their own, never wrapped) or json: "
                                  "the diff as one document on stdout (schema rlx-conformance/diff/v1, the "
                                  "keys --json writes)")
    add_diff_options(p)
    p.set_defaults(fn=cmd_diff)
