"""Output semantics for the oracle: ``kg.op(..., outputs=..., compare=...)``.

By default every output is judged element by element against the reference (``kernelgraft.verify.oracle``).
Some outputs have more than one right answer: the indices of a top-k where values tie (torch's own
tie order is implementation-defined and differs between devices). An op says so once, and the one
oracle that serves ``kernelgraft check``, the tuner's gate and graft verification applies it.

Names. Each thing an op produces has a name: its returned tensors the names given by
``outputs=("weights", "indices")``, else ``out0``, ``out1``, ... in order; each mutated argument its
parameter's name. ``compare`` maps such names to a rule that replaces the default one for that
output; the others keep the default.

Rules.

- ``kg.ties_by(values, key=None)``: an index output whose entries select along the last dimension of
  the input ``values`` (a tensor parameter; its leading dimensions are the indices'). The indices
  are right when, row by row, they select the same values as the reference's, position by position,
  bit for bit, and are distinct where the reference's are: any order among equal values, and at a
  top-k cut, any of the tied candidates. ``key(values) -> tensor`` (same shape) gives what the
  reference actually ranks when that is not the input itself (a router ranks
  ``softmax(logits.float())``). The key is computed once per reference run, on the inputs' device, so
  the verdict never depends on which of the tied items a device's sort happens to return.
- A hook ``fn(got, want, inputs) -> None | str``: ``got`` and ``want`` map every name to the
  candidate's and the reference's (native precision) tensor, ``inputs`` maps each parameter to the
  argument before the call; return None when right, else a one-line reason. Given as ``compare=fn``
  it judges the whole op; given under a name it judges that output.

>>> import torch, kernelgraft as kg
>>> @kg.op("doctest::top2", outputs=("values", "indices"),
...        compare={"indices": kg.ties_by("x")})
... def top2(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
...     values, indices = torch.topk(x, 2)
...     return values, indices
>>> top2.output_names
('values', 'indices')
"""

from __future__ import annotations

import dataclasses
import keyword
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..errors import SpecError, describe

__all__ = ["TiesBy", "ties_by", "output_names", "normalize_compare", "Rules", "bind_rules", "compare_identity"]

Hook = Callable[[dict, dict, dict], "str | None"]
WHOLE = "*"  # the key under which a whole-op hook is kept


@dataclasses.dataclass(frozen=True)
class TiesBy:
    """An index output judged by the values it selects (``kg.ties_by``)."""

    values: str
    key: Callable[[torch.Tensor], torch.Tensor] | None = None

    def __repr__(self) -> str:
        return f"kg.ties_by({self.values!r}{', key=...' if self.key is not None else ''})"


def ties_by(values: str, *, key: Callable[[torch.Tensor], torch.Tensor] | None = None) -> TiesBy:
    """An index output that is right when it selects, from the input ``values`` along its last
    dimension, the same values as the reference (see the module docstring)."""
    if not isinstance(values, str) or not values:
        raise SpecError(f"kg.ties_by: values must name a Tensor parameter of the op, got {describe(values)}")
    if key is not None and not callable(key):
        raise SpecError(f"kg.ties_by({values!r}): key must be a function values -> tensor, got {describe(key)}")
    return TiesBy(values, key)


def output_names(outputs: Any, n_returns: int, params: Sequence[Any], where: str) -> tuple[str, ...]:
    """The names of an op's returned tensors: ``outputs=`` validated, else ``out0``, ``out1``, ..."""
    if outputs is None:
        return tuple(f"out{i}" for i in range(n_returns))
    if isinstance(outputs, str):
        outputs = (outputs,)
    if not isinstance(outputs, Sequence) or not all(isinstance(n, str) for n in outputs):
        raise SpecError(f"{where}: outputs must be a list of names, one per returned tensor, got {describe(outputs)}")
    names = tuple(outputs)
    if len(names) != n_returns:
        raise SpecError(f"{where}: outputs names {len(names)} outputs {list(names)}, but the reference returns "
                        f"{n_returns} tensor{'s' if n_returns != 1 else ''}")
    taken = {p.name for p in params if p.mutated}
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise SpecError(f"{where}: output name {name!r} is not a Python identifier")
        if name in taken:
            raise SpecError(f"{where}: output name {name!r} is also a mutated argument's name; pick another")
    if len(set(names)) != len(names):
        raise SpecError(f"{where}: outputs {list(names)} repeat a name")
    return names


