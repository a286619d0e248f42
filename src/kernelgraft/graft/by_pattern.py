"""``kg.graft(model, pattern=fn, replacement=op)``: trace the pattern, check it against the op,
rewrite an exported program or count and verify the matches in a module's traced graph, and
install the pattern for Inductor."""

from __future__ import annotations

import logging
import warnings
import weakref
from typing import Any

import torch

from ..errors import GraftWarning, KernelgraftError, SpecError, VerificationError, describe
from ..op import samples as _inputs
from . import pattern as _pattern, verify as _verify
from .example import MAX_SAMPLES, as_call, run_failed, tune_at_example

__all__ = ["graft_pattern", "ungraft_patterns"]

log = logging.getLogger(__name__)
MODEL_PATTERNS: "weakref.WeakKeyDictionary[Any, list[_pattern.Pattern]]" = weakref.WeakKeyDictionary()


def ungraft_patterns(model: Any) -> int:
    """Uninstall the pattern grafts ``kg.graft`` made on ``model``; returns how many."""
    try:
        patterns = MODEL_PATTERNS.pop(_owner(model), [])
    except TypeError:  # not weakly referable: kg.graft kept no pattern for it
        patterns = []
    for pattern in patterns:
        if pattern.finalizer is not None:
            pattern.finalizer.detach()
        _pattern.uninstall(pattern)
    return len(patterns)


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
        samples += _inputs.samples(op, "cpu")[:MAX_SAMPLES]
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


def graft_pattern(model, fn, replacement, report, verify, example_inputs, pattern_inputs, tolerance):
    from ..op.operator import KernelOp

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
    args, kwargs = as_call(example_inputs)
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
        MODEL_PATTERNS.setdefault(owner, []).append(pat)
        # A pattern graft acts on every graph Inductor compiles: once its model is gone (a
        # notebook cell re-run builds a new one), it must stop acting, and nothing could ungraft
        # it any more. The finalizer only marks it (garbage collection may run it where this
        # thread holds the patterns' lock); kg.ungraft detaches it, so an ungrafted pattern is
        # not kept alive.
        pat.finalizer = weakref.finalize(owner, _pattern.retire_later, pat)
    _pattern.install(pat)


def _warn_kept(report: Any, stacklevel: int) -> None:
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
        try:
            with _verify.kernels_only():
                got = compiled(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
        except Exception as exc:
            inner = getattr(exc, "inner_exception", None)  # Dynamo's wrapper of the rewrite's error
            if isinstance(inner, KernelgraftError):
                raise inner from None
            if isinstance(exc, KernelgraftError) or not sum(counts):
                raise
            raise run_failed(f"with {sum(counts)} matches of the pattern replaced by {pat.op.name}", exc,
                              "nothing was grafted") from exc
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
            tune_at_example(lambda: compiled(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs)),
                             [pat.op])
    return n


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

        def restore() -> None:
            gm.graph = backup
            gm.recompile()
            for spec, name in zip(ep.graph_signature.output_specs, out_names):
                if name is not None:
                    spec.arg.name = name

        try:
            with torch.no_grad(), _verify.kernels_only():
                got = ep.module()(*_verify.clone_inputs(args), **_verify.clone_inputs(kwargs))
        except Exception as exc:
            restore()
            if isinstance(exc, KernelgraftError):
                raise
            raise run_failed("the rewritten program", exc, "the program was restored") from exc
        problem = _verify.compare(expected, got, ops=[pat.op], override=tolerance)
        if problem is not None:
            restore()
            raise VerificationError(f"kg.graft: the rewritten program's outputs differ: {problem}; "
                                    "the program was restored")
        report.verified = True
