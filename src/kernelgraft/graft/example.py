"""The example inputs a graft is checked and tuned with."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import GraftWarning, VerificationError
from ..op.modes import tune

__all__ = ["MAX_SAMPLES", "as_call", "run_failed", "tune_at_example"]

MAX_SAMPLES = 3  # an op's sample inputs a graft checks, at most


def as_call(example_inputs: Any) -> tuple[tuple, dict]:
    """``example_inputs`` (a tuple of args, a dict of kwargs, ``(args, kwargs)`` or one tensor) as
    (args, kwargs)."""
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


def tune_at_example(run: Callable[[], Any], ops: Any) -> None:
    """Run the grafted model once more on the example inputs, under the caller's tuning settings
    (the checks ran with tuning off): the ops tune at the shapes the example meets, as the first
    call would, so that a ``torch.compile`` of the model finds their decisions when Inductor makes
    its in-graph choice (``_inline``: tuning cannot run inside a compile). The tuning is made inside
    the calls (``blocking=True``), not off their path. Nothing is measured where the settings
    measure nothing (CPU tensors, ``kg.tune("cached")``)."""
    try:
        with torch.no_grad(), tune(blocking=True):  # a warm-up: the decisions must be there after it
            run()
    except Exception as exc:  # the checks passed: a failure here is the tuner's, and says so itself
        names = ", ".join(sorted(getattr(o, "name", "?") for o in ops))
        warnings.warn(f"kg.graft: tuning {names} on the example inputs failed ({type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:200] if str(exc) else ''}); they tune on first use",
                      GraftWarning, stacklevel=4)


def run_failed(what: str, exc: Exception, undone: str) -> VerificationError:
    """The error for a grafted model that raised where the original ran: a graft that does not
    run is refused, with the first line of what went wrong."""
    text = str(exc).strip().splitlines()
    return VerificationError(f"kg.graft: {what}, the model raised {type(exc).__name__}: "
                             f"{text[0][:300] if text else ''}; {undone}")
