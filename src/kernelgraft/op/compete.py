"""PyTorch competes: the op's own reference, eager and under ``torch.compile``, as two candidates.

Beside the kernels the tuner measures ``torch:eager`` (the reference as written) and
``torch:compile`` (the reference under ``torch.compile``, compiled once per op), through the same
correctness gate and timing, so a shape where PyTorch is faster is served by PyTorch: an op is
never slower than its own reference on the shapes it was tuned for.

When they compete: on CUDA tensors by default, when at least one kernel supports the inputs (with
no kernel the op falls back to the reference as before, with its warning). Off per op with
``kg.op(..., compete=False)`` or narrowed with ``compete=("eager",)`` / ``("compile",)``; off (or
forced, even on CPU) for a thread or block with ``kg.tune(compete=False|True)``; globally with
``KERNELGRAFT_COMPETE=0|1``. A bundle's stand-in op (whose reference cannot run) never competes.

Identity: torch candidates have fixed negative impl indices (``TORCH_INDEX``) so decisions stay
valid whatever the op's impls; the tuning key names them (``compiler:torch:eager`` ...), so a
decision made with them never serves a call made without them, or the other way round.

``torch.compile``: ``dynamic=None`` (PyTorch's automatic dynamic shapes): the first shape compiles
static, a second shape recompiles with the dims that changed marked dynamic, so one compiled graph
then serves every shape of a dim that varies, which is what the tuner's new shapes do. The compile
happens in the gate, before any CUDA-graph capture of the timing. A reference Dynamo cannot compile
gets ``torch:compile`` marked unsupported with the error as reason, found once per op. Decisions are
per bucket and plans per exact shape, so a new shape of a bucket ``torch:compile`` won recompiles
inside the user's call; when that fails the eager reference serves the call, the error is recorded
the same way and ``torch:compile`` is never served again (``_plan.torch_plan``, ``servable``).

CUDA graphs: a torch candidate whose call cannot be captured (a reference that reads a value on the
host, as ``.item()`` does) is excluded by the timer (kind ``capture``, see ``tune._timing``), so an
op whose kernels can be captured stays capturable whatever PyTorch's timings.

Under an outer ``torch.compile`` the op stays opaque, whatever won. Design, not built yet: when the
decision for a shape is a torch candidate, the op's tracing path (``KernelOp.__call__`` under
``torch.compiler.is_compiling()``) could call ``op.reference`` instead of the overload, so Dynamo
traces the reference into the user's graph and Inductor fuses it with its neighbours. Sound only
with guards: the choice depends on the shape's tuning key (bucketed sizes, dtypes, device), so the
traced branch must be guarded on exactly what the key reads. Dynamo guards the sizes it reads
while tracing; reading the decision through ``build_key`` on the fake tensors would specialise
every dim the key buckets (losing dynamic shapes), and with ``dynamic=True`` the key cannot be
built from symbolic sizes at all, so the switch would have to fall back to the opaque op there.
It also needs the decision at trace time (tuning cannot run while tracing: ``cached`` only), and
an op with ``register_autograd`` would trace the reference's own autograd instead of the op's.
It pays only if Inductor fuses the reference with a neighbour, which the lead measures on the
Llama graft benchmark before it is built (``kg.tune(compete=...)`` is where its switch would go).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..errors import SpecError, describe
from ..spec import ImplSpec
from .candidates import Candidate
from .quiet import quiet


__all__ = ["TorchImpl", "TORCH", "TORCH_INDEX", "NAMES", "normalize_compete", "offered",
           "torch_candidates", "is_torch", "key_backends", "CompileState", "servable",
           "compiling_references"]

log = logging.getLogger(__name__)

TORCH = "torch"
NAMES = ("eager", "compile")
TORCH_INDEX = {"eager": -1, "compile": -2}  # stable ids in decisions, whatever the op's impls


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class TorchImpl(ImplSpec):
    """The reference run by PyTorch (``name``: 'eager' or 'compile'); never in ``op.impls``."""

    backend = TORCH

    def code_identity(self) -> str:
        return f"torch:{self.name}"

    def __repr__(self) -> str:
        return f"torch:{self.name}"


_IMPLS = {name: TorchImpl(launch=None, configs=({},), name=name) for name in NAMES}


def is_torch(candidate: Any) -> bool:
    return getattr(candidate.impl, "backend", None) == TORCH


def is_torch_compile(candidate: Any) -> bool:
    """Whether ``candidate`` is ``torch:compile`` (the reference under ``torch.compile``)."""
    return is_torch(candidate) and candidate.impl.name == "compile"


def key_backends(candidates: Iterable[Candidate]) -> list[str]:
    """What the tuning key records of the offered candidates: backends, and each torch one by name."""
    return [f"torch:{c.impl.name}" if is_torch(c) else c.impl.backend for c in candidates]


def normalize_compete(value: Any, where: str) -> tuple[str, ...]:
    """``kg.op(..., compete=)`` as the names that may compete: True -> both, False -> none.

    None is refused: in ``kg.tune(compete=None)`` it means "the default" (on CUDA), and the op's
    default is True, so an op's None would read as on there and off here (it meant off once)."""
    if value is True:
        return NAMES
    if value is False:
        return ()
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, Iterable):
        names = tuple(dict.fromkeys(value))
        if all(n in NAMES for n in names):
            return tuple(n for n in NAMES if n in names)
    raise SpecError(f"{where}: compete must be True, False or a tuple of {NAMES}, got {describe(value)}")


