"""Admitting a structural match of a pattern: does it compute what the op computes?

The matcher compares targets and literals; a match is replaced only when, in addition:
- each matched node has the rank of the pattern node it stands for (a trace at rank 2 spells
  "the last dim" as 1, which at rank 3 is another dim),
- each dim argument, normalised by the model's rank, is the pattern's,
- each scalar bound from the model has the op's kind, and the pattern traced at those values is
  the graph that matched (a scalar may change a trace's structure),
- with ``verify``, the op equals the pattern on the variant's example tensors in the model's
  dtypes, with the model's scalars, on the model's device where it is available (the op runs
  a kernel there, not PyTorch competing: ``graft._verify.kernels_only``).
Checks are cached per pattern: a model with 32 identical layers pays once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..errors import TuneWarning
from . import variants as _variants

__all__ = ["Binding", "admit", "describe_key", "target", "OTHER_RANK"]

# The end of a rank refusal: another variant's refusal of the same site says more.
OTHER_RANK = " in this trace"


@dataclass
class Binding:
    """What a match gives the op: the model's tensors (tensor-slot order) and scalar values."""

    inputs: list[fx.Node]
    scalars: dict[int, Any]


def admit(pattern: Any, v: _variants.Variant, match: Any) -> Binding | str:
    """The binding of a structural match, or why it does not compute what the op computes."""
    nodes = match.nodes_map
    inputs = [nodes.get(p) for p in v.inputs]
    if any(not isinstance(n, fx.Node) for n in inputs):
        return "a pattern input is unused or matched a constant"
    scalars: dict[int, Any] = {}
    for slot, ph in v.scalars.items():
        value, param = nodes.get(ph), pattern.params[slot]
        if isinstance(value, fx.Node):
            return (f"{param.name} is computed in the model (node %{value.name}); "
                    f"{pattern.op.name} takes it as a constant (torch.compile turns a float attribute "
                    "that changed between compiles of one forward into an input; "
                    "torch._dynamo.config.specialize_float=True keeps it a constant)")
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) if param.kind == "float" \
            else isinstance(value, bool) if param.kind == "bool" \
            else isinstance(value, int) and not isinstance(value, bool)
        if not ok:
            return f"{param.name}={value!r} where {pattern.op.name} takes {param.kind}"
        scalars[slot] = float(value) if param.kind == "float" else value
    for ph, pnode, arg, want in v.dims:
        got, gnode = nodes.get(ph), nodes.get(pnode)
        rp, rg = _variants.input_rank(pnode), _variants.input_rank(gnode) if gnode is not None else None
        same = (_variants.normalize_dims(want, rp) == _variants.normalize_dims(got, rg)
                if rp is not None and rg is not None else want == got)
        if not same or _variants.normalize_dims(got, rg) is None:
            return f"{target(pnode)} over {arg}={want!r} in the pattern; the model has {arg}={got!r}"
    for pn, gn in nodes.items():
        if pn.op == "call_function" or pn in v.inputs:
            rp = _ranks(pn.meta.get("val"))
            rg = _ranks(gn.meta.get("val")) if isinstance(gn, fx.Node) else None
            if rp is not None and rg is not None and rp != rg:
                what = target(pn) if pn.op == "call_function" else pn.name
                return f"{what} is rank {rg} in the model and rank {rp}{OTHER_RANK}"
    changed = {s: x for s, x in scalars.items() if not _variants.same(x, pattern.example[s])}
    if changed:
        why = _confirm(pattern, v, changed)
        if why:
            return why
    if pattern.verify:
        why = _check(pattern, v, inputs, {**{s: pattern.example[s] for s in v.scalars}, **scalars})
        if why:
            return why
    return Binding(inputs, scalars)

