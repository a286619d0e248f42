"""``kg.graft`` / ``kg.ungraft``: put ops into a model someone else wrote, check, and undo."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import GraftWarning, KernelgraftError, SpecError, VerificationError, describe
from ..op import samples as _inputs
from . import by_pattern as _by_pattern, modules as _modules, verify as _verify
from .example import MAX_SAMPLES, as_call, run_failed, tune_at_example

__all__ = ["GraftReport", "graft", "ungraft"]

log = logging.getLogger(__name__)
# A model's pattern grafts, under the name scripts outside the package read it by.
_MODEL_PATTERNS = _by_pattern.MODEL_PATTERNS


@dataclass
class GraftReport:
    """What a ``kg.graft`` call did. ``count`` is the number of replacements it made (for a pattern
    on an ``nn.Module`` without ``example_inputs``: unknown until compiled, see ``compiled``)."""

    replaced: dict[str, str] = field(default_factory=dict)  # module path or site -> op name
    kept: dict[str, str] = field(default_factory=dict)  # module path -> why the original stays
    verified: bool | None = None  # None: not verified (no inputs to verify on)
    max_error: str | None = None
    pattern: Any = None
    program: Any = None  # the rewritten ExportedProgram
    reason: str | None = None  # a pattern that replaced nothing: what was looked for, what differed

    @property
    def count(self) -> int:
        return len(self.replaced)

    @property
    def compiled(self) -> int:
        """Pattern matches replaced so far by the torch.compile (Inductor) pass. A compile served
        from Inductor's or AOTAutograd's cache skips the pass and adds nothing (the cached graph
        was grafted alike: the pass's uuid is part of the cache key)."""
        return self.pattern.replaced.get("inductor", 0) if self.pattern is not None else 0

    def _replaced(self, label: str, op_name: str) -> None:
        self.replaced[label] = op_name

    def _kept(self, label: str, why: str) -> None:
        self.kept[label] = why

    def __str__(self) -> str:
        ops = sorted(set(self.replaced.values()))
        text = f"grafted {self.count} site(s) onto {', '.join(ops) or 'nothing'}"
        if self.kept:
            text += f"; kept {len(self.kept)} original(s)"
        if self.verified is not None:
            text += f"; verified={self.verified}"
        if self.reason:
            text += f" ({self.reason})"
        return text


def graft(
    model: Any,
    rules: Mapping[Any, Any] | None = None,
    /,
    *,
    pattern: Callable[..., Any] | None = None,
    replacement: Any = None,
    mode: str = "inference",
    verify: bool = True,
    example_inputs: Any = None,
    pattern_inputs: tuple | None = None,
    tolerance: float | Mapping[torch.dtype, float] | None = None,
) -> GraftReport:
    """Replace parts of ``model`` with kernelgraft ops, check the result, and report.

    By module type: ``kg.graft(model, {LlamaRMSNorm: rmsnorm})`` replaces the forward of every
    module of exactly that type (or class name) with the op; module attributes reach op parameters
    by name (``weight``; ``eps`` is also found as ``variance_epsilon``...) or by an explicit
    ``{Type: (op, {"eps": "my_eps_attr"})}``. ``mode="training"`` grafts only ops with a backward
    (else keeps the original, with a ``GraftWarning``); ``mode="inference"`` runs the original
    whenever gradients are needed and the op is used otherwise.

    By pattern: ``kg.graft(model, pattern=fn, replacement=op)`` replaces every subgraph equal to
    ``fn`` under ``torch.compile`` (Inductor) or, for an ``ExportedProgram``, in its graph (rewritten
    in place, also in ``report.program``). ``fn`` returns one tensor, or a tuple of as many tensors
    as the op returns (``add_rmsnorm_pattern`` returns the norm and the sum it normalised). ``fn`` is
    traced with ``pattern_inputs`` (the op's arguments), else with the op's first float32 sample
    input, and again at the dtypes and ranks the model uses; the op's float/int/bool arguments
    (an ``eps``) are read from each match and passed to the op. A pattern graft on an
    ``nn.Module`` acts when Inductor compiles it, not on a later ``torch.export(module)``: graft
    the ``ExportedProgram`` instead. When a pattern replaces nothing, ``report.reason`` and the
    ``GraftWarning`` say what was looked for and where the closest sites in the model differ.

    ``verify=True``: the grafted model's outputs must equal the original's on ``example_inputs``
    (a tuple of args, a dict of kwargs, or ``(args, kwargs)``), each grafted module's on the inputs
    it saw, and the op must equal the module/pattern on the op's ``sample_inputs``; a module that
    fails is kept original with a warning, a model that fails raises ``VerificationError`` (and is
    left ungrafted). Outputs are judged by the rule ``kernelgraft check`` uses (see
    ``kernelgraft.verify.oracle``) with the ops' ``tolerances``; ``tolerance=`` overrides them with one
    rtol for every floating dtype, or a ``{dtype: rtol}`` dict.

    >>> import torch, kernelgraft as kg
    >>> from kernelgraft.examples.add_relu import add_relu
    >>> class M(torch.nn.Module):
    ...     def forward(self, x, y):
    ...         return torch.relu(x + y) * 2
    >>> ep = torch.export.export(M(), (torch.randn(8), torch.randn(8)))
    >>> report = kg.graft(ep, pattern=lambda x, y: torch.relu(x + y), replacement=add_relu)
    >>> report.count
    1
    """
    if mode not in ("inference", "training"):
        raise SpecError(f"kg.graft: mode must be 'inference' or 'training', got {mode!r}")
    if (rules is None) == (pattern is None):
        raise SpecError("kg.graft: give either module rules {Type: op} or pattern=fn with replacement=op")
    tolerance = _verify.check_override(tolerance, "kg.graft")
    report = GraftReport()
    if pattern is not None:
        _by_pattern.graft_pattern(model, pattern, replacement, report, verify, example_inputs, pattern_inputs, tolerance)
    else:
        if not isinstance(model, torch.nn.Module):
            raise SpecError(f"kg.graft: grafting by module type needs an nn.Module, got {describe(model)}")
        _graft_modules(model, rules, mode, report, verify, example_inputs, tolerance)
    log.info("kg.graft: %s", report)
    return report


def ungraft(model: Any) -> int:
    """Undo every graft on ``model`` (module forwards and pattern grafts); returns how many."""
    if not (isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)) or callable(model)):
        raise SpecError(f"kg.ungraft: expected the nn.Module or function given to kg.graft, got {describe(model)}")
    n = 0
    if isinstance(model, torch.nn.Module):
        n += _modules.ungraft_modules(model)
    return n + _by_pattern.ungraft_patterns(model)


