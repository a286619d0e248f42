"""The check harness: for every sample input (and a non-contiguous copy of it) and every
candidate, poison the outputs, run the kernel, and judge what it produced with the oracle
(``kernelgraft._verify``: the rule the tuner's gate and graft verification use too). Then compare
fake and real output metadata and run ``torch.library.opcheck``."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from .. import _verify
from .._op._candidates import Candidate
from .._op._compete import is_torch
from .._errors import KernelgraftError
from ..aot._build import signature_label
from . import _inputs
from ._compile import COMPILABLE, Compiler, NotCompiled, compiler_message

__all__ = ["Result", "CheckReport", "check_op"]

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
        result = op(*_verify.clone(args))
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
        torch.library.opcheck(op.overload, _verify.clone(args))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Result(**base, status="fail", note=first[:300])
    return Result(**base, status="pass")


def check_op(
    op: Any,
    *,
    device: str | None = None,
    noncontiguous: bool = True,
    opcheck: bool = True,
    opcheck_samples: int = 2,
    compile_arch: str | None = "sm_90",
) -> CheckReport:
    """Check every candidate of ``op`` on its sample inputs; see the module docstring.

    A candidate that cannot run here (no GPU, a GPU older than it needs) is compiled for
    ``compile_arch`` instead (or the newer arch it needs): status ``compiled``, or ``fail`` with the
    compiler's message. ``compile_arch=None`` skips such candidates without compiling.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = CheckReport()
    compiler = Compiler(op, compile_arch) if compile_arch else None
    try:
        samples = _inputs.samples(op, device)
    except Exception as exc:
        report.results.append(Result(op.name, "-", "-", "-", "fail", note=f"sample_inputs failed: {exc}"))
        return report
    if not samples:
        report.results.append(
            Result(op.name, "-", "-", "-", "fail",
                   note="no sample inputs; give kg.op(..., sample_inputs=fn) yielding argument tuples")
        )
        return report
    for index, args in enumerate(samples):
        variants = [("contiguous", args)]
        if noncontiguous:
            strided = _inputs.noncontiguous(op, args)
            if strided is not None:
                variants.append(("noncontiguous", strided))
        for variant, vargs in variants:
            sample = signature_label(vargs)
            try:
                # the kernels: torch:eager/torch:compile are the reference itself (see _compete)
                candidates = [c for c in op.candidates(*vargs) if not is_torch(c)]
                out_specs = op.dispatcher.output_specs(vargs)
                _verify.check_tolerances(op.tolerances, op.name)
                ref = _verify.reference(op, vargs)
            except KernelgraftError as exc:
                report.results.append(Result(op.name, "-", sample, variant, "fail", note=str(exc)[:300]))
                continue
            except Exception as exc:  # the reference or meta raised: report it, check the other ops
                report.results.append(Result(op.name, "-", sample, variant, "fail",
                                             note=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            for candidate in candidates:
                report.results.append(
                    _check_candidate(op, candidate, vargs, out_specs, ref, sample, variant, compiler)
                )
            if any(c.supported for c in candidates) or variant == "contiguous":
                report.results.append(_check_metadata(op, vargs, sample, variant))
            if opcheck and index < opcheck_samples and variant == "contiguous":
                report.results.append(_opcheck(op, vargs, sample, variant))
    return report
