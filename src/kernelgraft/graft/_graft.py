"""``kg.graft`` / ``kg.ungraft``: put ops into a model someone else wrote, check, and undo."""

from __future__ import annotations

import logging
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .._errors import GraftWarning, SpecError, VerificationError, describe
from ..check import _inputs
from . import _modules, _pattern, _verify

__all__ = ["GraftReport", "graft", "ungraft"]

log = logging.getLogger(__name__)
_MAX_SAMPLES = 3
_MODEL_PATTERNS: "weakref.WeakKeyDictionary[Any, list[_pattern.Pattern]]" = weakref.WeakKeyDictionary()


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


def _as_call(example_inputs: Any) -> tuple[tuple, dict]:
    if example_inputs is None:
        return (), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if (isinstance(example_inputs, tuple) and len(example_inputs) == 2
            and isinstance(example_inputs[0], tuple) and isinstance(example_inputs[1], Mapping)):
        return example_inputs[0], dict(example_inputs[1])
    return tuple(example_inputs), {}


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
    ``kernelgraft._verify``) with the ops' ``tolerances``; ``tolerance=`` overrides them with one
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
        _graft_pattern(model, pattern, replacement, report, verify, example_inputs, pattern_inputs, tolerance)
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
    try:
        patterns = _MODEL_PATTERNS.pop(_owner(model), [])
    except TypeError:  # not weakly referable: kg.graft kept no pattern for it
        patterns = []
    for pattern in patterns:
        if pattern.finalizer is not None:
            pattern.finalizer.detach()
        _pattern.uninstall(pattern)
        n += 1
    return n


def _owner(model: Any) -> Any:
    """What a pattern graft on ``model`` belongs to: a bound method's object (``m.forward`` is a
    new object at each access, gone as soon as ``kg.graft`` returns), else ``model`` itself."""
    owner = getattr(model, "__self__", None)
    if owner is None or not hasattr(model, "__func__"):
        return model
    try:
        weakref.ref(owner)
    except TypeError:  # an object with __slots__ and no __weakref__: the method itself, as before
        return model
    return owner


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
    args, kwargs = _as_call(example_inputs)
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
            inputs = [seen[module]] if module in seen else _samples_for(module, binding)[:_MAX_SAMPLES]
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
            with torch.no_grad(), _verify.kernels_only():
                got = model(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
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
        _tune_at_example(lambda: model(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs)), ops)
    if report.kept:
        lines = "; ".join(f"{k}: {v}" for k, v in list(report.kept.items())[:3])
        warnings.warn(f"kg.graft: kept the original forward of {len(report.kept)} module(s): {lines}",
                      GraftWarning, stacklevel=3)
    if not report.replaced:
        warnings.warn(f"kg.graft: replaced nothing in {type(model).__name__} (no module of types "
                      f"{[getattr(k, '__name__', k) for k in rules]} could be grafted)",
                      GraftWarning, stacklevel=3)


# ---------------------------------------------------------------------------- by pattern
def _pattern_example(op: Any, pattern_inputs: tuple | None) -> tuple:
    """The example the pattern is traced with: ``pattern_inputs``, else the op's first float32
    sample without size-1 dims (other ranks, dtypes and scalars are traced from it on demand)."""
    if pattern_inputs is not None:
        return tuple(pattern_inputs)
    if op.sample_inputs is None:
        raise SpecError(f"kg.graft: {op.name} has no sample_inputs; pass pattern_inputs=(...) to "
                        "trace the pattern with")
    first = None
    for sample in _inputs.samples(op, "cpu"):
        first = first or sample
        tensors = [a for a in sample if isinstance(a, torch.Tensor)]
        if all(t.dim() >= 1 and all(s > 1 for s in t.shape) and t.dtype == torch.float32 for t in tensors):
            return sample
    if first is None:
        raise SpecError(f"kg.graft: {op.name}'s sample_inputs yielded nothing")
    return first


