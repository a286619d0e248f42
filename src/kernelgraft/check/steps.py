"""The steps of a check, each judged into one ``Result``: a candidate on a variant of a sample (in
guarded memory, ``kernelgraft.verify.guard``: the rule the tuner's gate and graft verification apply
too), the op's fake output metadata against the reference's real outputs, ``torch.library.opcheck``
of the op and of each candidate, and tracing under ``torch.compile`` and ``torch.export``.

Steps that reach the op through ``torch.ops`` (metadata, opcheck, tracing) choose what runs with
``_select.pinned``: the reference, or one candidate. No kernel ever runs outside guarded memory
unless it has passed there: a store past an output would corrupt this process's heap.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

import torch

from ..verify import guard as _guard, oracle as _verify
from ..errors import KernelgraftError
from ..op import select as _select
from ..op.candidates import Candidate
from ..aot.build import signature_label
from ..op.modes import tune
from .compile import COMPILABLE, Compiler, NotCompiled, compiler_message

__all__ = ["Result", "check_candidate", "check_metadata", "opcheck", "trace", "exception_note"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Result:
    op: str
    candidate: str  # a candidate label, "reference", "meta", "opcheck" or "trace"
    sample: str
    variant: str  # contiguous | noncontiguous | a derived variant's name | opcheck (a candidate under it)
    # pass | fail | skip | compiled (cannot run here; compiled for a GPU arch) | notrun (a step that
    # never ran: the check process died elsewhere; its candidate is not ok)
    status: str
    error: float = 0.0  # the worst element's |got - want| (inf: NaN, Inf or bits where not expected)
    tol: float = 0.0  # what the rule allowed at that element (0: bit-exact)
    note: str = ""


def _clip(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: a long one keeps its start (what failed) and its end
    (kernelgraft's messages end with how to fix it), the middle elided."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]} ... {text[-(limit - head - 5):]}"


def exception_note(exc: BaseException) -> str:
    if isinstance(exc, KernelgraftError):
        return _clip(str(exc), 600)
    return _clip(f"{type(exc).__name__}: {exc}", 300)


@contextlib.contextmanager
def running(op: Any, candidate: Candidate | None) -> Iterator[None]:
    """Calls of ``op`` through ``torch.ops`` run ``candidate`` (None: the reference), never tune,
    and reuse no plan made before."""
    with tune("off"), _select.pinned(op, candidate):
        op.dispatcher.reset()
        yield


# ------------------------------------------------------------------------------ a candidate
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


def _damage_after_failure(call) -> str | None:
    """What a failed run wrote outside its own memory, read from the guards; when reading them
    fails too (a sticky CUDA error leaves every later call failing), that is said instead, so the
    failure stays this candidate's row rather than ending the op's check."""
    if call is None:
        return None
    try:
        return call.damage()
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return f"its guards could not be read afterwards ({type(exc).__name__}: {str(exc)[:120]})"


def check_candidate(op, candidate, args, out_specs, ref, sample, variant, compiler=None) -> Result:
    """Run ``candidate`` once on guarded copies of ``args`` and poisoned guarded outputs; it
    passes when what it produced matches ``ref`` and it wrote nothing else."""
    base = dict(op=op.name, candidate=candidate.label, sample=sample, variant=variant)
    if not candidate.supported:
        return _compile_only(compiler, candidate, args, out_specs, base)
    call = None
    try:
        call = _guard.Call(op, args, out_specs)
        op.dispatcher.runner(candidate)(*call.args, *call.outs)
        for device in {t.device for t in call.produced()}:
            _verify.sync(device)
        damage = call.damage()
    except Exception as exc:
        damage = _damage_after_failure(call)
        note = exception_note(exc) + (f"; {damage}" if damage else "")
        return Result(**base, status="fail", error=float("inf"), note=note[:600])
    verdict = _verify.verify(ref, call.produced(), op.tolerances)
    worst = verdict.worst
    notes = [damage] if damage else []
    if worst is not None and worst.problem:
        notes.append(worst.problem)
    if verdict.note:
        notes.append(verdict.note)
    ok = verdict.ok and damage is None
    return Result(**base, status="pass" if ok else "fail",
                  error=float("inf") if damage else worst.error if worst else 0.0,
                  tol=worst.allowed if worst and not damage else 0.0, note="; ".join(notes))


# ------------------------------------------------------------------------------ the op through torch.ops
def check_metadata(op, args, sample, variant) -> Result:
    """The op's output specs (its fake kernel) against what the reference returns through the op."""
    base = dict(op=op.name, candidate="meta", sample=sample, variant=variant)
    try:
        specs = op.dispatcher.output_specs(args)
        with running(op, None):  # the reference: a kernel's outputs are allocated from the specs
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