# ---------------------------------------------------------------------------- by module type
def _capture(model: torch.nn.Module, rules: Mapping[Any, Any], args: tuple, kwargs: dict):
    seen: dict[torch.nn.Module, tuple] = {}
    handles = []

    def hook(module, a, k):
        if module not in seen:
            seen[module] = (_verify.clone_inputs(a), _verify.clone_inputs(k))

    for module in model.modules():
        if any(_modules._matches(module, key) for key in rules):
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            expected = model(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
    finally:
        for h in handles:
            h.remove()
    return expected, seen


def _samples_for(module: torch.nn.Module, binding: Any) -> list[tuple[tuple, dict]]:
    op = binding.op
    if op.sample_inputs is None:
        return []
    p = next(iter(module.parameters()), None)
    try:
        it = op.sample_inputs(device=p.device, dtype=p.dtype) if p is not None else None
        samples = list(it) if it is not None else _inputs.samples(op, "cpu")
    except TypeError:  # sample_inputs(device) without a dtype keyword
        samples = _inputs.samples(op, str(p.device) if p is not None else "cpu")
    out = []
    for sample in samples:
        fn_args: dict[int, Any] = {}
        fits = True
        for value, (kind, src) in zip(sample, binding.sources):
            if kind == "arg":
                fn_args[src] = value
            elif kind == "attr" and isinstance(value, torch.Tensor):
                # A sample fits this module when it was made for attributes of its shape.
                attr = binding.attr_value(module, src)
                fits = fits and isinstance(attr, torch.Tensor) and attr.shape == value.shape
        if not fits:
            continue
        if sorted(fn_args) != list(range(len(fn_args))):
            continue
        out.append((tuple(fn_args[i] for i in range(len(fn_args))), {}))
    return out


def _verify_module(module, inputs: list[tuple[tuple, dict]], binding, tolerance) -> tuple[bool, str | None]:
    """(checked at least once, problem or None)."""
    original = _modules.original_forward(module)
    checked = False
    for args, kwargs in inputs:
        try:
            with torch.no_grad():
                expected = original(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
        except Exception as exc:  # a sample this module does not take (shape): skip it
            log.debug("kg.graft: sample skipped for %s: %s", type(module).__name__, exc)
            continue
        with torch.no_grad(), _verify.kernels_only():
            got = module.forward(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
        problem = _verify.compare(expected, got, ops=[binding.op], override=tolerance)
        checked = True
        if problem is not None:
            return True, problem
    return checked, None


def _graft_modules(model, rules, mode, report, verify, example_inputs, tolerance) -> None:
    args, kwargs = as_call(example_inputs)
    have_inputs = example_inputs is not None
    expected, seen = (None, {})
    if verify and have_inputs:
        expected, seen = _capture(model, rules, args, kwargs)
    grafted = _modules.graft_modules(model, rules, mode=mode, report=report)
    ops = {id(b.op): b.op for b in (_modules._GRAFTED[m].binding for m in grafted)}.values()
    labels = {m: name or type(m).__name__ for name, m in model.named_modules()}
    if verify:
        unverified = []
        for module in grafted:
            binding = _modules._GRAFTED[module].binding
            inputs = [seen[module]] if module in seen else _samples_for(module, binding)[:MAX_SAMPLES]
            checked, problem = _verify_module(module, inputs, binding, tolerance)
            if problem is not None:
                _modules.ungraft_module(module)
                report.replaced.pop(labels[module], None)
                report._kept(labels[module], f"verification failed: {problem}")
            elif not checked:
                unverified.append(labels[module])
        if unverified:
            warnings.warn(
                f"kg.graft: could not verify {len(unverified)} grafted module(s) (e.g. "
                f"{unverified[0]}): no example_inputs and no op sample input fits; pass "
                "example_inputs=(...) to check them", GraftWarning, stacklevel=3,
            )
        if have_inputs and report.replaced:
            try:
                with torch.no_grad(), _verify.kernels_only():
                    got = model(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
            except Exception as exc:
                for module in grafted:
                    _modules.ungraft_module(module)
                if isinstance(exc, KernelgraftError):
                    raise
                raise run_failed("with its modules grafted", exc, "every graft of this call was undone") from exc
            problem = _verify.compare(expected, got, ops=ops, override=tolerance)
            if problem is not None:
                for module in grafted:
                    _modules.ungraft_module(module)
                raise VerificationError(
                    f"kg.graft: the grafted model's outputs differ from the original's: {problem}; "
                    "every graft of this call was undone (pass tolerance=rtol or {dtype: rtol} if the "
                    "difference is expected rounding)"
                )
        report.verified = (not unverified and bool(report.replaced)) if report.replaced else None
    if have_inputs and report.replaced:
        tune_at_example(lambda: model(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs)), ops)
    if report.kept:
        lines = "; ".join(f"{k}: {v}" for k, v in list(report.kept.items())[:3])
        warnings.warn(f"kg.graft: kept the original forward of {len(report.kept)} module(s): {lines}",
                      GraftWarning, stacklevel=3)
    if not report.replaced:
        warnings.warn(f"kg.graft: replaced nothing in {type(model).__name__} (no module of types "
                      f"{[getattr(k, '__name__', k) for k in rules]} could be grafted)",
                      GraftWarning, stacklevel=3)