def normalize_compare(compare: Any, produced: Sequence[str], params: Sequence[Any], where: str) -> dict[str, Any]:
    """``compare=`` as ``{name: rule}`` (a whole-op hook under ``"*"``), or a SpecError naming what is
    wrong. ``produced``: every name the op produces (outputs, then mutated arguments)."""
    if compare is None:
        return {}
    if callable(compare) and not isinstance(compare, TiesBy):
        return {WHOLE: compare}
    if not isinstance(compare, Mapping):
        raise SpecError(f"{where}: compare must be a function (got, want, inputs) -> None | str, or a dict "
                        f"{{output name: rule}}, got {describe(compare)}")
    tensor_params = {p.name: p for p in params if p.kind == "tensor"}
    rules: dict[str, Any] = {}
    for name, rule in compare.items():
        if name not in produced:
            raise SpecError(f"{where}: compare names {name!r}, which the op does not produce; it produces "
                            f"{list(produced)} (name returned tensors with kg.op(..., outputs=[...]))")
        if isinstance(rule, TiesBy):
            if rule.values not in tensor_params:
                raise SpecError(
                    f"{where}: compare[{name!r}] = {rule!r}: {rule.values!r} is not a Tensor parameter; "
                    f"kg.ties_by names the input the indices select from ({sorted(tensor_params)}). "
                    "The outputs alone cannot say which tied items a top-k cut left out")
            if tensor_params[rule.values].mutated:
                raise SpecError(f"{where}: compare[{name!r}] = {rule!r}: {rule.values!r} is mutated by the op; "
                                "the indices must select from an input the op does not change")
        elif not callable(rule):
            raise SpecError(f"{where}: compare[{name!r}] must be kg.ties_by(...) or a function "
                            f"(got, want, inputs) -> None | str, got {describe(rule)}")
        rules[name] = rule
    return rules


def compare_identity(rules: Mapping[str, Any], source: Callable[[Any], Any]) -> dict[str, Any]:
    """The rules in the op's identity: hooks and keys by their source (``source``)."""
    out: dict[str, Any] = {}
    for name, rule in sorted(rules.items()):
        if isinstance(rule, TiesBy):
            out[name] = {"ties_by": rule.values, "key": source(rule.key)}
        else:
            out[name] = {"hook": source(rule)}
    return out


# ------------------------------------------------------------------ judging
@dataclasses.dataclass(frozen=True)
class Rules:
    """An op's rules bound to one set of inputs (what a reference run needs to keep)."""

    rules: Mapping[str, Any]
    inputs: Mapping[str, Any]  # parameter -> argument before the call (hooks only)
    keys: Mapping[str, torch.Tensor]  # values name -> what the reference ranks (ties_by)

    def judges(self, name: str) -> bool:
        return WHOLE in self.rules or name in self.rules

    def judge(self, got: Mapping[str, torch.Tensor], want: Mapping[str, torch.Tensor]) -> list[tuple[str, str | None]]:
        """``[(what, problem or None)]`` for every rule; ``got`` and ``want`` by name."""
        out = []
        for name, rule in self.rules.items():
            what = "outputs" if name == WHOLE else name
            try:
                if isinstance(rule, TiesBy):
                    problem = _ties(got[name], want[name], self.keys[rule.values], name, rule.values)
                else:
                    problem = rule(dict(got), dict(want), dict(self.inputs))
                    if problem is not None and not isinstance(problem, str):
                        problem = f"the compare hook returned {describe(problem)}, expected None or a str"
            except Exception as exc:  # a hook that raises fails the candidate, with its reason
                problem = f"the compare rule raised {type(exc).__name__}: {str(exc)[:200]}"
            out.append((what, None if problem is None else f"{what}: {problem}"))
        return out


