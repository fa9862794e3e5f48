"""``validate --fuzz N``: hypothesis explores N more examples of an op's input space after the
matrix, and shrinks a failure to a minimal example.

The space is the registry's, nothing new: dtypes the kernel claims on the device; shapes with the
ranks and the broadcast structure of the op's shape families (each distinct size above 1 of a
family is redrawn in [1, MAX_DIM], 0 and 1 stay, so sizes that must agree still agree); values
from each input's value domain (its typical range, or its special-value pool: NaN, ±inf, ±0,
subnormals, the domain's boundaries and their ulp neighbours); attributes from their declared
choices or sweeps. Ops whose inputs are structured (``OpSpec.generate``: indices, CSR, SPD
matrices) draw a value class and a seed for the generator, and shapes like the other ops' (or
their family's shapes with sizes redrawn, as the other ops), so that shrinking reduces their
sizes and values too.
Shape inference rejects what the spec forbids (hypothesis discards the example).

Each example is judged like a matrix case (:func:`rlx_conformance.run.execute.judge`); running the
kernel is the caller's (``evaluate``), in an isolated worker. hypothesis is imported here only,
and only when --fuzz is asked for.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlx_conformance.core import data
from rlx_conformance.core import dtypes as dt
from rlx_conformance.core.errors import RlxError, SpecError
from rlx_conformance.generate.matrix import Case, Target, shape_families
from rlx_conformance.spec import values
from rlx_conformance.spec.registry import REQUIRED, OpSpec

MAX_DIM = 8  # fuzzed sizes stay small: large inputs are the matrix's job (1031, 100003, 317x331)
MAX_ELEMENTS = 512


def hypothesis_modules():
    """(hypothesis, strategies, extra.numpy), or a one-line RlxError saying how to get it."""
    try:
        import hypothesis
        import hypothesis.extra.numpy as hnp
        import hypothesis.strategies as st
    except ImportError:
        raise RlxError("--fuzz needs hypothesis: pip install 'rlx-conformance[fuzz]' "
                       "(or pip install hypothesis)") from None
    return hypothesis, st, hnp


def ci_derandomize(flag: bool) -> bool:
    """--derandomize, or the CI environment variable set (GitHub Actions, GitLab, most CIs)."""
    return flag or bool(os.environ.get("CI"))


@dataclass
class Example:
    """One fuzzed input set: everything a matrix case has, with the inputs themselves (they do
    not come from a seed)."""

    op: str
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    family: str
    attrs: tuple[tuple[str, Any], ...]
    inputs: list[np.ndarray]
    vals: str = "fuzz"

    def case(self, target: Target) -> Case:
        return Case(self.op, self.dtype, self.shapes, self.family, self.attrs, self.vals, target)

    def describe(self) -> str:
        shapes = " + ".join("x".join(map(str, s)) or "scalar" for s in self.shapes)
        attrs = ", ".join(f"{k}={v!r}" for k, v in self.attrs)
        out = f"{self.dtype} [{shapes}]" + (f" {attrs}" if attrs else "") + f" (family {self.family})"
        actual = [tuple(x.shape) for x in self.inputs]
        if actual != [tuple(s) for s in self.shapes]:  # a generate hook's inputs (indices, CSR)
            out += " inputs " + " + ".join("x".join(map(str, s)) or "scalar" for s in actual)
        values = self.small_values()
        return out + (f", inputs {values}" if values else "")

    def small_values(self, limit: int = 8) -> list[list[str]] | None:
        """The input values, each in its dtype's shortest repr, when there are few of them."""
        if sum(x.size for x in self.inputs) > limit:
            return None
        return [[str(v) for v in np.asarray(x).reshape(-1)] for x in self.inputs]


@dataclass
class Verdict:
    """What ``evaluate`` says about one example: bad or not, the outcome and details."""

    bad: bool
    outcome: str  # pass | fail | contract | error | crash | timeout | xfail | invalid
    message: str = ""
    expected: list[np.ndarray] | None = None
    actual: list[np.ndarray] | None = None
    measured: dict[str, Any] = field(default_factory=dict)


