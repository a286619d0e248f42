"""The ``torch.autograd.Function`` of a functional op: its forward is the op, its backward the one
declared with ``op.register_autograd`` (``torch.library.register_autograd``'s form) or the refusal.

The Function takes the op's arguments flat: autograd tracks tensors only at the top level, so a
``Tensor[]`` argument is spread into its elements (its length travels in a ``_Layout`` after them),
and the backward's gradients for it are gathered back into a list. ``setup_context`` and
``backward`` see the op's own argument structure, ``ctx.needs_input_grad`` included, exactly as
``torch.library`` gives them to a custom op.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import SpecError, UnsupportedError, describe


__all__ = ["make_function"]


class _State:
    """The op's current backward: replaced in place by ``register_autograd``."""

    __slots__ = ("backward", "setup_context")

    def __init__(self) -> None:
        self.backward: Callable[..., Any] | None = None
        self.setup_context: Callable[..., Any] | None = None


class _Layout:
    """The lengths of the op's ``Tensor[]`` arguments in one call (None for other arguments)."""

    __slots__ = ("lengths",)

    def __init__(self, lengths: tuple) -> None:
        self.lengths = lengths


def _structure(op: Any):
    """(flatten, regroup) between the op's arguments and the Function's flat inputs, or None when
    the op has no ``Tensor[]`` argument (its arguments are the Function's inputs as they are)."""
    if not any(p.kind == "tensor_list" for p in op.signature.params):
        return None

    def flatten(args: tuple) -> tuple:
        flat: list[Any] = []
        lengths: list[int | None] = []
        for a in args:
            if isinstance(a, (list, tuple)):
                flat.extend(a)
                lengths.append(len(a))
            else:
                flat.append(a)
                lengths.append(None)
        return (*flat, _Layout(tuple(lengths)))

    def regroup(flat, layout: _Layout) -> tuple:
        """Flat inputs (or per-input values such as needs_input_grad) back into the op's arguments."""
        out, pos = [], 0
        for n in layout.lengths:
            if n is None:
                out.append(flat[pos])
                pos += 1
            else:
                out.append(list(flat[pos:pos + n]))
                pos += n
        return tuple(out)

    return flatten, regroup


def make_function(op: Any, overload: Any) -> type:
    """The op's Function class; ``kg_state`` holds its backward, ``kg_flatten`` turns the op's
    arguments into the Function's inputs."""
    state = _State()
    structure = _structure(op)
    nparams = len(op.signature.params)
    has_layout = structure is not None
    flatten, regroup = structure if has_layout else (None, None)

    def unflatten(flat: tuple) -> tuple:
        return regroup(flat[:-1], flat[-1]) if has_layout else flat

    def forward(*flat):
        # grad mode is off here: the op's autograd kernel sends this straight to its kernels
        return overload(*unflatten(flat))

    def setup_context(ctx, inputs, output):
        if has_layout:
            ctx.kg_layout = inputs[-1]
        if state.setup_context is not None:
            state.setup_context(ctx, unflatten(inputs), output)

    def backward(ctx, *grads):
        if state.backward is None:  # pragma: no cover - set_backward runs at install
            raise UnsupportedError(f"{op.name} has no backward")
        need = ctx.needs_input_grad
        structured = regroup(need[:-1], ctx.kg_layout) if has_layout else need
        ctx.needs_input_grad = structured
        try:
            result = state.backward(ctx, *grads)
        finally:
            ctx.needs_input_grad = need
        if not isinstance(result, tuple):
            result = (result,)
        if len(result) != nparams:
            raise SpecError(
                f"{op.name}: its backward must return one gradient (or None) per argument of the op, "
                f"{nparams} in all ({', '.join(p.name for p in op.signature.params)}), got "
                f"{len(result)}: {describe(result)}")
        if not has_layout:
            return result
        flat: list[Any] = []
        for param, g, n in zip(op.signature.params, result, structured):
            if param.kind != "tensor_list":
                flat.append(g)
            elif g is None:
                flat.extend([None] * len(n))
            elif isinstance(g, (list, tuple)) and len(g) == len(n):
                flat.extend(g)
            else:
                raise SpecError(f"{op.name}: its backward must return, for the list argument "
                                f"{param.name!r}, None or a list of {len(n)} gradients, got {describe(g)}")
        return (*flat, None)

    def jvp(ctx, *tangents):  # pragma: no cover - forward AD runs the reference (_autograd)
        raise UnsupportedError(f"{op.name}: forward-mode AD runs the op's reference, not this Function")

    ns, name = op.name.split("::")
    fn = type(f"{ns}_{name}", (torch.autograd.Function,), {
        "forward": staticmethod(forward),
        "setup_context": staticmethod(setup_context),
        "backward": staticmethod(backward),
        "jvp": staticmethod(jvp),
    })
    fn.kg_state = state
    fn.kg_flatten = flatten if has_layout else None
    return fn
