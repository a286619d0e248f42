"""The table printed at the end of ``kernelgraft check``: one row per op and candidate."""

from __future__ import annotations

from collections import OrderedDict

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ._harness import CheckReport

__all__ = ["render", "summarize"]


def summarize(report: CheckReport) -> list[dict]:
    rows: "OrderedDict[tuple[str, str], dict]" = OrderedDict()
    for r in report.results:
        row = rows.setdefault(
            (r.op, r.candidate),
            dict(op=r.op, candidate=r.candidate, passed=0, failed=0, skipped=0, worst=0.0, note=""),
        )
        if r.status == "pass":
            row["passed"] += 1
        elif r.status == "fail":
            row["failed"] += 1
            if not row["note"] or row["note"].startswith("skipped"):
                row["note"] = f"{r.sample} ({r.variant}): {r.note}"
        else:
            row["skipped"] += 1
            if not row["note"] and not row["failed"]:
                row["note"] = f"skipped: {r.note}"
        if r.tol:
            row["worst"] = max(row["worst"], r.error / r.tol)
        elif r.status == "fail" and r.error:
            row["worst"] = float("inf")
    return list(rows.values())


def render(report: CheckReport, console: Console | None = None) -> None:
    console = console or Console(width=200)
    table = Table(title="kernelgraft check", show_lines=False)
    for name in ("op", "candidate", "pass", "fail", "skip", "worst err/tol", "status", "note"):
        table.add_column(name, overflow="fold", no_wrap=name in ("op", "candidate"))
    for row in summarize(report):
        status = "[red]FAIL" if row["failed"] else "[green]ok" if row["passed"] else "[yellow]skip"
        table.add_row(
            escape(row["op"]), escape(row["candidate"]), str(row["passed"]), str(row["failed"]),
            str(row["skipped"]), f"{row['worst']:.3g}", status, escape(row["note"][:400]),
        )
    console.print(table)
    failed = len(report.failures)
    passed = sum(r.status == "pass" for r in report.results)
    skipped = len(report.results) - passed - failed
    console.print(f"checks: {passed} passed, {failed} failed, {skipped} skipped (candidate cannot run here)")
