"""The check harness: for every sample input, its variants (a non-contiguous copy, and the inputs
derived from it, ``_derive``) and every candidate, run the kernel in guarded memory and judge
what it produced with the oracle (``kernelgraft.verify.oracle``) and what else it wrote with the guard
rule (``kernelgraft.verify.guard``): the rules the tuner's gate and graft verification use too. Then
compare fake and real output metadata, run ``torch.library.opcheck`` over the op and over every
candidate, and trace the op under ``torch.compile`` and ``torch.export`` (``_steps``)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..verify import oracle as _verify
from ..op.compete import is_torch
from ..aot.build import signature_label
from ..op import samples as _inputs
from . import derive as _derive, steps as _steps
from .compile import Compiler
from .steps import Result

__all__ = ["Result", "CheckReport", "CheckOptions", "Key", "Plan", "iter_check"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class CheckReport:
    results: list[Result] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every step ran and none failed."""
        return bool(self.results) and not self.failures

    @property
    def failures(self) -> list[Result]:
        """The failed steps and those that never ran."""
        return [r for r in self.results if r.status in ("fail", "notrun")]

    def extend(self, other: "CheckReport") -> None:
        self.results.extend(other.results)


# A step of an op's check, named the same in every process that runs it: (sample index, variant,
# who runs: a candidate label, "reference", "meta", "opcheck" or "trace", and what: RUN or
# OPCHECK, a candidate under torch.library.opcheck). The isolated runner uses keys to resume an
# op in a fresh process after a crash without re-running what already reported.
Key = tuple[int, str, str, str]
RUN, OPCHECK = "run", "opcheck"
SAMPLES_KEY: Key = (-1, "-", "-", RUN)  # calling the op's sample_inputs and deriving variants


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """How to check an op (see ``check_op``); plain values, so a child process can receive it."""

    device: str | None = None
    noncontiguous: bool = True
    opcheck: bool = True
    opcheck_samples: int = 2
    compile_arch: str | None = "sm_90"
    derived_samples: int = 2  # samples the derived inputs are built from (``_derive``)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which steps of an op's check to run: none in ``done``, none of a candidate (or "meta",
    "opcheck") in ``excluded``, and only those in ``only`` when it is given. Candidates in
    ``failed`` failed a step already: their opcheck is not run (a kernel runs outside guarded
    memory only once it passed there)."""

    done: frozenset[Key] = frozenset()
    excluded: frozenset[str] = frozenset()
    only: frozenset[Key] | None = None
    failed: frozenset[str] = frozenset()

    def wants(self, key: Key) -> bool:
        return key not in self.done and key[2] not in self.excluded and (self.only is None or key in self.only)


def _nondeterminism(op, args, ref: _verify.Reference) -> str | None:
    """Run the reference once more on the same inputs; a difference the oracle would fail a kernel
    for (native against native, so the rule's native-precision widening applies) is reported:
    every candidate would be blamed for it otherwise."""
    again = _verify.reference(op, args)
    first = _verify.Reference(tuple(_verify.Expected(e.what, e.native, None) for e in ref.expected))
    verdict = _verify.verify(first, [e.native for e in again.expected], op.tolerances)
    if verdict.ok:
        return None
    worst = verdict.worst
    return (f"the reference of {op.name} is not deterministic: two runs on the same inputs differ at "
            f"{worst.problem if worst is not None else 'an output'} "
            "(seed it, or make it a pure function of its inputs)")


def _nothing(*_: Any) -> None:
    pass


def _units(op: Any, samples: list[tuple], options: CheckOptions) -> list[tuple[int, str, tuple]]:
    """(sample index, variant, arguments): each sample, its strided copy and its derived inputs."""
    units = []
    for index, args in enumerate(samples):
        units.append((index, "contiguous", args))
        if not options.noncontiguous:
            continue
        strided = _inputs.noncontiguous(op, args)
        if strided is not None:
            units.append((index, "noncontiguous", strided))
        if index < options.derived_samples:
            units.extend((index, name, derived) for name, derived in _derive.variants(op, args))
    return units


def check_inputs(op: Any, device: str = "cpu", options: CheckOptions | None = None) -> list[tuple[str, tuple]]:
    """(variant, arguments) for every input ``check`` runs ``op``'s candidates on, in its order:
    each sample, its strided copy and its derived inputs. Kernels are run on guarded copies of
    these (``kernelgraft.verify.guard.Call``); a build machine that compiles ahead for check (cuTile
    cubins for a machine without the compiler) wants both."""
    return [(variant, args) for _, variant, args in _units(op, _inputs.samples(op, device), options or CheckOptions())]


def _steps_of(index: int, variant: str, candidates, options: CheckOptions) -> list[Key]:
    keys = [(index, variant, c.label, RUN) for c in candidates]
    if any(c.supported for c in candidates) or variant == "contiguous":
        keys.append((index, variant, "meta", RUN))
    if options.opcheck and variant == "contiguous":
        if index < options.opcheck_samples:
            keys.append((index, variant, "opcheck", RUN))
        if index == 0:
            keys += [(index, variant, c.label, OPCHECK) for c in candidates if c.supported]
            keys.append((index, variant, "trace", RUN))
    return keys


def iter_check(
    op: Any,
    options: CheckOptions = CheckOptions(),
    *,
    plan: Plan = Plan(),
    announce: Callable[[Key, str, str], None] = _nothing,
    planned: Callable[[list[Key], str, str], None] = _nothing,
) -> Iterator[tuple[Key, Result]]:
    """The results of checking ``op``, each with its step's key, as they come.

    ``announce(key, sample, variant)`` is called before each step that runs user code, so a
    process watching this one knows what was running if it dies; ``planned(keys, sample,
    variant)`` once a variant's steps are known, before they run. ``plan`` says which steps to run
    (the isolated runner resumes or re-runs part of an op with it).
    """
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    compiler = Compiler(op, options.compile_arch) if options.compile_arch else None
    announce(SAMPLES_KEY, "-", "-")
    try:
        samples = _inputs.samples(op, device)
        units = _units(op, samples, options)
    except Exception as exc:
        yield SAMPLES_KEY, Result(op.name, "-", "-", "-", "fail", note=f"sample_inputs failed: {exc}")
        return
    if not samples:
        yield SAMPLES_KEY, Result(op.name, "-", "-", "-", "fail",
                                  note="no sample inputs; give kg.op(..., sample_inputs=fn) yielding argument tuples")
        return
    failed = set(plan.failed)
    later: list[tuple[Key, tuple, str, Any]] = []  # opcheck and trace: after every kernel has run guarded
    for index, variant, vargs in units:
        setup = (index, variant, "reference", RUN)
        if setup in plan.done:  # the reference failed here before: its row says so
            continue
        sample = signature_label(vargs)
        announce(setup, sample, variant)
        try:
            # the kernels: torch:eager/torch:compile are the reference itself (see _compete)
            candidates = [c for c in op.candidates(*vargs) if not is_torch(c)]
            out_specs = op.dispatcher.output_specs(vargs)
            _verify.check_tolerances(op.tolerances, op.name)
        except Exception as exc:  # meta or the op's spec raised: report it, check the other samples
            yield setup, Result(op.name, "-", sample, variant, "fail", note=_steps.exception_note(exc))
            continue
        by_label = {c.label: c for c in candidates}
        keys = [k for k in _steps_of(index, variant, candidates, options) if plan.wants(k)]
        now = [k for k in keys if k[3] == RUN and k[2] not in ("opcheck", "trace")]
        alone = plan.only is not None and setup in plan.only  # the reference step re-run by itself
        if now or alone:
            try:
                ref = _verify.reference(op, vargs)
                unstable = _nondeterminism(op, vargs, ref)
            except Exception as exc:  # the reference raised: report it, check the other samples
                yield setup, Result(op.name, "reference", sample, variant, "fail", note=_steps.exception_note(exc))
                continue
            if unstable:  # one row for the op: every candidate would fail against a moving target
                yield setup, Result(op.name, "reference", sample, variant, "fail", error=float("inf"), note=unstable)
                return
        if keys:
            planned(keys, sample, variant)
        later += [(k, vargs, sample, by_label.get(k[2])) for k in keys if k not in now]
        for key in now:
            announce(key, sample, variant)
            if key[2] == "meta":
                result = _steps.check_metadata(op, vargs, sample, variant)
            else:
                result = _steps.check_candidate(op, by_label[key[2]], vargs, out_specs, ref, sample, variant,
                                                compiler)
                if result.status == "fail":
                    failed.add(key[2])
            yield key, result
    for key, vargs, sample, candidate in later:
        if key[3] == OPCHECK and key[2] in failed:
            continue  # it failed in guarded memory: outside it, it could corrupt this process
        announce(key, sample, key[1])
        if key[2] == "trace":
            yield key, _steps.trace(op, vargs, sample)
        else:
            yield key, _steps.opcheck(op, vargs, sample, candidate)
