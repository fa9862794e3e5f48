"""Plots for the HTML report, drawn with matplotlib (Agg) and returned as inline SVG markup: the
report stays one file that opens from disk, with text that scales and stays selectable.

Each SVG is stripped of its XML prolog, DOCTYPE and RDF metadata (they name external URLs), and
its element ids get a per-plot prefix, since several SVGs share one HTML document's id space."""
from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence

from rlx_conformance.report.stats import Worst

# One palette for the scoreboard and the plots (the template's CSS uses the same values).
OUTCOME_COLORS = {"pass": "#2da44e", "xfail": "#d4a72c", "skip": "#afb8c1", "xpass": "#8250df",
                  "fail": "#cf222e", "error": "#e16f24", "contract": "#953800", "crash": "#82071e",
                  "timeout": "#bf3989", "not-run": "#6e7781"}
UNKNOWN_COLOR = "#24292f"
_SHADES = ("#9ecbff", "#79b8ff", "#54a3ff", "#2188ff", "#0366d6", "#005cc5", "#044289", "#032f62",
           "#05264c", "#041c3a", "#03152b", "#000000")  # an outcome this version does not know (a newer harness's results)

# ULP buckets of the distribution plots: exact, last-bit, small, then growing powers.
_EDGES = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 64.0, 256.0, 1024.0, 65536.0)
BUCKETS = ("0", "≤1", "≤2", "≤4", "≤8", "≤16", "≤64", "≤256", "≤1k", "≤64k", ">64k", "inf")


def bucket(u: float) -> int:
    """Index into BUCKETS of a max-ULP value."""
    if math.isinf(u):
        return len(BUCKETS) - 1
    for i, e in enumerate(_EDGES):
        if u <= e:
            return i
    return len(BUCKETS) - 2


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "rlx-conformance", "font.size": 9,
                         "font.family": "sans-serif", "axes.spines.top": False,
                         "axes.spines.right": False, "axes.titlesize": 10, "axes.titleweight": "bold"})
    return plt


def _svg(fig, prefix: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    _plt().close(fig)
    s = buf.getvalue()
    s = s[s.index("<svg"):]
    s = re.sub(r"<metadata>.*?</metadata>", "", s, flags=re.S)
    s = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", s, count=0)
    s = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', s)
    s = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", s)
    s = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', s)
    # Scale with the page: keep the viewBox, drop the fixed size.
    s = re.sub(r'<svg([^>]*?)\swidth="([\d.]+)pt"\sheight="[\d.]+pt"',
               lambda m: f'<svg{m.group(1)} class="plot" style="max-width:{float(m.group(2)) * 4 / 3:.0f}px"', s, count=1)
    return s.strip()


def ulp_histograms(by_family: Mapping[str, Sequence[float]], cols: int = 4) -> str | None:
    """Small multiples: per op family, how many passing cases reached each max-ULP bucket (log
    count axis, so a handful of 100-ULP cases shows beside thousands of exact ones)."""
    fams = [f for f, v in by_family.items() if v]
    if not fams:
        return None
    plt = _plt()
    rows = math.ceil(len(fams) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.1 * cols, 1.9 * rows), squeeze=False)
    x = range(len(BUCKETS))
    for ax, fam in zip(axes.flat, fams):
        counts = [0] * len(BUCKETS)
        for u in by_family[fam]:
            counts[bucket(u)] += 1
        # Shade by bucket, not by verdict: every case here passed (some by error bounds far
        # beyond a few ULP), so red would claim a failure that is not there.
        ax.bar(x, counts, color=[_SHADES[min(i, len(_SHADES) - 1)] for i in x], width=0.8)
        ax.set_yscale("log")
        ax.set_ylim(0.7, max(counts) * 2.5)
        ax.set_title(f"{fam}  (n={sum(counts)}, max {_fmt(max(by_family[fam]))})", loc="left")
        ax.tick_params(axis="y", labelsize=7)
        ax.grid(axis="y", alpha=0.25)
    for ax in axes.flat[len(fams):]:
        ax.axis("off")
    for ax in axes.flat:
        ax.set_xticks(list(x), BUCKETS, rotation=60, fontsize=7)
    fig.supxlabel("max ULP of the case (passing cases)", fontsize=9)
    fig.supylabel("cases (log)", fontsize=9)
    fig.tight_layout()
    return _svg(fig, "hist")


def worst_ops(worst: Sequence[Worst]) -> str | None:
    """The ops with the largest max ULP among their passing cases: what is closest to failing."""
    if not worst:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8.5, 0.28 * len(worst) + 0.8))
    ys = list(range(len(worst)))[::-1]
    ax.barh(ys, [w.max_ulp for w in worst], color="#0969da", height=0.65)
    ax.set_xscale("log")
    ax.set_yticks(ys, [w.op for w in worst], fontsize=8)
    for y, w in zip(ys, worst):
        parts = w.id.split("/")
        where = f"{parts[1]}, {parts[-1]}" if len(parts) > 2 else ""
        ax.text(w.max_ulp * 1.08, y, f"{_fmt(w.max_ulp)}  {where}", va="center", fontsize=7, color="#57606a")
    lo = min(w.max_ulp for w in worst)
    ax.set_xlim(max(lo / 2, 0.25), max(w.max_ulp for w in worst) * 40)
    ax.set_xlabel("max ULP over the op's passing cases (log)")
    ax.grid(axis="x", alpha=0.25)
    fig.tight_layout()
    return _svg(fig, "worst")


def outcome_bars(per_target: Mapping[str, Mapping[str, int]]) -> str | None:
    """Per target, the count of each outcome (log axis: a few crashes beside 10^4 passes)."""
    targets = [t for t, c in per_target.items() if sum(c.values())]
    if not targets:
        return None
    seen = {o for t in targets for o, n in per_target[t].items() if n}
    outcomes = [o for o in OUTCOME_COLORS if o in seen] + sorted(seen - set(OUTCOME_COLORS))
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(targets) * max(1, len(outcomes)) / 3 + 2), 2.8))
    width = 0.8 / len(outcomes)
    for j, o in enumerate(outcomes):
        xs = [i + (j - (len(outcomes) - 1) / 2) * width for i in range(len(targets))]
        vals = [per_target[t].get(o, 0) for t in targets]
        bars = ax.bar(xs, [v or float("nan") for v in vals], width=width * 0.92, color=OUTCOME_COLORS.get(o, UNKNOWN_COLOR), label=o)
        for b, v in zip(bars, vals):
            if v:
                ax.text(b.get_x() + b.get_width() / 2, v * 1.15, str(v), ha="center", fontsize=6, rotation=90,
                        va="bottom", color="#57606a")
    ax.set_yscale("log")
    ax.set_ylim(0.7, max(max(c.values()) for c in per_target.values()) * 8)
    ax.set_xticks(range(len(targets)), targets, fontsize=8)
    ax.set_ylabel("cases (log)")
    ax.legend(ncol=len(outcomes), fontsize=7, frameon=False, loc="upper center", bbox_to_anchor=(0.5, 1.16))
    ax.grid(axis="y", alpha=0.25)
    fig.tight_layout()
    return _svg(fig, "outcomes")


def _fmt(u: float) -> str:
    if math.isinf(u):
        return "inf"
    return f"{u:.0f}" if u >= 10 or u == int(u) else f"{u:.2g}"
