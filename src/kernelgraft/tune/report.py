"""A tuning report per op: what was tried for each key, where the time went, why each candidate lost.

Built from the decisions themselves (``ranking``, ``excluded``, ``phases`` and ``spent``, each
candidate's seconds by phase), so it reads the same for a key tuned in this process, on the caller's thread or off it,
and for one read from the disk cache; keys still being tuned are listed as pending.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from .decision import entry_label

__all__ = ["Tried", "KeyReport", "Report", "build_report"]

# Phases in the order a tuning goes through them (see _phases), then what was not work.
_ORDER = ("queued", "prepare", "compile", "gate", "measure", "host", "paused")
_NAMES = {"gate": "compile+gate", "paused": "paused for serving"}


@dataclasses.dataclass
class Tried:
    """One candidate of one key: ``outcome`` is 'won', 'lost' or 'excluded'; ``why`` says why."""

    label: str
    outcome: str
    why: str
    ms: float | None = None
    gate_s: float | None = None
    measure_s: float | None = None


@dataclasses.dataclass
class KeyReport:
    """One key: its inputs, where its decision came from, its phases (seconds) and candidates."""

    inputs: str
    digest: str
    state: str  # tuned | disk | rank | default | failed | refining | pending
    winner: str | None
    tune_s: float = 0.0
    phases: dict[str, float] = dataclasses.field(default_factory=dict)
    tried: list[Tried] = dataclasses.field(default_factory=list)
    failure: str | None = None  # why its tuning failed (state 'failed': the default candidate serves)

    @property
    def compile_s(self) -> float:
        """Seconds compiling (and gating: a first launch compiles) across candidates."""
        return self.phases.get("compile", 0.0) + self.phases.get("gate", 0.0)

    @property
    def measure_s(self) -> float:
        """Seconds timing candidates (warm-up, timings, finalists, host costs)."""
        return self.phases.get("measure", 0.0) + self.phases.get("host", 0.0)

    def __str__(self) -> str:
        head = f"  {self.inputs}: {self.state}"
        if self.failure:
            head += f" ({self.failure}; the default candidate serves)"
        if self.winner:
            head += f", winner {self.winner}"
        if self.phases:
            parts = [f"{_NAMES.get(n, n)} {self.phases[n]:.2f} s" for n in _ORDER if self.phases.get(n)]
            if self.phases.get("units_under_load"):
                parts.append(f"{int(self.phases['units_under_load'])} units timed under load")
            if self.phases.get("heavy_under_load"):  # compiles here that serving never paused for
                parts.append(f"{int(self.phases['heavy_under_load'])} compiles under load")
            if self.phases.get("ahead_jobs"):  # the compile workers' share (trials._count_ahead)
                failed = int(self.phases.get("ahead_failed", 0))
                parts.append(f"{int(self.phases.get('ahead_compiled', 0))} of {int(self.phases['ahead_jobs'])} "
                             f"candidates compiled ahead" + (f" ({failed} failed, compiled in their gates)"
                                                             if failed else ""))
            if self.phases.get("compiled_here"):  # Triton kernels the gates compiled (triton_compiles)
                parts.append(f"{int(self.phases['compiled_here'])} Triton kernels compiled in the gates")
            if self.phases.get("first_landing"):  # a first decision, without torch:compile, served meanwhile
                parts.append(f"a first decision landed {self.phases['first_landing']:.2f} s after the job was queued")
            head += f" ({self.tune_s:.2f} s: " + ", ".join(parts) + ")"
        lines = [head]
        width = max((len(t.label) for t in self.tried), default=0)
        for t in self.tried:
            ms = f"{t.ms:9.4f} ms" if t.ms is not None else " " * 12
            spent = "".join(f" {name} {v:.2f}s" for name, v in (("gate", t.gate_s), ("time", t.measure_s))
                            if v is not None)
            lines.append(f"    {t.outcome:8} {t.label:{width}} {ms} {t.why}{' [' + spent.strip() + ']' if spent else ''}")
        return "\n".join(lines)


@dataclasses.dataclass
class Report:
    """``kg.tune.report(op)``: one ``KeyReport`` per key of the op known here."""

    op: str
    keys: list[KeyReport]

    @property
    def compile_s(self) -> float:
        return sum(k.compile_s for k in self.keys)

    @property
    def measure_s(self) -> float:
        return sum(k.measure_s for k in self.keys)

    def __str__(self) -> str:
        if not self.keys:
            return f"{self.op}: no tuning decisions"
        head = (f"{self.op}: {len(self.keys)} key(s), {self.compile_s:.2f} s compiling and gating, "
                f"{self.measure_s:.2f} s measuring")
        return "\n".join([head] + [str(k) for k in self.keys])


def _label(entry: dict[str, Any]) -> str:
    try:
        return entry_label(entry)
    except Exception:  # an entry from another version: its raw fields
        return f"{entry.get('backend')}:{entry.get('impl_name')}[{entry.get('config')}]"


def _inputs(key: dict[str, Any]) -> str:
    def one(desc: Any) -> str:
        if isinstance(desc, list) and desc[:1] == ["T"] and len(desc) == 4:
            return f"{str(desc[1]).replace('torch.', '')}[{','.join(map(str, desc[2]))}]{desc[3]}"
        if isinstance(desc, list) and desc[:1] == ["L"] and len(desc) == 2:
            return "[" + ", ".join(one(d) for d in desc[1]) + "]"
        return str(desc[-1]) if isinstance(desc, list) and desc else str(desc)

    return ", ".join(one(d) for d in key.get("args") or [])


def _why_lost(entry: dict[str, Any], best: float | None, margin: float) -> str:
    ms = entry.get("ms")
    if not isinstance(ms, (int, float)) or not best:
        return "ranked below the winner"
    if ms <= best * (1.0 + margin):
        return (f"tied with the winner (within {margin:.0%}): ties go to the eager reference, then to "
                "the candidate listed first")
    return f"{ms / best - 1.0:.1%} slower than the winner"


def key_report(digest: str, decision: Any, margin: float) -> KeyReport:
    ranking, excluded = list(decision.ranking), list(decision.excluded)
    best = ranking[0].get("ms") if ranking else None
    tried = []
    for n, e in enumerate(ranking):
        fastest = min((x.get("ms") for x in ranking if isinstance(x.get("ms"), (int, float))), default=None)
        if n == 0:
            why = ("fastest that passed the gate" if best == fastest else
                   f"within the {margin:.0%} tie margin of the fastest, and first in the tie order")
            outcome = "won"
        else:
            why, outcome = _why_lost(e, best, margin), "lost"
        spent = decision.spent.get(_label(e), {})
        tried.append(Tried(_label(e), outcome, why, e.get("ms"), spent.get("gate"), spent.get("measure")))
    for e in excluded:
        spent = decision.spent.get(_label(e), {})
        tried.append(Tried(_label(e), "excluded", f"{e.get('kind')}: {e.get('reason')}", None,
                           spent.get("gate"), spent.get("measure")))
    state = ("refining" if decision.partial  # a first decision, served while torch:compile's gate runs
             else "failed" if decision.failure
             else decision.source if ranking or excluded or decision.source != "default" else "default")
    return KeyReport(_inputs(decision.key), digest, state, _label(ranking[0]) if ranking else None,
                     float(decision.tune_s or 0.0), dict(decision.phases), tried, decision.failure)


def build_report(op_name: str, decisions: Iterable[tuple[str, Any]], pending: Iterable[str],
                 margin: float) -> Report:
    """The report of ``op_name`` from its ``(digest, Decision)`` pairs and pending job labels."""
    keys = [key_report(digest, d, margin) for digest, d in decisions]
    keys.sort(key=lambda k: k.inputs)
    keys += [KeyReport(label, "", "pending", None) for label in pending]
    return Report(op_name, keys)
