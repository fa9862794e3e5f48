"""Per known-divergence entry: failure kinds and measured maxima of the failures it excused."""
import collections
import gzip
import json
import re
import sys
from types import SimpleNamespace

from rlx_conformance.judge.divergences import failure_kinds


def load(p):
    op = gzip.open if p.endswith('.gz') else open
    with op(p, 'rt') as f:
        d = json.load(f)
    if 'rows' not in d:
        return d['cases']
    out = []
    for r in d['rows']:  # the exhaustive sweep: as _verdict judges a row
        if r['target'].startswith('cpu-'):
            continue
        r = dict(r)
        if r.get('outcome') == 'xfail':
            m = re.search(r'was (\w+)', r.get('message') or '')
            r['divergence'] = dict(r['divergence'], was=m.group(1) if m else 'fail')
        r['nonfinite_mismatches'] = (r.get('nan_mismatch') or 0) + (r.get('inf_mismatch') or 0)
        r['max_rel_err'] = r['max_abs_err'] = None
        out.append(r)
    return out

def kinds(r):
    was = (r.get('divergence') or {}).get('was') or r['outcome']
    ns = SimpleNamespace(outcome=was, max_ulp=r.get('max_ulp'), max_rel_err=r.get('max_rel_err'),
                         max_abs_err=r.get('max_abs_err'), nonfinite_mismatches=r.get('nonfinite_mismatches'))
    if 'nonfinite_mismatches' not in r and was == 'fail':  # old record: read the message
        m = r.get('message') or ''
        ns.nonfinite_mismatches = 1 if ('nan' in m.lower() or 'inf' in m.lower()) else 0
    return failure_kinds(ns)

def stats(paths):
    out = collections.defaultdict(lambda: {'kinds': collections.Counter(), 'max': {}, 'n': 0, 'fail_n': 0, 'targets': collections.Counter()})
    for p in paths:
        for r in load(p):
            d = r.get('divergence')
            if not d:
                continue
            key = d.get('entry')
            s = out[key]; s['n'] += 1
            k = kinds(r)
            if not k:
                continue
            s['fail_n'] += 1
            s['targets'][(r['device'], r['mode'])] += 1
            for kk in k: s['kinds'][kk] += 1
            if 'value' in k:
                for c in ('max_ulp', 'max_rel_err', 'max_abs_err'):
                    v = r.get(c)
                    if v is not None:
                        s['max'][c] = max(s['max'].get(c, 0), v)
    return out

if __name__ == '__main__':
    st = stats(sys.argv[1:])
    for k, s in sorted(st.items(), key=lambda kv: str(kv[0])):
        print(k, s['n'], s['fail_n'], dict(s['kinds']), {a: f"{b:.3g}" for a, b in s['max'].items()}, dict(s['targets']))
