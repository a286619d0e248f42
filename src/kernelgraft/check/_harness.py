"""The check harness: for every sample input (and a non-contiguous copy of it) and every
candidate, poison the outputs, run the kernel, and compare with the reference computed in float64
(bit-exact for integer and 8-bit outputs). Then compare fake and real output metadata and run
``torch.library.opcheck``."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from .._op._candidates import Candidate
from .._errors import KernelgraftError
from . import _compare, _inputs

__all__ = ["Result", "CheckReport", "check_op"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Result:
    op: str
    candidate: str  # a candidate label, "meta" or "opcheck"
    sample: str
    variant: str  # contiguous | noncontiguous
    status: str  # pass | fail | skip
    error: float = 0.0
    tol: float = 0.0
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


def _label(args: tuple) -> str:
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            dt = str(a.dtype).removeprefix("torch.")
            parts.append(f"{dt}{list(a.shape)}")
        elif isinstance(a, (list, tuple)):
            parts.append(f"[{len(a)} tensors]")
        else:
            parts.append(repr(a))
    return " ".join(parts)


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _outputs(op: Any, result: Any, args: tuple) -> list[torch.Tensor]:
    """Everything an op produces: returned tensors, then mutated arguments."""
    if result is None:
        produced: list[torch.Tensor] = []
    elif isinstance(result, torch.Tensor):
        produced = [result]
    else:
        produced = list(result)
    for index in op.signature.mutated:
        produced.extend(_inputs.iter_tensors(args[index]))
    return produced


def _references(op: Any, args: tuple) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, str]:
    """Reference outputs at native precision and (when it runs) in float64."""
    native_args = _inputs.clone_args(args)
    native = _outputs(op, op.reference(*native_args), native_args)
    wide_args = _compare.upcast(_inputs.clone_args(args))
    try:
        wide = _outputs(op, op.reference(*wide_args), wide_args)
    except Exception as exc:  # a reference that cannot run in float64 is compared natively
        return native, None, f"float64 reference failed ({type(exc).__name__}); compared at native precision"
    return native, wide, ""


def _run_candidate(op: Any, candidate: Candidate, args: tuple, out_specs, device: str) -> list[torch.Tensor]:
    run_args = _inputs.clone_args(args)
    outs = [_compare.poison(torch.empty(s, dtype=d, device=dev)) for s, d, dev in out_specs]
    op._runner(candidate)(*run_args, *outs)
    _sync(device)
    produced = list(outs)
    for index in op.signature.mutated:
        produced.extend(_inputs.iter_tensors(run_args[index]))
    return produced


def _check_candidate(op, candidate, args, out_specs, refs, device, sample, variant) -> Result:
    native, wide, note = refs
    base = dict(op=op.name, candidate=candidate.label, sample=sample, variant=variant)
    if not candidate.supported:
        return Result(**base, status="skip", note=candidate.reason or "")
    try:
        produced = _run_candidate(op, candidate, args, out_specs, device)
    except Exception as exc:
        return Result(**base, status="fail", error=float("inf"), note=f"{type(exc).__name__}: {exc}"[:300])
    worst, worst_tol, worst_note, passed = 0.0, 0.0, note, True
    for i, out in enumerate(produced):
        tol = _compare.tolerance(out.dtype, op.tolerances)
        exact = tol == _compare.EXACT
        expected = native[i] if exact or wide is None else wide[i]
        if wide is None and not exact:
            tol = max(tol, _compare.tolerance(out.dtype) * 4)
        ok, err, why = _compare.compare(out, expected, tol)
        ratio = err / tol if tol else err
        if not ok or ratio >= (worst / worst_tol if worst_tol else worst):
            worst, worst_tol = err, tol
            if why:
                worst_note = f"output {i}: {why}"
        passed = passed and ok
    return Result(**base, status="pass" if passed else "fail", error=worst, tol=worst_tol, note=worst_note)


def _check_metadata(op, args, sample, variant, device) -> Result:
    base = dict(op=op.name, candidate="meta", sample=sample, variant=variant)
    try:
        specs = op._output_specs(args)
        result = op(*_inputs.clone_args(args))
        _sync(device)
    except Exception as exc:
        return Result(**base, status="fail", note=f"{type(exc).__name__}: {exc}"[:300])
    real = [] if result is None else [result] if isinstance(result, torch.Tensor) else list(result)
    if len(real) != len(specs):
        return Result(**base, status="fail", note=f"{len(real)} outputs, fake kernel gives {len(specs)}")
    for i, (t, (shape, dtype, dev)) in enumerate(zip(real, specs)):
        if tuple(t.shape) != tuple(shape) or t.dtype != dtype or t.device != dev or not t.is_contiguous():
            return Result(
                **base, status="fail",
                note=f"output {i}: real {_label((t,))} on {t.device} vs fake {dtype}{list(shape)} on {dev}",
            )
    return Result(**base, status="pass")


def _opcheck(op, args, sample, variant) -> Result:
    base = dict(op=op.name, candidate="opcheck", sample=sample, variant=variant)
    try:
        torch.library.opcheck(op.overload, _inputs.clone_args(args))
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
) -> CheckReport:
    """Check every candidate of ``op`` on its sample inputs; see the module docstring."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    report = CheckReport()
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
            sample = _label(vargs)
            try:
                candidates = op.candidates(*vargs)
                out_specs = op._output_specs(vargs)
                refs = _references(op, vargs)
            except KernelgraftError as exc:
                report.results.append(Result(op.name, "-", sample, variant, "fail", note=str(exc)[:300]))
                continue
            except Exception as exc:  # the reference or meta raised: report it, check the other ops
                report.results.append(Result(op.name, "-", sample, variant, "fail",
                                             note=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            for candidate in candidates:
                report.results.append(
                    _check_candidate(op, candidate, vargs, out_specs, refs, device, sample, variant)
                )
            if any(c.supported for c in candidates) or variant == "contiguous":
                report.results.append(_check_metadata(op, vargs, sample, variant, device))
            if opcheck and index < opcheck_samples and variant == "contiguous":
                report.results.append(_opcheck(op, vargs, sample, variant))
    return report