def _confirm(pattern: Any, v: _variants.Variant, scalars: dict[int, Any]) -> str | None:
    """None when the pattern traced at the model's scalar values is the graph that matched."""
    key = (v.ir, v.key, tuple(sorted(scalars.items())))
    with pattern._lock:
        if key not in pattern._confirmed:
            names = ", ".join(f"{pattern.params[s].name}={x!r}" for s, x in scalars.items())
            try:
                again = _variants.trace(v.ir, lambda *ts: pattern.call(list(ts), scalars), v.tensors)
                d = _variants.diff(v.base, again[0])
            except Exception as exc:
                d = None
                why = f"the pattern could not be traced with {names}: {_variants.first_line(exc)}"
            else:
                why = f"the pattern traced with {names} is a different graph from the one matched"
            ok = d is not None and all(
                any((k, p) in v.positions.get(s, ()) and _variants.same(v1, x)
                    for s, x in scalars.items())
                for k, p, v0, v1 in d)
            pattern._confirmed[key] = None if ok else why
        return pattern._confirmed[key]

def _check(pattern: Any, v: _variants.Variant, inputs: list[fx.Node], scalars: dict[int, Any]) -> str | None:
    """None when the op equals the pattern on the variant's tensors, in the model's dtypes,
    with the model's scalars (on the model's device where it is available, else the CPU)."""
    vals = [n.meta.get("val") for n in inputs]
    dtypes = tuple(x.dtype if isinstance(x, torch.Tensor) else None for x in vals)
    device = next((x.device for x in vals if isinstance(x, torch.Tensor)), torch.device("cpu"))
    if device.type == "cuda" and not torch.cuda.is_available() or device.type not in ("cuda", "cpu"):
        device = torch.device("cpu")
    key = (v.key, dtypes, str(device), tuple(sorted(scalars.items())))
    with pattern._lock:
        if key not in pattern._checked:
            pattern._checked[key] = _run_check(pattern, v, dtypes, device, scalars)
        return pattern._checked[key]

def _run_check(pattern: Any, v, dtypes, device, scalars) -> str | None:
    # The Inductor pass runs inside a compile's fake mode; the check runs real tensors. Inside
    # a compile the op does not tune (and says so): the check needs no tuning, only a kernel.
    with unset_fake_temporarily(), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", TuneWarning)
        return _run_check_real(pattern, v, dtypes, device, scalars)

def _run_check_real(pattern: Any, v, dtypes, device, scalars) -> str | None:
    from ..verify.oracle import clone
    from .verify import call_op, compare

    tensors = [(t.to(d) if d is not None and t.is_floating_point() and d.is_floating_point else t)
               .to(device) for t, d in zip(v.tensors, dtypes)]
    where = f"at {describe_key(v.key)} with {[_describe_arg(t) for t in tensors]}"
    try:
        expected = pattern.call(clone(tensors), scalars)
    except Exception as exc:
        return f"the pattern raised {where}: {_variants.first_line(exc)}"
    args = list(pattern.example)
    for i, t in zip(pattern.tensor_slots, clone(tensors)):
        args[i] = t
    for i, x in scalars.items():
        args[i] = x
    try:  # a kernel is what is checked (never the reference against itself), in guarded memory
        got, damage = call_op(pattern.op, args)
    except Exception as exc:
        return f"{pattern.op.name} raised {where}: {_variants.first_line(exc)}"
    if damage is not None:
        return f"{pattern.op.name} writes memory that is not its own {where}: {damage}"
    problem = compare(expected, got, ops=[pattern.op], override=pattern.tolerance)
    return None if problem is None else f"{pattern.op.name} and the pattern differ {where}: {problem}"


def describe_key(key: _variants.VariantKey) -> str:
    ranks = "/".join(str(r) for r in key.ranks if r is not None)
    dtype = "" if key.dtype is None else f", {str(key.dtype).replace('torch.', '')}"
    return f"ranks {ranks}{dtype}"


def _describe_arg(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
    return repr(t)


def _ranks(val: Any) -> Any:
    if isinstance(val, torch.Tensor):
        return val.dim()
    if isinstance(val, (list, tuple)) and val and all(isinstance(x, torch.Tensor) for x in val):
        return tuple(x.dim() for x in val)
    return None


def target(node: fx.Node) -> str:
    return str(node.target).replace("torch.ops.", "") if node.op == "call_function" else f"%{node.name}"
