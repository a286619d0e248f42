"""Run a candidate's ``supports`` and launch function on fake tensors whose sizes are symbols, and
keep what comes out as expressions of the inputs' sizes and strides.

``trace`` makes one fake tensor per input with a fresh symbol for every dimension (a ShapeEnv
without duck sizing or 0/1 specialisation), runs the meta function, the predicate and the launch
function under it, and returns the backend's record plus the ShapeEnv guards: the conditions under
which the record holds (e.g. ``x.shape[1] % 16 == 0`` or the range that fixes a power-of-two
block). With ``dynamic=False`` the sizes are the sample's own, and the guards pin them exactly.

Strides follow the impl's layout declaration (``_layout``): an input it needs contiguous is a
contiguous fake, its strides expressions of its sizes (the loaders check contiguity per call); any
other tensor input gets a fresh symbol per stride, written ``x.stride(d)``, with the sample's
strides as hints, so a kernel that takes strides gets the caller's, and whatever the predicate or
the launch decides from them is a guard (``x.stride(1) == 1``). A stride of 0 or 1 is a symbol too:
torch's own fakes would make it a constant, which bakes the sample's layout into the launch. The
meta function runs on contiguous fakes of the same sizes: output shapes do not depend on strides,
and torch's stride propagation would otherwise guard on the sample's stride order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, disable_fake_tensor_cache

from .expr import Unsupported, to_text
from ..spec.layout import contiguous_names, refusal
from .pow2 import traced_next_pow2

__all__ = ["Context", "trace", "Unsupported"]


@dataclasses.dataclass
class Context:
    """What a backend's recorder gets: the fake inputs and outputs by name, and expression text."""

    names: list[str]                     # op parameter names, then out0, out1, ...
    values: list[Any]                    # the fake values in that order
    sample: list[Any]                    # the real sample values (inputs only)
    symbols: dict[Any, str]
    dynamic: bool

    def text(self, value: Any) -> str:
        """Expression text of an int/float/SymInt (a symbolic value must be sizes only)."""
        if isinstance(value, torch.SymInt):
            return to_text(value.node.expr, self.symbols)
        if isinstance(value, (torch.SymFloat, torch.SymBool)):
            raise Unsupported(f"symbolic {type(value).__name__} {value}")
        if isinstance(value, bool) or isinstance(value, (int, float)):
            return repr(value)
        raise Unsupported(f"value {value!r} of type {type(value).__name__}")

    def scalar(self, value: Any) -> tuple[str, bool]:
        """(text, tied): a float that is an op argument by identity is written as that argument."""
        if isinstance(value, float):
            for name, v in zip(self.names, self.values):
                if v is value:
                    return name, True
            return repr(value), False
        return self.text(value), True

    def tensor_source(self, t: torch.Tensor) -> str:
        """The op input or output a tensor argument of the kernel points at (offset 0)."""
        for name, v in zip(self.names, self.values):
            if t is v:
                return name
            if isinstance(v, torch.Tensor) and t._base is not None and t._base is v:
                if self.hint(t.storage_offset()) != 0:
                    raise Unsupported(f"a view of {name} with a storage offset")
                return name
        raise Unsupported("a kernel tensor argument that is not an input or output of the op (a tensor the "
                          "launch made, such as a .contiguous() copy, is not in the bundle: pass the "
                          "input's strides to the kernel, or name the input in the impl's contiguous=)")

    def hint(self, value: Any) -> Any:
        """The sample's concrete value of a (possibly symbolic) int."""
        if isinstance(value, torch.SymInt):
            return value.node.hint if value.node.hint is not None else int(value)
        return value