def _check_pattern_vs_op(pattern: _pattern.Pattern, tolerance) -> None:
    op = pattern.op
    samples = [pattern.example]
    if op.sample_inputs is not None:
        samples += _inputs.samples(op, "cpu")[:_MAX_SAMPLES]
    for sample in samples:
        scalars_match = all(
            isinstance(a, torch.Tensor) or a == b for a, b in zip(sample, pattern.example)
        )
        if not scalars_match:
            continue
        expected = pattern.fn(*_verify.clone_inputs(sample))
        with _verify.kernels_only():
            got = op(*_verify.clone_inputs(sample))
        problem = _verify.compare(expected, got, ops=[op], override=tolerance, inputs=sample)
        if problem is not None:
            raise VerificationError(
                f"kg.graft: the pattern {getattr(pattern.fn, '__qualname__', pattern.fn)} and "
                f"{op.name} differ on {[describe(a) for a in sample]}: {problem}"
            )


def _graft_pattern(model, fn, replacement, report, verify, example_inputs, pattern_inputs, tolerance):
    from .._op._operator import KernelOp

    if not isinstance(replacement, KernelOp):
        raise SpecError(f"kg.graft: replacement must be a kernelgraft op, got {describe(replacement)}")
    example = _pattern_example(replacement, pattern_inputs)
    source = "pattern_inputs" if pattern_inputs is not None else (
        f"{replacement.name}'s sample input {[describe(a) for a in example]}")
    pat = _pattern.Pattern(fn, replacement, example, verify=verify, tolerance=tolerance, source=source)
    report.pattern = pat
    pat.graphs("export" if isinstance(model, torch.export.ExportedProgram) else "inductor")
    if verify:
        _check_pattern_vs_op(pat, tolerance)
    args, kwargs = _as_call(example_inputs)
    if isinstance(model, torch.export.ExportedProgram):
        _graft_exported(model, pat, report, verify, example_inputs is not None, args, kwargs, tolerance)
        return
    if not isinstance(model, torch.nn.Module) and not callable(model):
        raise SpecError(f"kg.graft: pattern grafts take an nn.Module or ExportedProgram, got {describe(model)}")
    if example_inputs is not None:
        misses = _pattern.Misses()
        n = _count_and_verify_traced(model, pat, args, kwargs, verify, tolerance, misses)
        for i in range(n):
            report._replaced(f"match {i}", replacement.name)
        report.verified = bool(verify and n) or None
        report.kept.update(misses.kept)
        if n == 0:
            report.reason = misses.reason()
            warnings.warn(f"kg.graft: the pattern matched nothing in {type(model).__name__} on the "
                          f"example inputs; nothing will be replaced under torch.compile: {report.reason}",
                          GraftWarning, stacklevel=3)
            return
        _warn_kept(report, 4)
    owner = _owner(model)
    if owner is not model or not hasattr(model, "__func__"):  # not a method of an unreferable object
        _MODEL_PATTERNS.setdefault(owner, []).append(pat)
        # A pattern graft acts on every graph Inductor compiles: once its model is gone (a
        # notebook cell re-run builds a new one), it must stop acting, and nothing could ungraft
        # it any more. The finalizer only marks it (garbage collection may run it where this
        # thread holds the patterns' lock); kg.ungraft detaches it, so an ungrafted pattern is
        # not kept alive.
        pat.finalizer = weakref.finalize(owner, _pattern.retire_later, pat)
    _pattern.install(pat)


def _warn_kept(report: GraftReport, stacklevel: int) -> None:
    if report.kept:
        lines = "; ".join(f"{k}: {v}" for k, v in list(report.kept.items())[:3])
        warnings.warn(f"kg.graft: left {len(report.kept)} matching site(s) as they are: {lines}",
                      GraftWarning, stacklevel=stacklevel)