def bind_rules(op: Any, args: Sequence[Any], clone: Callable[[Any], Any]) -> Rules | None:
    """The op's rules for ``args`` (before any run writes them), or None when it has none."""
    rules = getattr(op, "compare", None)
    if not rules:
        return None
    params = op.signature.params
    hooks = any(not isinstance(r, TiesBy) for r in rules.values())
    inputs = {p.name: clone(a) for p, a in zip(params, args)} if hooks else {}
    keys = {}
    by_name = {p.name: a for p, a in zip(params, args)}
    for rule in rules.values():
        if isinstance(rule, TiesBy) and rule.values not in keys:
            values = by_name[rule.values]
            with torch.no_grad():
                keys[rule.values] = (rule.key(values) if rule.key is not None else values).detach()
    return Rules(dict(rules), inputs, keys)


def _ties(got: torch.Tensor, want: torch.Tensor, values: torch.Tensor, name: str, source: str) -> str | None:
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {str(got.dtype).removeprefix('torch.')}, expected {str(want.dtype).removeprefix('torch.')}"
    if got.numel() == 0:
        return None
    k = got.shape[-1] if got.dim() else 1
    lead = tuple(got.shape[:-1]) if got.dim() else ()
    if tuple(values.shape[:-1]) != lead:
        return (f"kg.ties_by({source!r}): the indices' leading shape {lead} is not {source}'s "
                f"{tuple(values.shape[:-1])}")
    n = values.shape[-1]
    rows = values.reshape(-1, n)
    g = got.detach().to(values.device).reshape(-1, k).long()
    w = want.detach().to(values.device).reshape(-1, k).long()
    outside = (g < 0) | (g >= n)
    if bool(outside.any()):
        first = int(outside.flatten().nonzero()[0])
        return (f"index {int(g.flatten()[first])} at {_where(first, got.shape)} is outside {source}'s last "
                f"dimension of {n}")
    bits = _bits(rows)
    picked_got, picked_want = bits.gather(1, g), bits.gather(1, w)
    differ = picked_got != picked_want
    if bool(differ.any()):
        first = int(differ.flatten().nonzero()[0])
        row, col = divmod(first, k)
        return (f"{int(differ.sum())} of {got.numel()} indices select other values than the reference's; "
                f"first at {_where(first, got.shape)}: got {int(g[row, col])} ({source} value "
                f"{_value(rows[row, g[row, col]])}), expected {int(w[row, col])} (value "
                f"{_value(rows[row, w[row, col]])})")
    # Distinct where the reference's are: the same tied item twice selects equal values too.
    sorted_g, _ = g.sort(1)
    sorted_w, _ = w.sort(1)
    repeat_g = (sorted_g[:, 1:] == sorted_g[:, :-1]).any(1)
    repeat_w = (sorted_w[:, 1:] == sorted_w[:, :-1]).any(1)
    bad = repeat_g & ~repeat_w
    if bool(bad.any()):
        row = int(bad.nonzero()[0])
        return (f"row {_where(row * k, got.shape)[:-1]} repeats an index ({g[row].tolist()}) where the "
                f"reference's are distinct ({w[row].tolist()})")
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Values as integers of the same width, so equality is bit equality (a NaN equals itself)."""
    if t.dtype.is_floating_point:
        width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.dtype.itemsize]
        return t.contiguous().view(width)
    return t


def _value(t: torch.Tensor) -> Any:
    v = t.item()
    return f"{v:.7g}" if isinstance(v, float) else v


def _where(flat: int, shape: Sequence[int]) -> list[int]:
    out = []
    for size in reversed(tuple(shape)):
        out.append(flat % size if size else 0)
        flat //= size if size else 1
    return out[::-1]
