"""The op's signature: parameter kinds from type hints, the torch schema, and argument checks.

The schema string comes from ``torch.library.infer_schema`` so it is exactly what torch would infer
for a ``custom_op``; this module only adds what kernelgraft needs on top (parameter kinds for the
fast key and for input checks with kernelgraft's messages).
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .. import admit as _admit
from ..errors import InputError, SpecError, describe

__all__ = ["Param", "Signature", "parse_signature"]

_SCALARS: dict[Any, str] = {int: "int", float: "float", bool: "bool", str: "str", torch.dtype: "dtype"}


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    kind: str  # tensor | tensor_list | int | float | bool | str | dtype
    optional: bool
    default: Any  # inspect.Parameter.empty when required
    mutated: bool

    @property
    def expected(self) -> str:
        base = {"tensor": "a Tensor", "tensor_list": "a list of Tensors"}.get(self.kind, self.kind)
        return f"{base} or None" if self.optional else base


@dataclasses.dataclass(frozen=True)
class Signature:
    params: tuple[Param, ...]
    returns: str  # none | tensor | tuple
    n_returns: int
    schema: str
    mutated: tuple[int, ...]

    def bind(self, op_name: str, args: tuple, kwargs: dict) -> tuple:
        """Positional argument tuple with defaults filled in, or an InputError."""
        if len(args) > len(self.params):
            raise InputError(
                f"{op_name}: takes {len(self.params)} arguments "
                f"({', '.join(p.name for p in self.params)}), got {len(args)}"
            )
        values = list(args)
        for param in self.params[len(args):]:
            if param.name in kwargs:
                values.append(kwargs.pop(param.name))
            elif param.default is not inspect.Parameter.empty:
                values.append(param.default)
            else:
                raise InputError(f"{op_name}: missing argument {param.name!r} ({param.expected})")
        if kwargs:
            name = next(iter(kwargs))
            known = [p.name for p in self.params]
            raise InputError(f"{op_name}: unexpected argument {name!r}; the op takes {known}")
        return tuple(values)

    def check_types(self, op_name: str, args: Sequence[Any]) -> None:
        """Every argument is of its parameter's kind, and every tensor is one a kernel may read,
        or will once resolved (``kernelgraft.admit``): an ``InputError`` naming the argument."""
        for param, value in zip(self.params, args):
            if not _matches(param, value):
                raise InputError(
                    f"{op_name}: argument {param.name!r} expected {param.expected}, "
                    f"got {describe(value)}"
                )
        for param, value in zip(self.params, args):
            if param.kind == "tensor" and value is not None:
                _admit.check(op_name, param.name, value, param.mutated)
            elif param.kind == "tensor_list" and value is not None:
                for i, item in enumerate(value):
                    _admit.check(op_name, f"{param.name}[{i}]", item, param.mutated)

    def tensors(self, args: Sequence[Any]):
        """(name, tensor) for every tensor argument, list elements named ``name[i]``."""
        for param, value in zip(self.params, args):
            if param.kind == "tensor" and value is not None:
                yield param.name, value
            elif param.kind == "tensor_list" and value is not None:
                for i, item in enumerate(value):
                    yield f"{param.name}[{i}]", item


def _matches(param: Param, value: Any) -> bool:
    if value is None:
        return param.optional
    kind = param.kind
    if kind == "tensor":
        return isinstance(value, torch.Tensor)
    if kind == "tensor_list":
        return isinstance(value, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in value)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "dtype":
        return isinstance(value, torch.dtype)
    return True


def _unwrap_optional(hint: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _kind(hint: Any, where: str) -> str:
    if hint is torch.Tensor:
        return "tensor"
    if typing.get_origin(hint) in (list, Sequence, typing.Sequence) and typing.get_args(hint) == (torch.Tensor,):
        return "tensor_list"
    if hint in _SCALARS:
        return _SCALARS[hint]
    raise SpecError(
        f"{where}: type hint {hint!r} is not supported; use Tensor, Optional[Tensor], list[Tensor], "
        "int, float, bool, str or torch.dtype"
    )


def parse_signature(fn: Callable, mutates_args: Sequence[str], where: str) -> Signature:
    try:
        # ``torch`` resolves even where the reference's module imports it only locally (string
        # annotations under ``from __future__ import annotations`` look names up in globals).
        hints = typing.get_type_hints(fn, localns={"torch": torch})
    except Exception as exc:  # unresolved forward references and the like
        raise SpecError(f"{where}: could not read the type hints of {fn.__qualname__}: {exc}") from exc
    sig = inspect.signature(fn)
    params = []
    for name, p in sig.parameters.items():
        if p.kind not in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.POSITIONAL_ONLY):
            raise SpecError(
                f"{where}: parameter {name!r} is {p.kind.description}; the reference may take only "
                "plain positional-or-keyword parameters"
            )
        if name not in hints:
            raise SpecError(f"{where}: parameter {name!r} has no type hint; annotate it (e.g. x: torch.Tensor)")
        hint, optional = _unwrap_optional(hints[name])
        kind = _kind(hint, f"{where}: parameter {name!r}")
        params.append(Param(name, kind, optional or p.default is None, p.default, name in mutates_args))
    unknown = set(mutates_args) - {p.name for p in params}
    if unknown:
        raise SpecError(f"{where}: mutates_args names {sorted(unknown)}, which are not parameters")
    for p in params:
        if p.mutated and p.kind not in ("tensor", "tensor_list"):
            raise SpecError(f"{where}: mutates_args names {p.name!r}, which is not a Tensor")
    if "return" not in hints:
        raise SpecError(f"{where}: the reference has no return annotation; write -> torch.Tensor or -> None")
    ret = hints["return"]
    if ret is None or ret is type(None):
        returns, n = "none", 0
    elif ret is torch.Tensor:
        returns, n = "tensor", 1
    elif typing.get_origin(ret) is tuple and all(a is torch.Tensor for a in typing.get_args(ret)):
        returns, n = "tuple", len(typing.get_args(ret))
    else:
        raise SpecError(
            f"{where}: return annotation {ret!r} is not supported; use Tensor, tuple[Tensor, ...] or None"
        )
    try:
        # torch evaluates string annotations itself, in the function's globals: hand it the
        # signature with the hints resolved above instead.
        resolved = sig.replace(
            parameters=[p.replace(annotation=hints[p.name]) for p in sig.parameters.values()],
            return_annotation=None if hints.get("return") is type(None) else hints.get("return", sig.return_annotation),
        )

        def prototype(*args, **kwargs):  # only its signature is read
            raise NotImplementedError

        prototype.__signature__ = resolved  # type: ignore[attr-defined]
        schema = torch.library.infer_schema(prototype, mutates_args=tuple(mutates_args))
    except Exception as exc:
        raise SpecError(f"{where}: torch could not infer a schema: {exc}") from exc
    mutated = tuple(i for i, p in enumerate(params) if p.mutated)
    return Signature(tuple(params), returns, n, schema, mutated)