def compile_reference(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.compile`` of a reference: default mode (no CUDA graphs of its own: the tuner captures
    the timing graph), automatic dynamic shapes (see the module docstring). Tests replace it."""
    return torch.compile(fn, dynamic=None)


class _Compiling(threading.local):
    ops: tuple[str, ...] = ()


_COMPILING = _Compiling()


def compiling_references() -> tuple[str, ...]:
    """The ops (by name) whose ``torch:compile`` reference this thread is running, innermost last.
    Inductor compiles inside that call, in this thread: graph passes that would put one of these
    ops back into its own reference's graph (a pattern graft whose pattern the reference is) read
    this and leave it out, else the compiled reference calls the op, whose tuning compiles the
    reference again, without end (found on the H200: swiglu's pattern graft, RecursionError)."""
    return _COMPILING.ops


class CompileState:
    """The op's reference under ``torch.compile``, made once, and the error if Dynamo refuses it."""

    def __init__(self, reference: Callable[..., Any], owner: str = "") -> None:
        self.reference = reference
        self.owner = owner
        self.error: str | None = None
        self._compiled: Callable[..., Any] | None = None
        self._lock = threading.Lock()

    def call(self, *args: Any) -> Any:
        compiled = self._compiled
        if compiled is None:
            with self._lock:
                if self._compiled is None:
                    self._compiled = compile_reference(self.reference)
                compiled = self._compiled
        # One calling state whichever path calls (the op's eager fast path with grad on, or
        # torch.ops through the op's autograd kernel, whose forward runs with grad off): Dynamo
        # guards on grad mode, each tensor's requires_grad and dispatch keys, so a call from the
        # other path would recompile, maybe inside the user's CUDA-graph capture. The op's own
        # autograd kernel owns gradients, so the reference runs without grad on detached aliases
        # (they share storage: mutations land).
        args = tuple(_detached(a) for a in args)
        outer = _COMPILING.ops
        _COMPILING.ops = (*outer, self.owner)
        try:
            with torch._C._AutoDispatchBelowAutograd(), torch.no_grad(), quiet():
                return compiled(*args)
        finally:
            _COMPILING.ops = outer

    def refused(self, exc: BaseException) -> None:
        """Record that Dynamo/Inductor failed on the reference, in the tuner's gate or in a
        served call, where the reference itself ran on the same inputs (the oracle, or the eager
        fallback): the reference does not compile, and ``torch:compile`` stops competing for this
        op (found once, not retried per shape). Out-of-memory says nothing about compiling and is
        not recorded."""
        if isinstance(exc, (torch.cuda.OutOfMemoryError, MemoryError)) or self.error is not None:
            return
        text = str(exc).splitlines()[0][:300] if str(exc) else ""
        self.error = f"torch.compile failed: {type(exc).__name__}: {text}"
        log.warning("%s: torch:compile no longer competes: %s",
                    getattr(self.reference, "__qualname__", "op"), self.error)


def _detached(a: Any) -> Any:
    if isinstance(a, torch.Tensor):
        return a.detach()
    if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
        return [t.detach() for t in a]
    return a


def _off_reason(op: Any, name: str, device: torch.device, settings: Any, listing: bool) -> str | None:
    if getattr(op.reference, "kernelgraft_stub", False):
        return "the op's reference is a bundle stand-in and cannot run"
    if name not in op.compete:
        return f"off: kg.op(..., compete={op.compete or False!r})"
    forced = getattr(settings, "compete", None)
    if forced is False:
        return "off: kg.tune(compete=False) or KERNELGRAFT_COMPETE=0"
    if forced is None and device.type != "cuda":
        return f"off: the tensors are on {device}; PyTorch competes on CUDA (kg.tune(compete=True) forces it)"
    if name == "compile" and listing:
        error = op.dispatcher.compile_state.error
        if error is not None:
            return error
    return None


def torch_candidates(op: Any, tensors: Sequence[tuple[str, torch.Tensor]], settings: Any, *,
                     listing: bool = True) -> list[Candidate]:
    """``torch:eager`` and ``torch:compile`` with why each cannot compete here (None: it can).

    ``listing=False`` (what the tuner is offered) leaves out the compile error: a compile that
    failed stays in the tuning key (so the decisions made before the failure keep serving their
    shapes, through their next-ranked candidate: see ``servable``) and the gate excludes it at
    once with the recorded error, without compiling again."""
    device = tensors[0][1].device if tensors else torch.device("cpu")
    out = []
    for name in NAMES:
        reason = _off_reason(op, name, device, settings, listing)
        out.append(Candidate(TORCH_INDEX[name], _IMPLS[name], _IMPLS[name].configs[0], reason,
                             "compete" if reason else None))
    return out


def offered(op: Any, kernels: Sequence[Candidate], tensors: Sequence[tuple[str, torch.Tensor]],
            settings: Any) -> list[Candidate]:
    """What the tuner chooses among: the supported kernels, then the torch candidates that may
    compete (kernels first: the default candidate is a kernel; the tuner gives ties to torch:eager). Nothing when no kernel
    supports the inputs (the reference then runs with the fallback warning, as without compete)."""
    supported = [c for c in kernels if c.supported]
    if not supported:
        return []
    return supported + [c for c in torch_candidates(op, tensors, settings, listing=False) if c.supported]


def servable(op: Any, candidates: Sequence[Candidate]) -> Sequence[Candidate]:
    """``candidates`` less ``torch:compile`` once its compile failed (``CompileState.error``): it
    stays offered, for the key, but a cached decision naming it must not serve it again (it would
    fail again); the decision's next-ranked candidate serves instead."""
    if op.dispatcher.compile_state.error is None:
        return candidates
    return [c for c in candidates if not is_torch_compile(c)]


def bind(op: Any, candidate: Candidate) -> Callable[..., Any]:
    """``call(*args) -> the reference's outputs``: how a torch candidate runs (no preallocated
    outputs: it allocates its own, as the reference does)."""
    if candidate.impl.name == "compile":
        return op.dispatcher.compile_state.call
    return op.reference


def kernel_runner(op: Any, candidate: Candidate) -> Callable[..., Any]:
    """A torch candidate behind the kernels' runner protocol, ``runner(*args, *outs)``: the
    reference's outputs copied into ``outs`` (code that runs every candidate of ``op.candidates()``
    through ``op.dispatcher.runner`` keeps working). The tuner and the op's plans call ``bind``'s
    function instead, without the copy."""
    call, n = bind(op, candidate), len(op.signature.params)

    def runner(*args: Any) -> None:
        got = outputs_of(op, call(*args[:n]))
        for out, value in zip(args[n:], got):
            out.copy_(value)

    return runner


def find(impl: Any) -> str | None:
    """The torch candidate ``op.run(impl=...)`` names ('torch:eager', 'torch:compile', its
    index in decisions, or its ``TorchImpl`` as ``candidate.impl`` gives it), else None."""
    if isinstance(impl, TorchImpl):
        return impl.name
    if isinstance(impl, str) and impl.startswith("torch:") and impl[6:] in NAMES:
        return impl[6:]
    if isinstance(impl, int) and not isinstance(impl, bool):
        return next((name for name, index in TORCH_INDEX.items() if index == impl), None)
    return None


def candidate(name: str) -> Candidate:
    return Candidate(TORCH_INDEX[name], _IMPLS[name], _IMPLS[name].configs[0])


def outputs_of(op: Any, result: Any) -> list[torch.Tensor]:
    """The reference's return value as the list of output tensors the oracle compares."""
    kind = op.signature.returns
    if kind == "none":
        return []
    if kind == "tensor":
        return [result]
    return list(result)
