"""The table printed at the end of ``kernelgraft check``: one row per op and candidate."""

from __future__ import annotations

from collections import OrderedDict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .harness import CheckReport

__all__ = ["render", "summarize", "table_console"]


def table_console(table: Table | None = None) -> Console:
    """A console for ``table``: the terminal's width on a terminal; piped (a file, ``| grep``), as
    wide as the table's content, so that no name or note is ever cut."""
    plain = Console()
    if plain.is_terminal or table is None:
        return plain
    wide = Console(width=100_000)
    return Console(width=max(80, wide.measure(table).maximum))


def summarize(report: CheckReport) -> list[dict]:
    rows: "OrderedDict[tuple[str, str], dict]" = OrderedDict()
    first: dict[tuple[str, str], str] = {}
    also: dict[tuple[str, str], dict[str, None]] = {}
    for r in report.results:
        row = rows.setdefault(
            (r.op, r.candidate),
            dict(op=r.op, candidate=r.candidate, passed=0, failed=0, compiled=0, skipped=0, notrun=0, worst=0.0,
                 note=""),
        )
        if r.status == "pass":
            row["passed"] += 1
        elif r.status == "fail":
            row["failed"] += 1
            if row["failed"] == 1:  # the first failure speaks for the row
                row["note"] = f"{r.sample} ({r.variant}): {r.note}"
                first[(r.op, r.candidate)] = r.variant
            elif r.variant != first.get((r.op, r.candidate)):  # and the other variants it fails are named
                also.setdefault((r.op, r.candidate), {})[r.variant] = None
        elif r.status == "notrun":  # never ran: the candidate is not ok
            row["notrun"] += 1
            if not row["failed"] and row["notrun"] == 1:
                row["note"] = f"{r.sample} ({r.variant}): {r.note}"
        elif r.status == "compiled":
            row["compiled"] += 1
            if not row["failed"] and not row["notrun"] and (not row["note"] or row["note"].startswith("skipped")):
                row["note"] = r.note
        else:
            row["skipped"] += 1
            if not row["note"] and not row["failed"] and not row["notrun"]:
                row["note"] = f"skipped: {r.note}"
        if r.tol:
            row["worst"] = max(row["worst"], r.error / r.tol)
        elif r.status == "fail" and r.error:
            row["worst"] = float("inf")
    for key, variants in also.items():
        names = [v for v in variants if v not in ("contiguous", "noncontiguous")]
        if names:
            more = f" and {len(names) - 4} more" if len(names) > 4 else ""
            note = rows[key]["note"]
            note = note if len(note) <= 500 else note[:497] + "..."
            rows[key]["note"] = f"{note} (also fails on: {'; '.join(names[:4])}{more})"
    return list(rows.values())


def _status(row: dict) -> str:
    if row["failed"]:
        return "[red]FAIL"
    if row["notrun"]:
        return "[red]NOT RUN"
    if row["passed"]:
        return "[green]ok"
    if row["compiled"]:
        return "[green]compiled"
    return "[yellow]skip"


def render(report: CheckReport, console: Console | None = None) -> None:
    rows = summarize(report)
    table = Table(title="kernelgraft check", show_lines=False)
    for name in ("op", "candidate", "pass", "fail", "compiled", "skip", "worst err/tol", "status", "note"):
        names = [row.get(name, "") for row in rows] if name in ("op", "candidate") else []
        # names are never cut: their column is at least as wide as the longest one
        table.add_column(name, overflow="fold", no_wrap=bool(names),
                         min_width=max((len(n) for n in names), default=None))
    for row in rows:
        table.add_row(
            escape(row["op"]), escape(row["candidate"]), str(row["passed"]), str(row["failed"]),
            str(row["compiled"]), str(row["skipped"]), f"{row['worst']:.3g}", _status(row),
            escape(row["note"][:900]),
        )
    console = console or table_console(table)
    console.print(table)
    failed = len(report.failures)
    passed = sum(r.status == "pass" for r in report.results)
    compiled = sum(r.status == "compiled" for r in report.results)
    notrun = sum(r.status == "notrun" for r in report.results)
    failed -= notrun
    skipped = len(report.results) - passed - failed - compiled - notrun
    console.print(f"checks: {passed} passed, {failed} failed, {compiled} compiled only (cannot run here), "
                  f"{skipped} skipped" + (f", {notrun} not run" if notrun else ""))
