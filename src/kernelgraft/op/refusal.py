"""The backward of an op that declares none: it raises, naming the op and how to declare one.

The refusal is an operator of its own, ``kernelgraft_autograd::no_backward``, whose kernel raises
and whose fake kernel only shapes the gradient. In eager mode the error comes when ``.backward()``
(or ``torch.func.grad``, ``jacrev``, ``vjp``) reaches the op; under torch.compile AOTAutograd
traces the refusal into the backward graph, so compiling inference code still works and a real
backward through the compiled graph still raises. (Refusing at forward time would be wrong: model
parameters require grad in plain inference and in torch.compile's traced graphs.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import UnsupportedError

__all__ = ["no_backward", "mutation_refused"]

_NS = "kernelgraft_autograd"
_lib = torch.library.Library(_NS, "FRAGMENT")
_lib.define("no_backward(Tensor grad, str op, str inputs, SymInt[] size) -> Tensor")

HOW = ("declare one with op.register_autograd(backward, setup_context=...), or call it under "
       "torch.no_grad() or torch.inference_mode() (or .detach() the inputs) if no gradient should "
       "flow through it")


def _plural(inputs: str) -> tuple[str, str]:
    many = "," in inputs
    return ("s" if many else ""), ("" if many else "s")


def _refuse(grad: torch.Tensor, op: str, inputs: str, size: list[int]) -> torch.Tensor:
    s, verb_s = _plural(inputs)
    raise UnsupportedError(f"{op} has no backward, and its argument{s} {inputs} require{verb_s} grad: {HOW}")


# A CompositeExplicitAutograd kernel serves every device (and meta), so a gradient on any device
# reaches the refusal, never a "no kernel for this backend" error.
_lib.impl("no_backward", _refuse, "CompositeExplicitAutograd")
# Under vmap (vmap(grad(op)), jacrev) the refusal raises as it is: torch's generic batching would
# first warn that a batching rule is missing.
_lib.impl("no_backward", _refuse, "FuncTorchBatched")


@torch.library.register_fake(f"{_NS}::no_backward", lib=_lib)
def _no_backward_fake(grad, op, inputs, size):
    return grad.new_empty(size)


def mutation_refused(op_name: str, mutated: Sequence[str], inputs: str) -> UnsupportedError:
    """The error for an op that mutates ``mutated``, called with ``inputs`` requiring grad."""
    s, verb_s = _plural(inputs)
    return UnsupportedError(
        f"{op_name} mutates {', '.join(repr(m) for m in mutated)}, and its argument{s} {inputs} "
        f"require{verb_s} grad, but an op that mutates its arguments has no backward (torch gives "
        "such ops no autograd formula): call it under torch.no_grad() or torch.inference_mode() "
        "(or .detach() the inputs) if no gradient should flow through it, or declare a functional "
        "op (one that returns its result) and give it a backward with op.register_autograd"
    )


def _shape(t: Any) -> Any:
    """A tensor's shape; for a ``Tensor[]`` argument, one per element (None for a non-tensor)."""
    if isinstance(t, torch.Tensor):
        return list(t.shape)
    if isinstance(t, (list, tuple)):
        return [_shape(e) for e in t]
    return None


def wanted(names: Sequence[str], need: Sequence[Any]) -> list[tuple[int, int | None]]:
    """(argument index, element index or None) of every input whose gradient is wanted, from
    ``needs_input_grad`` in the op's structure (a list of bools for a ``Tensor[]`` argument)."""
    out = []
    for i, n in enumerate(need):
        if isinstance(n, (list, tuple)):
            out.extend((i, k) for k, flag in enumerate(n) if flag)
        elif n:
            out.append((i, None))
    return out


def describe_inputs(names: Sequence[str], which: Sequence[tuple[int, int | None]]) -> str:
    return ", ".join(repr(names[i] if k is None else f"{names[i]}[{k}]") for i, k in which)


def no_backward(op_name: str, names: Sequence[str]) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(backward, setup_context) in ``register_autograd``'s form for an op without a backward:
    the gradient of the first input that wants one is the refusal, which raises when it runs."""

    def setup_context(ctx, inputs, output):
        ctx.kg_sizes = [_shape(t) for t in inputs]

    def backward(ctx, *grads):
        # needs_input_grad holds a bool per argument, and a list of bools for a Tensor[] argument,
        # whose gradient must be a list of the same length
        need = list(ctx.needs_input_grad)
        out: list[Any] = [[None] * len(n) if isinstance(n, (list, tuple)) else None for n in need]
        which = wanted(names, need)
        if not which:
            return tuple(out)
        grad = next((g for g in grads if g is not None), None)
        i, k = which[0]
        size = ctx.kg_sizes[i] if k is None else ctx.kg_sizes[i][k]
        # one refusing gradient is enough: it raises when the backward runs (eagerly) or when the
        # compiled backward graph runs
        refusal = torch.ops.kernelgraft_autograd.no_backward(grad, op_name, describe_inputs(names, which), size)
        if k is None:
            out[i] = refusal
        else:
            out[i][k] = refusal
        return tuple(out)

    return backward, setup_context