def opcheck(op, args, sample, candidate: Candidate | None = None) -> Result:
    """``torch.library.opcheck`` with the reference serving the op (row "opcheck": the op's
    registration), or ``candidate`` (its own row, variant "opcheck")."""
    who = "opcheck" if candidate is None else candidate.label
    base = dict(op=op.name, candidate=who, sample=sample, variant="contiguous" if candidate is None else "opcheck")
    try:
        with running(op, candidate):
            torch.library.opcheck(op.overload, _verify.clone(args))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Result(**base, status="fail", note=(first if candidate is None else f"opcheck: {first}")[:300])
    return Result(**base, status="pass")


_DATA_DEPENDENT = ("unbacked", "data-dependent", "datadependent", "dynamicoutputshape", "guardondatadependent")
_HINT = ("the op's fake kernel (its meta function: by default the reference, run on fake tensors) has "
         "data-dependent shapes: give the op one that computes only the output shapes with op.register_meta(fn) "
         "(an op that returns None: op.register_meta(lambda *args: None))")


def _why(exc: BaseException) -> tuple[str, bool]:
    """The innermost error of ``exc``'s chain in one line (a backend's wrapper says little), and
    whether the chain speaks of data-dependent shapes."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or getattr(exc, "inner_exception", None) or exc.__context__
    inner = chain[-1]
    text = str(inner).strip()
    first = text.splitlines()[0] if text else ""
    dependent = any(w in f"{type(e).__name__} {e}".lower() for e in chain for w in _DATA_DEPENDENT)
    return f"{type(inner).__name__}: {first}"[:300], dependent


class _Exported(torch.nn.Module):
    def __init__(self, op: Any) -> None:
        super().__init__()
        self.op = op

    def forward(self, *args: Any) -> Any:
        return self.op(*args)


def trace(op, args, sample) -> Result:
    """``torch.compile(fullgraph=True)`` (backend aot_eager: Dynamo, fake tensors and AOTAutograd,
    no code generation) and ``torch.export`` of a call of the op on ``args``."""
    base = dict(op=op.name, candidate="trace", sample=sample, variant="contiguous")
    # A new code object per trace: Dynamo caches per code object, and after its recompile limit
    # it would run a function eagerly, so a later op would pass without being traced.
    scope: dict[str, Any] = {"op": op}
    exec("def traced(*args):\n    return op(*args)\n", scope)
    problems, dependent = [], False
    with running(op, None):
        for what, run in (
                ("torch.compile(fullgraph=True)", lambda: torch.compile(
                    scope["traced"], backend="aot_eager", fullgraph=True, dynamic=False)(*_verify.clone(args))),
                ("torch.export", lambda: torch.export.export(_Exported(op), tuple(_verify.clone(args))))):
            try:
                run()
            except Exception as exc:
                text, found = _why(exc)
                problems.append(f"{what}: {text}")
                dependent = dependent or found
    if problems:
        return Result(**base, status="fail", note="; ".join(problems + ([_HINT] if dependent else [])))
    return Result(**base, status="pass")
