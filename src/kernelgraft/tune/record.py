"""Record the kernelgraft op calls a model makes, and find the sites that follow its batch and length.

``record(run)`` runs ``run()`` under a dispatch mode that notes every call of a kernelgraft op (its
arguments as ``_ranges.describe_arg`` describes them) and answers it with the op's reference: no
kernel compiles, nothing is tuned. ``sites_of_model`` records a model at the ``RECORD_POINTS``
``(batch, seq)`` passes and fits each call site (the n-th call of an op in a pass is one site) with
``_ranges.fit_site``. A site whose sizes do not follow the pass, or an op called a different
number of times in different passes, is left out with the reason.

Seen are calls made in eager mode: module-type grafts, decorated functions, ops called directly.
A pattern graft acts inside ``torch.compile`` only, so an eager pass does not meet it: give its
op and a call to ``pretune`` instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..op import registry as _registry
from ..op.modes import tune
from .ranges import RECORD_POINTS, Site, dedupe, describe_arg, fit_site

__all__ = ["record", "sites_of_model", "inputs_from_config", "resized_inputs"]

log = logging.getLogger(__name__)


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[tuple] | str]] = []
        self._ops: dict[Any, Any] = {}

    def _op_of(self, func: Any) -> Any:
        if func not in self._ops:
            name = getattr(getattr(func, "_schema", None), "name", "")
            self._ops[func] = _registry.lookup(name) if "::" in name and not name.startswith("aten::") else None
        return self._ops[func]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = self._op_of(func)
        if op is None:
            return func(*args, **kwargs)
        bound = op.signature.bind(op.name, tuple(args), dict(kwargs))
        try:
            described: list[tuple] | str = [describe_arg(a) for a in bound]
        except ValueError as exc:
            described = str(exc)
        self.calls.append((op, described))
        return op.reference(*bound)  # the reference: no kernel compiles while recording


def record(run: Callable[[], Any]) -> list[tuple[Any, list[tuple] | str]]:
    """``(op, described arguments)`` of every kernelgraft op call ``run()`` makes, in order."""
    with torch.no_grad(), tune("off"), _Recorder() as recorder:
        run()
    return recorder.calls


def inputs_from_config(config: Any, device: Any) -> Callable[[int, int], tuple[tuple, dict]]:
    """Inputs of a causal LM for ``(batch, seq)`` from its Hugging Face config: token ids below
    ``vocab_size`` and an all-ones attention mask."""
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 1:
        raise ValueError("the config has no vocab_size")

    def make(batch: int, seq: int) -> tuple[tuple, dict]:
        g = torch.Generator().manual_seed(batch * 1000 + seq)
        ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
        return (ids,), {"attention_mask": torch.ones(batch, seq, dtype=torch.long, device=device),
                        "use_cache": False}

    return make


def resized_inputs(example: Any) -> Callable[[int, int], tuple[tuple, dict]]:
    """Inputs for ``(batch, seq)`` made from one example call (a tuple of arguments, or
    ``(args, kwargs)``): every tensor of two or more dimensions is cut or tiled to ``batch`` along
    dimension 0 and to ``seq`` along dimension 1 (token ids ``[batch, seq]``, masks, embeddings
    ``[batch, seq, hidden]``); other arguments are passed as they are."""
    if isinstance(example, tuple) and len(example) == 2 and isinstance(example[1], Mapping) \
            and isinstance(example[0], (tuple, list)):
        args, kwargs = tuple(example[0]), dict(example[1])
    elif isinstance(example, (tuple, list)):
        args, kwargs = tuple(example), {}
    else:
        args, kwargs = (example,), {}

    def fit(t: Any, batch: int, seq: int) -> Any:
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            return t
        for dim, want in ((0, batch), (1, seq)):
            have = t.shape[dim]
            if have != want:
                reps = [1] * t.dim()
                reps[dim] = -(-want // have)
                t = t.repeat(*reps).narrow(dim, 0, want)
        return t.contiguous()

    def make(batch: int, seq: int) -> tuple[tuple, dict]:
        return (tuple(fit(a, batch, seq) for a in args), {k: fit(v, batch, seq) for k, v in kwargs.items()})

    return make


def sites_of_model(model: Any, make_inputs: Callable[[int, int], Any],
                   points: Sequence[tuple[int, int]] = RECORD_POINTS) -> tuple[list[Site], list[str]]:
    """(sites, reasons for the calls left out) of ``model`` over passes made by ``make_inputs``
    (``(batch, seq) -> args`` or ``-> (args, kwargs)``)."""
    passes = []
    for batch, seq in points:
        made = make_inputs(batch, seq)
        if isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], Mapping):
            args, kwargs = made
        else:
            args, kwargs = (made if isinstance(made, tuple) else (made,)), {}
        passes.append(record(lambda: model(*args, **kwargs)))
    by_op: list[dict[str, list]] = []
    for calls in passes:
        grouped: dict[str, list] = {}
        for op, described in calls:
            grouped.setdefault(op.name, []).append((op, described))
        by_op.append(grouped)
    sites, left_out = [], []
    for name, first in by_op[0].items():
        counts = [len(p.get(name, ())) for p in by_op]
        if len(set(counts)) != 1:
            left_out.append(f"{name}: called {counts} times in passes of (batch, seq) {list(points)}")
            continue
        for n, (op, _) in enumerate(first):
            calls = [p[name][n][1] for p in by_op]
            bad = next((c for c in calls if isinstance(c, str)), None)
            if bad is not None:
                left_out.append(f"{name} call {n}: {bad}")
                continue
            site = fit_site(op, calls, points)
            if isinstance(site, str):
                left_out.append(f"{name} call {n}: {site}")
            else:
                sites.append(site)
    for reason in left_out:
        log.info("pretune: site left out: %s", reason)
    return dedupe(sites), left_out