@dataclass
class FuzzReport:
    requested: int
    derandomized: bool
    examples: int = 0  # examples the kernel ran on
    invalid: int = 0  # discarded: the spec (or the reference) rejects them
    known: int = 0  # failures the built-in kernel shares (inside a known divergence)
    failure: Example | None = None  # the shrunk failing example
    verdict: Verdict | None = None
    flaky: bool = False  # the failure did not reproduce when hypothesis replayed it
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        out = {"requested": self.requested, "derandomized": self.derandomized,
               "examples": self.examples, "invalid": self.invalid, "known_divergences": self.known,
               "flaky": self.flaky, "note": self.note, "failure": None}
        if self.failure is not None and self.verdict is not None:
            out["failure"] = {"example": self.failure.describe(), "dtype": self.failure.dtype,
                              "shapes": [list(s) for s in self.failure.shapes],
                              "attrs": {k: _plain(v) for k, v in self.failure.attrs},
                              "family": self.failure.family, "inputs": self.failure.small_values(limit=64),
                              "input_shapes": [list(x.shape) for x in self.failure.inputs],
                              "outcome": self.verdict.outcome,
                              "message": self.verdict.message, **self.verdict.measured}
        return out


def _plain(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


# -- strategies ----------------------------------------------------------------------------------
def _shapes_like(st, base: Sequence[tuple[int, ...]]):
    """Shapes with the ranks and equalities of a family's shapes: each distinct size above 1 is
    redrawn once (so sizes that must match still match), 0 and 1 stay."""
    sizes = sorted({d for s in base for d in s if d > 1})

    def build(new: list[int]) -> tuple[tuple[int, ...], ...]:
        m = dict(zip(sizes, new))
        return tuple(tuple(m.get(d, d) for d in s) for s in base)
    return st.lists(st.integers(1, MAX_DIM), min_size=len(sizes), max_size=len(sizes)).map(build)


def _attr_strategy(st, a, rank: int, shapes):
    if a.choices:
        return st.sampled_from(list(a.choices))
    if a.sweep == "axis":
        return st.integers(-rank, rank - 1) if rank else st.just(a.default)
    if a.sweep == "axes":
        if not rank:
            return st.just(())
        return st.lists(st.integers(-rank, rank - 1), max_size=rank,
                        unique_by=lambda v: v % rank).map(tuple)
    if callable(a.sweep):
        vals = list(a.sweep(shapes))
        return st.sampled_from(vals) if vals else st.just(a.default)
    if a.sweep is None:
        return st.just(a.default)
    return st.sampled_from(list(a.sweep))


def _elements(st, dtype: str, domain: str, attrs: dict[str, Any]):
    """Elements as float64 / int64 / bool: the domain's range or its special-value pool."""
    spec = data.load("domains")[domain]
    lo, hi = spec["range"]
    if dtype == "bool":
        return np.dtype(bool), st.booleans()
    pool = values.specials(dtype, domain, attrs)
    if dt.is_int(dtype):
        dlo, dhi = dt.iinfo(dtype)
        lo, hi = max(int(lo), dlo), min(int(hi), dhi)
        rng = st.integers(lo, hi)
        if spec.get("exclude_zero"):
            rng = rng.filter(lambda v: v != 0)
        return np.dtype(np.int64), st.one_of(rng, st.sampled_from([int(v) for v in pool]))
    rng = st.integers(math.ceil(lo), math.floor(hi)).map(float) if spec.get("integers_only") \
        else st.floats(float(lo), float(hi))
    return np.dtype(np.float64), st.one_of(rng, st.sampled_from([float(v) for v in pool.astype(np.float64)]))


def example_strategy(spec: OpSpec, dtypes: Sequence[str]):
    """The hypothesis strategy of :class:`Example` for ``spec`` over ``dtypes``."""
    hypothesis, st, hnp = hypothesis_modules()
    fams = shape_families(spec.shapes)
    names = list(fams)
    variadic = bool(spec.inputs) and spec.inputs[-1].variadic
    if spec.generate is None:
        names = [n for n in names if variadic or len(fams[n]) == len(spec.inputs)]
    if not names or not dtypes:
        raise RlxError(f"--fuzz: {spec.name} has no shape family or dtype to explore")

    @st.composite
    def strategy(draw):
        dtype = draw(st.sampled_from(list(dtypes)))
        family = draw(st.sampled_from(names))
        base = fams[family]
        # An op with a generate hook shrinks its shapes too (sizes toward 1, the family's
        # equalities kept; its generator derives the inputs' shapes from them).
        shapes = draw(_shapes_like(st, base))
        rank = len(shapes[0]) if shapes and isinstance(shapes[0], tuple) else 0
        raw = {a.name: draw(_attr_strategy(st, a, rank, shapes)) for a in spec.attrs}
        raw = {k: v for k, v in raw.items() if v is not REQUIRED}
        try:
            if spec.generate is None:
                in_dtypes = spec.case_dtypes(dtype, len(shapes))
                attrs, _ = spec.validate(shapes, in_dtypes, raw)
            else:
                attrs = spec.resolve_attrs(raw)
        except SpecError:
            hypothesis.reject()
        if spec.generate is None:
            if sum(math.prod(s) for s in shapes) > MAX_ELEMENTS:
                hypothesis.reject()
            inputs = []
            for k, (shape, d) in enumerate(zip(shapes, in_dtypes)):
                domain = spec.inputs[min(k, len(spec.inputs) - 1)].domain
                gen_dtype, elements = _elements(st, d, domain, attrs)
                arr = draw(hnp.arrays(gen_dtype, shape, elements=elements))
                with np.errstate(over="ignore", invalid="ignore"):
                    inputs.append(np.asarray(arr).astype(dt.np_dtype(d)))
            vals = "fuzz"
        else:
            vals = draw(st.sampled_from(list(spec.values)))
            seed = draw(st.integers(0, 2**32 - 1))
            try:
                inputs = spec.generate(lambda k: values.Stream(f"fuzz:{seed}#{k}"), shapes, dtype, attrs, vals)
                # a redrawn shape the structure forbids (an index depth past the data's rank):
                # the spec rejects it, as it rejects a matrix case
                spec.validate([x.shape for x in inputs], [dt.name_of(x.dtype) for x in inputs], dict(attrs))
            except (SpecError, ValueError, IndexError):
                hypothesis.reject()
            if sum(x.size for x in inputs) > MAX_ELEMENTS:
                hypothesis.reject()
            vals = f"{vals}-seed{seed}"
        return Example(spec.name, dtype, tuple(shapes), family, tuple((a.name, attrs[a.name]) for a in spec.attrs),
                       inputs, vals)
    return strategy()


class _Found(Exception):
    def __init__(self, example: Example, verdict: Verdict):
        super().__init__(verdict.message)
        self.example, self.verdict = example, verdict


def explore(spec: OpSpec, dtypes: Sequence[str], n: int, evaluate: Callable[[Example], Verdict],
            derandomize: bool = False) -> FuzzReport:
    """Run hypothesis for ``n`` examples; the first failure is shrunk (hypothesis replays smaller
    examples through ``evaluate``) and reported with its verdict."""
    hypothesis, _, _ = hypothesis_modules()
    report = FuzzReport(requested=n, derandomized=derandomize)
    last: list[tuple[Example, Verdict]] = []

    def prop(ex: Example) -> None:
        v = evaluate(ex)
        if v.outcome == "invalid":
            report.invalid += 1
            hypothesis.reject()
        report.examples += 1
        if v.outcome == "xfail":
            report.known += 1
        if v.bad:
            last.append((ex, v))
            raise _Found(ex, v)

    test = hypothesis.settings(
        max_examples=n, derandomize=derandomize, database=None, deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck), report_multiple_bugs=False,
        print_blob=False, verbosity=hypothesis.Verbosity.quiet,
    )(hypothesis.given(example_strategy(spec, dtypes))(prop))
    try:
        test()
    except _Found as f:
        report.failure, report.verdict = f.example, f.verdict
    except hypothesis.errors.Unsatisfiable:
        report.note = "hypothesis found too few valid examples (the spec rejected most draws)"
    except (hypothesis.errors.Flaky, getattr(hypothesis.errors, "FlakyFailure", hypothesis.errors.Flaky)) as e:
        report.flaky = True
        report.note = f"the failure did not reproduce on replay: {type(e).__name__}"
        if last:
            report.failure, report.verdict = last[-1]
    except BaseException as e:  # an ExceptionGroup around _Found (several bugs)
        found = _find(e)
        if found is None:
            raise
        report.failure, report.verdict = found.example, found.verdict
    return report


def _find(e: BaseException) -> _Found | None:
    if isinstance(e, _Found):
        return e
    for sub in getattr(e, "exceptions", ()) or ():
        f = _find(sub)
        if f is not None:
            return f
    return None