def _fake_inputs(mode, env, args, params, dynamic, required, symbols):
    """One fake per argument (scalars as they are). ``symbols`` gets the name of each size and
    stride symbol made."""
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext

    dense = [torch.empty(a.shape, dtype=a.dtype, device=a.device) if isinstance(a, torch.Tensor) else a
             for a in args]  # sizes and dtype only: fakes are made of these, outside the mode
    out = []
    with mode:
        for param, a, d in zip(params, args, dense):
            if isinstance(a, torch.Tensor):
                if dynamic:
                    ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * a.dim())
                    f = mode.from_tensor(d, symbolic_context=ctx)
                else:
                    f = mode.from_tensor(d, static_shapes=True)
                for dim, s in enumerate(f.shape):
                    if isinstance(s, torch.SymInt):
                        symbols.setdefault(s.node.expr, f"{param.name}.shape[{dim}]")
                if param.name not in required:
                    strides: list[Any] = []
                    for dim, hint in enumerate(a.stride()):
                        if not dynamic:
                            strides.append(hint)
                            continue
                        text = f"{param.name}.stride({dim})"
                        sym = env.create_symbol(hint, ConstantSource(f"kg_{param.name}_stride{dim}"),
                                                dynamic_dim=DimDynamic.DYNAMIC)
                        symbols.setdefault(sym, text)
                        strides.append(env.create_symintnode(sym, hint=hint))
                    # without the dispatch cache, whose bookkeeping (the cached output's memory format)
                    # would guard on the sample's stride order: a guard no kernel asked for
                    with disable_fake_tensor_cache(mode):
                        f = torch.empty_strided(f.shape, strides, dtype=a.dtype, device=a.device)
                out.append(f)
            elif isinstance(a, (list, tuple)):
                raise Unsupported(f"{param.name} is a list of tensors")
            else:
                out.append(a)
    return out


def _stride_pins(args, params, required) -> list[str]:
    """Static shapes: the strides of the inputs not traced contiguous are constants of the launch."""
    return [f"({p.name}.stride({d}) == {s})" for p, a in zip(params, args)
            if isinstance(a, torch.Tensor) and p.name not in required for d, s in enumerate(a.stride())]


def trace(op, impl, config, args: Sequence[Any], record: Callable[[Context, tuple], Any], *,
          dynamic: bool) -> tuple[Any, list[str], list[list[str]], list[str]] | str:
    """(record result, guards, output shapes, output dtypes), or why the candidate does not take
    this sample (its layout declaration or ``supports`` refused it, as eager dispatch would)."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    params = op.signature.params
    names = [p.name for p in params]
    why = refusal(impl, params, args)
    if why is not None:
        return why
    required = set(contiguous_names(impl, names))
    env = ShapeEnv(duck_shape=False, specialize_zero_one=False) if dynamic else None
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=False)
    symbols: dict[Any, str] = {}
    fakes = _fake_inputs(mode, env, args, params, dynamic, required, symbols)
    with mode:
        dense = [torch.empty(f.shape, dtype=f.dtype, device=f.device)
                 if isinstance(f, torch.Tensor) and n not in required else f for n, f in zip(names, fakes)]
        outs = op.meta(*dense)  # None for an op that returns None: nothing to trace
        outs = () if outs is None else (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        outs = tuple(torch.empty(o.shape, dtype=o.dtype) for o in outs)
        ctx = Context(names + [f"out{i}" for i in range(len(outs))], list(fakes) + list(outs),
                      list(args), symbols, dynamic)
        kwargs = config.as_dict()
        # next_power_of_2 of a size is one symbol written next_pow2(...), not Triton's expansion
        with traced_next_pow2(env, symbols):
            if impl.supports is not None:
                verdict = impl.supports(*fakes, **kwargs)
                if isinstance(verdict, str):
                    return verdict or "supports() refused"
                # Judged as eager dispatch judges it (truthiness): on symbolic sizes ``n <= BLOCK``
                # is a SymBool, and bool() of it records a guard, so the bundled kernel is valid
                # exactly where supports() holds.
                if not bool(verdict):
                    return "supports() refused"
            result = record(ctx, (*fakes, *outs), kwargs)
        out_shapes = [[ctx.text(s) for s in o.shape] for o in outs]
        out_dtypes = [str(o.dtype).removeprefix("torch.") for o in outs]
    guards = []
    if env is not None:
        for g in env.guards:
            guards.append(to_text(g.expr, symbols))
    else:
        for name, a in zip(names, args):
            if isinstance(a, torch.Tensor):
                guards += [f"({name}.shape[{d}] == {s})" for d, s in enumerate(a.shape)]
        guards += _stride_pins(args, params, required)
    return result, list(dict.fromkeys(guards)), out_shapes, out_dtypes
