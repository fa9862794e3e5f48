"""rlx-conformance list: the case ids of the matrix, one a line."""
from __future__ import annotations

from rlx_conformance.cli.options import add_matrix_options, split, targets
from rlx_conformance.run.session import build_cases


def cmd_list(args) -> int:
    for c in build_cases(targets(args), split(args.ops), split(args.dtypes), tf32=args.tf32):
        print(c.id)
    return 0



def register(sub) -> None:
    ls = sub.add_parser("list", help="print the case ids of the matrix")
    add_matrix_options(ls)
    ls.set_defaults(fn=cmd_list)
