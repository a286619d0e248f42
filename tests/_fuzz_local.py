"""Fuzz-local copies of the example ops: declared under the ``kgfuzz`` namespace from an example's
reference and kernels (never the shared example ops themselves), so a case may declare, replace
and unregister them, and make a first call of an op that nothing has called yet.

``declare(example, name, version=..., schema=..., kernels=...)`` gives version ``version`` of the
copy: schema ``"a"`` is the example's own; schema ``"b"`` appends a parameter ``flip: bool = True``
and negates the floating tensors it returns (reference only: the example's kernels take schema
"a"), so a result says which schema served it wherever the op returns a floating tensor. Each
version's reference is another function to kernelgraft (the version is in its closure), so
declaring it with ``replace=True`` really replaces.
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

import torch

import kernelgraft as kg

NS = "kgfuzz"


def options(example) -> dict[str, Any]:
    """The example's declaration options, read from its public attributes and identity."""
    identity = example.identity
    dtypes = {p: [getattr(torch, d) for d in ds] for p, ds in identity["dtypes"].items()}
    compare = dict(example.compare) or None
    if compare and "*" in compare:  # a whole-op hook
        compare = compare["*"]
    return dict(
        mutates_args=example.mutates_args, dtypes=dtypes or None, ndim=identity["ndim"] or None,
        tolerances=example.tolerances or None, outputs=identity.get("outputs"), compare=compare,
        allow_overlap=example.allow_overlap, prune=example.prune,
    )


def _negate(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return -out if out.is_floating_point() else out
    if isinstance(out, tuple):
        return tuple(_negate(o) for o in out)
    return out


def reference(example, version: int, schema: str):
    """Version ``version`` of the example's reference, in schema ``schema`` ("a" or "b")."""
    ref = example.reference
    hints = typing.get_type_hints(ref, localns={"torch": torch})
    params = list(inspect.signature(ref).parameters.values())
    flip = schema == "b"
    if flip:
        params.append(inspect.Parameter("flip", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=True, annotation=bool))
        hints = {**{k: v for k, v in hints.items() if k != "return"}, "flip": bool, "return": hints["return"]}
    tag = (version, schema)  # in the closure: each version is another reference to kernelgraft
    signature = inspect.Signature(params, return_annotation=hints["return"])

    def versioned(*args, **kwargs):
        assert tag
        if flip:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            *args, negate = bound.args
            out = ref(*args)
            return _negate(out) if negate else out
        return ref(*args, **kwargs)

    versioned.__signature__ = signature
    versioned.__annotations__ = hints
    versioned.__qualname__ = versioned.__name__ = f"{ref.__name__}_v{version}{schema}"
    return versioned


def generic_backward(example):
    """A backward for a functional copy: the vjp of the example's reference at the saved inputs
    (the copy's gradients are then the reference's, as the fuzz expects of any backward)."""
    ref = example.reference

    def setup_context(ctx, inputs, output):
        ctx.inputs = inputs

    def backward(ctx, *grads):
        inputs = ctx.inputs
        pos = [i for i, a in enumerate(inputs) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        floating: list[bool] = []

        def f(*ts):
            full = list(inputs)
            for i, t in zip(pos, ts):
                full[i] = t
            out = ref(*full)
            outs = out if isinstance(out, tuple) else (out,)
            floating[:] = [o.is_floating_point() for o in outs]
            return tuple(o for o in outs if o.is_floating_point())

        outs, vjp = torch.func.vjp(f, *(inputs[i].detach() for i in pos))
        given = [g for g, keep in zip(grads, floating) if keep]
        got = vjp(tuple(torch.zeros_like(o) if g is None else g for g, o in zip(given, outs)))
        out = [None] * len(inputs)
        for i, g in zip(pos, got):
            out[i] = g
        return tuple(out)

    return backward, setup_context


def declare(example, name: str, *, version: int = 0, schema: str = "a", kernels: bool = True,
            backward: bool = False, replace: bool = False, impls=None, **extra):
    """Version ``version`` of a copy of ``example`` named ``kgfuzz::<name>``. ``kernels``: with the
    example's kernels (schema "a" only), else its reference serves. ``backward``: with
    ``generic_backward``. ``impls``: other kernels instead of the example's."""
    opts = {**options(example), **extra}
    use = (impls if impls is not None else example.impls) if kernels and schema == "a" else ()
    op = kg.op(reference(example, version, schema), name=f"{NS}::{name}", impls=use, replace=replace, **opts)
    if backward and not op.mutates_args:
        backward_fn, setup = generic_backward(example)
        op.register_autograd(backward_fn, setup_context=setup)
    return op
