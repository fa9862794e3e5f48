"""Console output shared by the commands, made for terminals and for logs alike.

Why: a rich table folds its cells at the terminal's width (80 columns in a pipe or CI), so a
case id or a command inside a cell came out split across lines and could not be copied. Here
tables carry only short cells (names, counts, errors); case ids, paths and commands are printed
as plain lines that are never wrapped or cut at any width (``line``/``case_item``), and messages
go on lines of their own, shortened at a word boundary only when very long (``message_lines``),
saying that results.json holds them whole.

``--format json`` (``add_format_option``) replaces the text with one JSON document on stdout
(``emit_json``): an object whose ``schema`` is ``rlx-conformance/<command>/v1``; each command's
docstring lists its keys, and keys are only ever added to a version.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from rlx_conformance.core.results import _jsonable as jsonable

FORMATS = ("text", "json")

# A message longer than this is shortened (at a word boundary, with an ellipsis) in the terminal.
MESSAGE_LIMIT = 600

DETAIL = "    "  # the detail lines under a ``case_item``, past its indent


def add_format_option(p: argparse.ArgumentParser, choices: Sequence[str] = FORMATS,
                      default: str = "text", help: str | None = None) -> None:
    """The one ``--format`` option of every command that prints a table or a summary."""
    p.add_argument("--format", choices=tuple(choices), default=default,
                   help=help or "text (default; case ids and commands on lines of their own, never "
                                "wrapped) or json: one document on stdout "
                                "(schema rlx-conformance/<command>/v1)")


def schema(command: str) -> str:
    return f"rlx-conformance/{command}/v1"


def emit_json(command: str, doc: dict[str, Any]) -> None:
    """``doc`` as one JSON document on stdout, ``schema`` first; numbers as results.json writes
    them (NaN null, infinities "inf"/"-inf")."""
    out = {"schema": schema(command), **doc}
    sys.stdout.write(json.dumps(jsonable(out), indent=1, allow_nan=False) + "\n")


def console() -> Console:
    """The console tables go to: stdout at the terminal's width (COLUMNS, else 80 in a pipe)."""
    return Console(highlight=False)


def line(text: str = "") -> None:
    """A line that is never wrapped or cut, whatever the width (ids, paths, commands)."""
    print(text)


def table(title: str | None, columns: Sequence[str], rows: Iterable[Sequence[str]],
          right: Sequence[str] = ()) -> None:
    """A table of short cells (no case ids, paths or commands: those go through ``line``)."""
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", overflow="fold")
    for r in rows:
        t.add_row(*r)
    console().print(t)


def shorten(text: str, limit: int = MESSAGE_LIMIT) -> tuple[str, bool]:
    """``text`` cut to at most ``limit`` characters at a word boundary, with an ellipsis; and
    whether it was cut."""
    if len(text) <= limit:
        return text, False
    cut = text[:limit]
    space = max(cut.rfind(" "), cut.rfind("\n"))
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip() + " …", True


def message_lines(message: str, limit: int = MESSAGE_LIMIT, where: str = "results.json") -> list[str]:
    """A message as lines of its own (its own line breaks kept), shortened only when longer than
    ``limit``, then saying where the whole of it is."""
    if not message:
        return []
    text, cut = shorten(message.strip(), limit)
    lines = text.splitlines()
    if cut:
        lines.append(f"(message shortened; the whole of it is in {where})")
    return lines


def case_item(outcome: str, case_id: str, details: Sequence[str] = (), indent: str = "  ") -> None:
    """One case: ``<indent><outcome>  <id>`` on a line of its own, then its detail lines under it,
    indented four more."""
    line(f"{indent}{outcome}  {case_id}")
    for d in details:
        line(f"{indent}{DETAIL}{d}")


def quote(word: str) -> str:
    """``word`` single-quoted for a POSIX shell (a case id holds no quote, but be safe)."""
    return "'" + word.replace("'", "'\\''") + "'"


def rerun_command(case_id: str) -> str:
    """The command that reruns one case of the matrix."""
    return f"rlx-conformance run --case {quote(case_id)}"


def errors_text(max_ulp: float | None, max_abs: float | None, max_rel: float | None) -> str:
    """The measured errors of a case, or '' where none was measured."""
    parts = [f"{name} {v:.3g}" for name, v in (("max ulp", max_ulp), ("max abs", max_abs),
                                                 ("max rel", max_rel)) if v is not None]
    return ", ".join(parts)