def _count_and_verify_traced(model, pat, args, kwargs, verify, tolerance, misses=None) -> int:
    """Compile the model as Inductor would trace it (Dynamo, AOTAutograd, Inductor's
    decompositions) but run the graphs eagerly after our rewrite: counts the matches the Inductor
    pass will find and checks the rewritten model's outputs against the original's."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._inductor.decomposition import select_decomp_table

    counts: list[int] = []

    def fw_compiler(gm, example_inputs):
        n, _ = _pattern.rewrite_graph(gm.graph, [pat], "inductor", misses)
        counts.append(n)
        gm.recompile()
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=fw_compiler, decompositions=select_decomp_table())
    # Dynamo makes a float attribute (an eps) a graph input once it changed between compiles of
    # one forward (another instance of the class); a constant is what the pattern reads.
    with torch.no_grad(), torch._dynamo.config.patch(specialize_float=True):
        expected = model(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
        compiled = torch.compile(model, backend=backend)
        with _verify.kernels_only():
            got = compiled(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
    n = sum(counts)
    pat.replaced["inductor"] = pat.replaced.get("inductor", 0) - n  # count real compiles only
    if verify and n:
        problem = _verify.compare(expected, got, ops=[pat.op], override=tolerance)
        if problem is not None:
            raise VerificationError(
                f"kg.graft: with {n} matches of the pattern replaced by {pat.op.name} the model's "
                f"outputs differ: {problem}; nothing was grafted"
            )
    if n:
        with torch._dynamo.config.patch(specialize_float=True):  # as the checks compiled it
            _tune_at_example(lambda: compiled(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs)),
                             [pat.op])
    return n


def _tune_at_example(run: Callable[[], Any], ops: Any) -> None:
    """Run the grafted model once more on the example inputs, under the caller's tuning settings
    (the checks ran with tuning off): the ops tune at the shapes the example meets, as the first
    call would, so that a ``torch.compile`` of the model finds their decisions when Inductor makes
    its in-graph choice (``_inline``: tuning cannot run inside a compile). Nothing is measured
    where the settings measure nothing (CPU tensors, ``kg.tune("cached")``)."""
    try:
        with torch.no_grad():
            run()
    except Exception as exc:  # the checks passed: a failure here is the tuner's, and says so itself
        names = ", ".join(sorted(getattr(o, "name", "?") for o in ops))
        warnings.warn(f"kg.graft: tuning {names} on the example inputs failed ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); they tune on first use",
                      GraftWarning, stacklevel=4)


def _graft_exported(ep, pat, report, verify, have_inputs, args, kwargs, tolerance) -> None:
    import torch.fx as fx

    gm = ep.graph_module
    backup = fx.Graph()
    out = backup.graph_copy(gm.graph, {})
    backup.output(out)
    out_names = [getattr(getattr(s, "arg", None), "name", None) for s in ep.graph_signature.output_specs]
    expected = None
    if verify and have_inputs:
        with torch.no_grad():
            expected = ep.module()(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
    misses = _pattern.Misses()
    n = _pattern.rewrite_exported(ep, pat, misses)
    report.program = ep
    for i in range(n):
        report._replaced(f"match {i}", pat.op.name)
    report.kept.update(misses.kept)
    if n == 0:
        report.reason = misses.reason()
        warnings.warn(f"kg.graft: the pattern matched nothing in the exported program: {report.reason}",
                      GraftWarning, stacklevel=4)
        return
    _warn_kept(report, 5)
    if expected is not None:
        with torch.no_grad(), _verify.kernels_only():
            got = ep.module()(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
        problem = _verify.compare(expected, got, ops=[pat.op], override=tolerance)
        if problem is not None:
            gm.graph = backup
            gm.recompile()
            for spec, name in zip(ep.graph_signature.output_specs, out_names):
                if name is not None:
                    spec.arg.name = name
            raise VerificationError(f"kg.graft: the rewritten program's outputs differ: {problem}; "
                                    "the program was restored")
        report.verified = True
