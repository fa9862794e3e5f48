"""Fill each known-divergence entry's `excuses` and caps from measured records.

usage: fill_excuses.py TOML RESULTS... : rewrites TOML in place; prints entries with nothing measured
and kinds beyond the category. Caps: the measured maximum over the excused value failures, rounded
up to the next 1-2-5 step."""
import math
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # entry_stats, beside this file
from entry_stats import stats  # noqa: E402
from rlx_conformance.judge.divergences import CATEGORY_KINDS, entry_key  # noqa: E402

def step125(m):
    if m <= 0:
        return 0
    if math.isinf(m):
        return None
    e = math.floor(math.log10(m))
    for k in (1, 2, 5, 10):
        v = k * 10.0 ** e
        if v >= m * (1 - 1e-12):
            return float(f"{v:.0e}") if v >= m else float(f"{v:.0e}")
    return 10.0 ** (e + 1)

def fmt(v):
    if v == int(v) and abs(v) < 1e6:
        return str(int(v))
    return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-").replace("e+", "e")

def main(toml, results):
    st = {}
    for k, s in stats(results).items():
        key = entry_key(k)
        t = st.setdefault(key, {'kinds': set(), 'max': {}})
        t['kinds'] |= set(s['kinds'])
        for c, v in s['max'].items():
            t['max'][c] = max(t['max'].get(c, 0), v)
    lines = open(toml).read().split('\n')
    out, key, cat = [], None, None
    skip = re.compile(r'^(excuses|max_ulp|max_rel_err|max_abs_err) = ')
    for ln in lines:
        if skip.match(ln):
            continue
        out.append(ln)
        m = re.match(r'^key = "(.*)"', ln)
        if m:
            key = m.group(1)
        m = re.match(r'^category = "(.*)"', ln)
        if m:
            cat = m.group(1)
            s = st.get(key)
            if not s or not s['kinds']:
                print("NOTHING MEASURED:", key, cat)
                kinds = sorted(CATEGORY_KINDS[cat])
                out.append(f'excuses = [{", ".join(repr(k).replace(chr(39), chr(34)) for k in kinds)}]  # FIXME')
                if 'value' in kinds:
                    out.append('max_ulp = 0  # FIXME')
                continue
            beyond = s['kinds'] - CATEGORY_KINDS[cat]
            if beyond:
                print("BEYOND CATEGORY:", key, cat, sorted(beyond))
            kinds = sorted(s['kinds'] & CATEGORY_KINDS[cat])
            out.append('excuses = [' + ", ".join(f'"{k}"' for k in kinds) + ']')
            if 'value' in kinds:
                for c in ('max_ulp', 'max_rel_err', 'max_abs_err'):
                    if c in s['max']:
                        v = step125(s['max'][c])
                        if v is not None:
                            out.append(f'{c} = {fmt(v)}')
    open(toml, 'w').write('\n'.join(out))

if __name__ == '__main__':
    main(sys.argv[1], sys.argv[2:])
