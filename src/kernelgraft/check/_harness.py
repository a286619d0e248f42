"""The check harness: for every sample input (and a non-contiguous copy of it) and every
candidate, poison the outputs, run the kernel, and judge what it produced with the oracle
(``kernelgraft._verify``: the rule the tuner's gate and graft verification use too). Then compare
fake and real output metadata and run ``torch.library.opcheck``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import torch

from .. import _verify
from .._op._candidates import Candidate
from .._op._compete import is_torch
from .._errors import KernelgraftError
from ..aot._build import signature_label
from ..tune._modes import tune
from . import _inputs
from ._compile import COMPILABLE, Compiler, NotCompiled, compiler_message

__all__ = ["Result", "CheckReport", "CheckOptions", "Key", "Plan", "check_op", "iter_check"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Result:
    op: str
    candidate: str  # a candidate label, "meta" or "opcheck"
    sample: str
    variant: str  # contiguous | noncontiguous
    status: str  # pass | fail | skip | compiled (cannot run here; compiled for a GPU arch)
    error: float = 0.0  # the worst element's |got - want| (inf: NaN, Inf or bits where not expected)
    tol: float = 0.0  # what the rule allowed at that element (0: bit-exact)
    note: str = ""


@dataclasses.dataclass
class CheckReport:
    results: list[Result] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.results) and not self.failures

    @property
    def failures(self) -> list[Result]:
        return [r for r in self.results if r.status == "fail"]

    def extend(self, other: "CheckReport") -> None:
        self.results.extend(other.results)


def _run_candidate(op: Any, candidate: Candidate, args: tuple, out_specs) -> list[torch.Tensor]:
    run_args = _verify.clone(args)
    outs = [_verify.poisoned(s, d, dev) for s, d, dev in out_specs]
    op.dispatcher.runner(candidate)(*run_args, *outs)
    produced = list(outs)
    for index in op.signature.mutated:
        produced.extend(_verify.tensors(run_args[index]))
    for device in {t.device for t in produced}:
        _verify.sync(device)
    return produced


def _compile_only(compiler: Compiler | None, candidate, args, out_specs, base) -> Result:
    """A candidate that cannot run here, compiled instead (contiguous samples: what AOT builds)."""
    if compiler is None or candidate.category not in COMPILABLE or base["variant"] != "contiguous":
        return Result(**base, status="skip", note=candidate.reason or "")
    try:
        note = compiler(candidate, args, out_specs)
    except NotCompiled as exc:
        return Result(**base, status="skip", note=f"{candidate.reason}; not compiled: {exc}")
    except Exception as exc:  # the compiler's verdict on the candidate (or its launch function's error)
        log.debug("%s %s: compile-only check failed", base["op"], candidate.label, exc_info=True)
        return Result(**base, status="fail", note=f"does not compile: {compiler_message(exc)}")
    return Result(**base, status="compiled", note=note)


def _check_candidate(op, candidate, args, out_specs, ref, sample, variant, compiler=None) -> Result:
    base = dict(op=op.name, candidate=candidate.label, sample=sample, variant=variant)
    if not candidate.supported:
        return _compile_only(compiler, candidate, args, out_specs, base)
    try:
        produced = _run_candidate(op, candidate, args, out_specs)
    except Exception as exc:
        return Result(**base, status="fail", error=float("inf"), note=f"{type(exc).__name__}: {exc}"[:300])
    verdict = _verify.verify(ref, produced, op.tolerances)
    worst = verdict.worst
    note = worst.problem if worst is not None and worst.problem else ""
    if verdict.note:
        note = f"{note}; {verdict.note}" if note else verdict.note
    return Result(**base, status="pass" if verdict.ok else "fail",
                  error=worst.error if worst else 0.0, tol=worst.allowed if worst else 0.0, note=note)


def _check_metadata(op, args, sample, variant) -> Result:
    base = dict(op=op.name, candidate="meta", sample=sample, variant=variant)
    try:
        specs = op.dispatcher.output_specs(args)
        with tune("off"):  # a check never tunes: tuning would run every candidate, the failing ones
            result = op(*_verify.clone(args))  # too, outside the steps that isolate and blame them
        for dev in {t.device for t in _verify.tensors(result if result is not None else ())}:
            _verify.sync(dev)
    except Exception as exc:
        return Result(**base, status="fail", note=f"{type(exc).__name__}: {exc}"[:300])
    real = [] if result is None else [result] if isinstance(result, torch.Tensor) else list(result)
    if len(real) != len(specs):
        return Result(**base, status="fail", note=f"{len(real)} outputs, fake kernel gives {len(specs)}")
    for i, (t, (shape, dtype, dev)) in enumerate(zip(real, specs)):
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != dev or not t.is_contiguous():
            return Result(
                **base, status="fail",
                note=f"output {i}: real {signature_label((t,))} on {t.device} vs fake {dtype}{list(shape)} on {dev}",
            )
    return Result(**base, status="pass")


def _opcheck(op, args, sample, variant) -> Result:
    base = dict(op=op.name, candidate="opcheck", sample=sample, variant=variant)
    try:
        with tune("off"):
            torch.library.opcheck(op.overload, _verify.clone(args))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Result(**base, status="fail", note=first[:300])
    return Result(**base, status="pass")


# A step of an op's check, named the same in every process that runs it: (sample index, variant,
# what runs: a candidate label, "reference", "meta" or "opcheck"). The isolated runner uses keys to
# resume an op in a fresh process after a crash without re-running what already reported.
Key = tuple[int, str, str]
SAMPLES_KEY: Key = (-1, "-", "-")  # calling the op's sample_inputs


@dataclasses.dataclass(frozen=True)
class CheckOptions:
    """How to check an op (see ``check_op``); plain values, so a child process can receive it."""

    device: str | None = None
    noncontiguous: bool = True
    opcheck: bool = True
    opcheck_samples: int = 2
    compile_arch: str | None = "sm_90"


@dataclasses.dataclass(frozen=True)
class Plan:
    """Which steps of an op's check to run: none in ``done``, none of a candidate (or "meta",
    "opcheck") in ``excluded``, and only those in ``only`` when it is given."""

    done: frozenset[Key] = frozenset()
    excluded: frozenset[str] = frozenset()
    only: frozenset[Key] | None = None

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


def _announce_nothing(key: Key, sample: str, variant: str) -> None:
    pass


def iter_check(
    op: Any,
    options: CheckOptions = CheckOptions(),
    *,
    plan: Plan = Plan(),
    announce=_announce_nothing,
) -> Iterator[tuple[Key, Result]]:
    """The results of checking ``op``, each with its step's key, as they come.

    ``announce(key, sample, variant)`` is called before each step that runs user code, so a
    process watching this one knows what was running if it dies. ``plan`` says which steps to run
    (the isolated runner resumes or re-runs part of an op with it).
    """
    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    compiler = Compiler(op, options.compile_arch) if options.compile_arch else None
    announce(SAMPLES_KEY, "-", "-")
    try:
        samples = _inputs.samples(op, device)
    except Exception as exc:
        yield SAMPLES_KEY, Result(op.name, "-", "-", "-", "fail", note=f"sample_inputs failed: {exc}")
        return
    if not samples:
        yield SAMPLES_KEY, Result(op.name, "-", "-", "-", "fail",
                                  note="no sample inputs; give kg.op(..., sample_inputs=fn) yielding argument tuples")
        return
    for index, args in enumerate(samples):
        variants = [("contiguous", args)]
        if options.noncontiguous:
            strided = _inputs.noncontiguous(op, args)
            if strided is not None:
                variants.append(("noncontiguous", strided))
        for variant, vargs in variants:
            setup = (index, variant, "reference")
            if setup in plan.done:
                continue
            sample = signature_label(vargs)
            announce(setup, sample, variant)
            try:
                # the kernels: torch:eager/torch:compile are the reference itself (see _compete)
                candidates = [c for c in op.candidates(*vargs) if not is_torch(c)]
                out_specs = op.dispatcher.output_specs(vargs)
                _verify.check_tolerances(op.tolerances, op.name)
            except Exception as exc:  # meta or the op's spec raised: report it, check the other samples
                yield setup, Result(op.name, "-", sample, variant, "fail", note=_exception_note(exc))
                continue
            todo = [c for c in candidates if plan.wants((index, variant, c.label))]
            meta = ((any(c.supported for c in candidates) or variant == "contiguous")
                    and plan.wants((index, variant, "meta")))
            check = (options.opcheck and index < options.opcheck_samples and variant == "contiguous"
                     and plan.wants((index, variant, "opcheck")))
            if not (todo or meta or check):
                continue
            try:
                ref = _verify.reference(op, vargs)
                unstable = _nondeterminism(op, vargs, ref)
            except Exception as exc:  # the reference raised: report it, check the other samples
                yield setup, Result(op.name, "reference", sample, variant, "fail", note=_exception_note(exc))
                continue
            if unstable:  # one row for the op: every candidate would fail against a moving target
                yield setup, Result(op.name, "reference", sample, variant, "fail", error=float("inf"),
                                    note=unstable)
                return
            for candidate in todo:
                key = (index, variant, candidate.label)
                announce(key, sample, variant)
                yield key, _check_candidate(op, candidate, vargs, out_specs, ref, sample, variant, compiler)
            if meta:
                announce((index, variant, "meta"), sample, variant)
                yield (index, variant, "meta"), _check_metadata(op, vargs, sample, variant)
            if check:
                announce((index, variant, "opcheck"), sample, variant)
                yield (index, variant, "opcheck"), _opcheck(op, vargs, sample, variant)


def _exception_note(exc: BaseException) -> str:
    if isinstance(exc, KernelgraftError):
        return str(exc)[:300]
    return f"{type(exc).__name__}: {exc}"[:300]


def check_op(
    op: Any,
    *,
    device: str | None = None,
    noncontiguous: bool = True,
    opcheck: bool = True,
    opcheck_samples: int = 2,
    compile_arch: str | None = "sm_90",
    isolate: bool = False,
) -> CheckReport:
    """Check every candidate of ``op`` on its sample inputs; see the module docstring.

    A candidate that cannot run here (no GPU, a GPU older than it needs) is compiled for
    ``compile_arch`` instead (or the newer arch it needs): status ``compiled``, or ``fail`` with the
    compiler's message. ``compile_arch=None`` skips such candidates without compiling.

    ``isolate=True`` runs the candidates in a child process: one that crashes it (a segfault from
    an out-of-bounds store, a CUDA illegal address that kills the context) becomes that
    candidate's failure and the check goes on. Off by default: in-process, a debugger, a profiler
    and the caller's state (tuning decisions, monkeypatches) see the kernels run, and nothing is
    re-imported. ``kernelgraft check`` isolates unless given ``--no-isolate``.
    """
    options = CheckOptions(device, noncontiguous, opcheck, opcheck_samples, compile_arch)
    if isolate:
        from ._isolate import check_isolated

        return check_isolated([op], options)
    return CheckReport([result for _, result in iter_check(op, options)])
