"""Graft by module type: replace the forward of matching modules with a call to an op, and undo it.

How a module's forward feeds the op (``Binding``), decided once per module type from the op's
parameters and ``type(module).forward``:

1. an explicit mapping ``{op_param: "attr_name" | callable(module)}`` wins;
2. an op parameter named like a forward parameter takes that argument;
3. else, if the module has an attribute of that name (or a common alias: ``eps`` is also found as
   ``variance_epsilon``, ``epsilon``...), the attribute is passed (read at every call, so a later
   ``module.eps = ...`` or ``.to(dtype)`` is seen);
4. remaining op parameters take the remaining forward parameters in order;
5. op parameters still without a source use their default, else the graft is refused.

Forward parameters left over must have defaults; when a caller passes one of them, the grafted
forward runs the original (the op cannot express it). A grafted module's class becomes a subclass
of its own, named as it, made for the graft (``_forward``: why a class and not an instance
forward); the original class is never changed, so other instances and other models are untouched.
A module that already had a forward of its own on the instance keeps that way of overriding: its
grafted forward is set on the instance.
"""

from __future__ import annotations

import inspect
import logging
import types
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import GraftWarning, SpecError, describe
from . import forward as _forward

__all__ = ["ATTR_ALIASES", "Binding", "make_binding", "graft_modules", "ungraft_modules", "is_grafted"]

log = logging.getLogger(__name__)

ATTR_ALIASES: dict[str, tuple[str, ...]] = {
    "eps": ("eps", "variance_epsilon", "epsilon", "norm_eps", "layer_norm_eps", "rms_norm_eps"),
    "weight": ("weight", "scale", "gamma"),
    "bias": ("bias", "beta"),
}
_MISSING = object()
_is_compiling = torch.compiler.is_compiling


def has_backward(op: Any) -> bool:
    """Whether the op has a backward (``register_autograd`` or a torch.library autograd kernel).
    A kernelgraft op may carry an autograd kernel whose backward refuses until one is declared
    (``kernelgraft.op.autograd``), so its own record is asked first."""
    if hasattr(op, "_autograd_functional"):
        return op._autograd is not None
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op.name, "Autograd"))
    except Exception:  # an op name torch does not know
        return False


@dataclass(frozen=True)
class Binding:
    """How a forward's arguments and a module's attributes become the op's arguments.

    ``sources[i]`` says where op parameter ``i`` comes from: ``("arg", j)`` forward argument ``j``,
    ``("attr", name_or_callable)`` a module attribute, ``("const", value)`` the op's default.
    """

    op: Any
    where: str
    forward_names: tuple[str, ...]
    forward_defaults: tuple[Any, ...]  # _MISSING where required
    extras: tuple[int, ...]  # forward parameters the op cannot take (must keep their default)
    sources: tuple[tuple[str, Any], ...]
    positional: int  # how many leading forward_names a call may pass by position (not keyword-only)

    def describe(self) -> str:
        parts = []
        for param, (kind, src) in zip(self.op.signature.params, self.sources):
            if kind == "arg":
                parts.append(f"{param.name}=<forward arg {self.forward_names[src]!r}>")
            elif kind == "attr":
                parts.append(f"{param.name}=self.{src}" if isinstance(src, str) else f"{param.name}=<fn>")
            else:
                parts.append(f"{param.name}={src!r}")
        return f"{self.op.name}({', '.join(parts)})"

    def attr_value(self, module: Any, src: Any) -> Any:
        return getattr(module, src) if isinstance(src, str) else src(module)

    def required_positional(self) -> int | None:
        """How many leading forward parameters have no default (a call passing exactly those
        positionally is the common one), or None when a later parameter has none either (one
        that is keyword-only)."""
        n = 0
        while n < self.positional and self.forward_defaults[n] is _MISSING:
            n += 1
        if any(d is _MISSING for d in self.forward_defaults[n:]):
            return None
        return n

    def check_module(self, module: Any) -> str | None:
        """None when this instance can feed the op, else why not (e.g. ``weight`` is None)."""
        for param, (kind, src) in zip(self.op.signature.params, self.sources):
            if kind != "attr":
                continue
            try:
                value = self.attr_value(module, src)
            except Exception as exc:
                return f"reading attribute for op parameter {param.name!r} failed: {exc}"
            if value is None and not param.optional:
                return f"op parameter {param.name!r} needs {param.expected}, the module has None"
            if param.kind == "tensor" and value is not None and not isinstance(value, torch.Tensor):
                return f"op parameter {param.name!r} needs a Tensor, the module has {describe(value)}"
            if param.kind in ("float", "int") and not isinstance(value, (int, float)):
                return f"op parameter {param.name!r} needs {param.kind}, the module has {describe(value)}"
        return None

    def op_args(self, module: Any, args: tuple, kwargs: dict) -> list | None:
        """The op's positional arguments for this call, or None when the op cannot express it."""
        names = self.forward_names
        if len(args) > self.positional:  # keyword-only parameters are never passed by position
            return None
        values = list(args)
        if kwargs:
            kwargs = dict(kwargs)
            for name in names[len(args):]:
                values.append(kwargs.pop(name, _MISSING))
            if kwargs:
                return None
        else:
            values.extend([_MISSING] * (len(names) - len(args)))
        for j in self.extras:
            if values[j] is not _MISSING and values[j] is not self.forward_defaults[j]:
                return None
        out = []
        for kind, src in self.sources:
            if kind == "arg":
                value = values[src]
                if value is _MISSING:
                    value = self.forward_defaults[src]
                    if value is _MISSING:
                        return None
                if isinstance(value, torch.Tensor):
                    # the original takes any layout; kernels may need a dense one (no-op if dense)
                    value = value.contiguous()
                out.append(value)
            elif kind == "attr":
                out.append(self.attr_value(module, src))
            else:
                out.append(src)
        return out


def _forward_params(fn: Callable, where: str, skip_self: bool) -> list[inspect.Parameter]:
    params = list(inspect.signature(fn).parameters.values())
    if skip_self and params:
        params = params[1:]
    return [
        p for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                      inspect.Parameter.KEYWORD_ONLY)
    ]


def make_binding(
    op: Any,
    forward: Callable,
    *,
    module: Any = None,
    attrs: Mapping[str, Any] | None = None,
    skip_self: bool = True,
    attr_fallback: Callable[[str], Any] | None = None,
    where: str,
) -> Binding:
    """Decide how ``forward``'s arguments (and ``module``'s attributes) feed ``op``; SpecError when
    they cannot (the message names the parameter and how to map it)."""
    op_params = op.signature.params
    op_names = [p.name for p in op_params]
    attrs = dict(attrs or {})
    unknown = set(attrs) - set(op_names)
    if unknown:
        raise SpecError(f"{where}: the attribute mapping names {sorted(unknown)}, which are not "
                        f"parameters of {op.name}{op.signature.schema}")
    fparams = _forward_params(forward, where, skip_self)
    fnames = [p.name for p in fparams]
    fdefaults = tuple(_MISSING if p.default is inspect.Parameter.empty else p.default for p in fparams)
    sources: list[tuple[str, Any] | None] = [None] * len(op_params)
    used: set[int] = set()
    for i, p in enumerate(op_params):
        if p.name in attrs:
            src = attrs[p.name]
            if not (isinstance(src, str) or callable(src)):
                raise SpecError(f"{where}: mapping for {p.name!r} must be an attribute name or a "
                                f"function of the module, got {describe(src)}")
            sources[i] = ("attr", src)
        elif p.name in fnames:
            j = fnames.index(p.name)
            sources[i] = ("arg", j)
            used.add(j)
    if module is not None:
        for i, p in enumerate(op_params):
            if sources[i] is None:
                for alias in ATTR_ALIASES.get(p.name, (p.name,)):
                    if alias not in fnames and hasattr(module, alias):
                        sources[i] = ("attr", alias)
                        break
    free = [j for j in range(len(fparams)) if j not in used
            and fparams[j].kind != inspect.Parameter.KEYWORD_ONLY]
    for i, p in enumerate(op_params):
        if sources[i] is None and free and fdefaults[free[0]] is _MISSING:
            j = free.pop(0)
            sources[i] = ("arg", j)
            used.add(j)
    for i, p in enumerate(op_params):
        if sources[i] is None:
            if attr_fallback is not None and p.default is inspect.Parameter.empty:
                sources[i] = ("attr", attr_fallback(p.name))
            elif p.default is not inspect.Parameter.empty:
                sources[i] = ("const", p.default)
            else:
                aliases = ATTR_ALIASES.get(p.name, (p.name,))
                raise SpecError(
                    f"{where}: op parameter {p.name!r} ({p.expected}) has no source: it is not a "
                    f"parameter of forward{tuple(fnames)} nor an attribute of the module (tried "
                    f"{', '.join(aliases)}); map it explicitly, e.g. {{Type: (op, {{{p.name!r}: "
                    "'attribute_name'}})}"
                )
    extras = tuple(j for j in range(len(fparams)) if j not in used)
    for j in extras:
        if fdefaults[j] is _MISSING:
            raise SpecError(
                f"{where}: forward parameter {fnames[j]!r} is required but {op.name}"
                f"{op.signature.schema} has no parameter to take it; the op cannot stand in for "
                "this forward"
            )
    positional = sum(1 for p in fparams if p.kind != inspect.Parameter.KEYWORD_ONLY)
    return Binding(op, where, tuple(fnames), fdefaults, extras, tuple(sources), positional)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- replacing forwards
@dataclass
class _Record:
    binding: Binding
    had_instance_forward: bool
    previous: Any
    cls: type | None = None  # the module's class before grafting, where its class was swapped


_GRAFTED: "weakref.WeakKeyDictionary[torch.nn.Module, _Record]" = weakref.WeakKeyDictionary()


def is_grafted(module: torch.nn.Module) -> bool:
    """Grafted by kg.graft, or a copy of such a module (``copy.deepcopy`` keeps the grafted class)."""
    return module in _GRAFTED or _forward.is_grafted_class(type(module))


def make_forward(binding: Binding, original: Callable, training: bool) -> Callable:
    """The grafted forward: the op when it can serve, else the original (same arguments)."""
    op = binding.op
    overload = op.overload
    op_args = binding.op_args

    warned, said = [], []
    refused = _forward.refused_dtypes(op)

    def forward(self, *args, **kwargs):
        call = op_args(self, args, kwargs)
        if call is None:
            return original(self, *args, **kwargs)
        if not training and torch.is_grad_enabled():
            for a in call:
                if isinstance(a, torch.Tensor) and a.requires_grad:
                    # Inference graft of an op without (or not trusted with) a backward: the
                    # original keeps gradients right.
                    if not warned and not _is_compiling():
                        warned.append(True)
                        warnings.warn(
                            f"{binding.where}: gradients are enabled, so the original forward runs "
                            "(the graft has mode='inference'); call the model under torch.no_grad() "
                            "or torch.inference_mode(), or graft with mode='training' and an op "
                            "that has a backward", GraftWarning, stacklevel=3,
                        )
                    return original(self, *args, **kwargs)
        if _is_compiling():
            return overload(*call)
        for i, dtypes in refused:  # a dtype the op does not take: the original serves the call
            if isinstance(call[i], torch.Tensor) and call[i].dtype not in dtypes:
                if not said:  # never under compile: that returned above
                    said.append(True)
                    warnings.warn(
                        f"{binding.where}: {op.signature.params[i].name} is {call[i].dtype}, which "
                        f"{op.name} does not take ({sorted(str(d) for d in dtypes)}); the original "
                        "forward serves such calls", GraftWarning, stacklevel=3)
                return original(self, *args, **kwargs)
        return op(*call)

    forward.__kernelgraft_binding__ = binding  # type: ignore[attr-defined]
    forward.__wrapped__ = original  # type: ignore[attr-defined]
    return forward


def _matches(module: torch.nn.Module, key: Any) -> bool:
    cls = _forward.base_class(type(module))
    if isinstance(key, str):
        return cls.__name__ == key
    return cls is key


def graft_modules(
    model: torch.nn.Module,
    rules: Mapping[Any, Any],
    *,
    mode: str,
    report: Any,
) -> list[torch.nn.Module]:
    """Replace the forward of every module whose type is a key of ``rules``; returns those grafted."""
    from ..op.operator import KernelOp

    training = mode == "training"
    parsed = {}
    for key, value in rules.items():
        attrs = None
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
            value, attrs = value
        if not isinstance(value, KernelOp):
            raise SpecError(f"kg.graft: the value for {key!r} must be a kernelgraft op (or (op, "
                            f"{{param: attribute}})), got {describe(value)}")
        if not (isinstance(key, str) or isinstance(key, type) and issubclass(key, torch.nn.Module)):
            raise SpecError(f"kg.graft: keys must be nn.Module subclasses or class names, got {key!r}")
        parsed[key] = (value, attrs)
    bindings: dict[type, Binding] = {}
    classes: dict[type, type] = {}  # one grafted class per module class and call: guarded once
    grafted = []
    for name, module in model.named_modules():
        key = next((k for k in parsed if _matches(module, k)), None)
        if key is None:
            continue
        op, attrs = parsed[key]
        label = name or type(module).__name__
        if is_grafted(module):
            report._kept(label, "already grafted; kg.ungraft(model) first")
            continue
        cls = _forward.base_class(type(module))
        binding = bindings.get(cls)
        if binding is None:
            where = f"kg.graft: {cls.__name__}.forward -> {op.name}"
            binding = bindings[cls] = make_binding(op, cls.forward, module=module, attrs=attrs, where=where)
            log.info("%s binds as %s", where, binding.describe())
        if training and not has_backward(op):
            report._kept(label, f"mode='training' but {op.name} has no backward; give it one with "
                                f"{op.__name__}.register_autograd(...)")
            continue
        why = binding.check_module(module)
        if why is not None:
            report._kept(label, why)
            continue
        if not _swap_class(module, cls, binding, training, classes):
            had = "forward" in module.__dict__
            previous = module.__dict__.get("forward")
            original = cls.forward if not had else (lambda self, *a, _f=previous, **k: _f(*a, **k))
            module.forward = types.MethodType(make_forward(binding, original, training), module)
            _GRAFTED[module] = _Record(binding, had, previous)
        report._replaced(label, op.name)
        grafted.append(module)
    return grafted


def _swap_class(module: torch.nn.Module, cls: type, binding: Binding, training: bool,
                classes: dict[type, type]) -> bool:
    """Give ``module`` the grafted class of ``cls`` (made once per call); False where it keeps its
    class: an instance forward of its own would hide the class's, or the class refuses a subclass
    (a metaclass that needs arguments) or the swap (``__slots__`` the subclass cannot share)."""
    if "forward" in module.__dict__:
        return False
    why = _forward.refuses(cls)
    if why is not None:
        log.debug("kg.graft: %s keeps its class (%s); its forward is set on the instance", cls.__name__, why)
        return False
    try:
        sub = classes.get(cls)
        if sub is None:
            general = make_forward(binding, cls.forward, training)
            sub = classes[cls] = _forward.grafted_class(cls, binding, general, training,
                                                        binding.required_positional())
        module.__class__ = sub
    except Exception as exc:  # the instance forward serves as well, with more guards under compile
        log.debug("kg.graft: %s keeps its class (%s: %s); its forward is set on the instance",
                  cls.__name__, type(exc).__name__, exc)
        return False
    _GRAFTED[module] = _Record(binding, False, None, cls)
    return True


def original_forward(module: torch.nn.Module) -> Callable:
    """The forward the module had before grafting (bound)."""
    rec = _GRAFTED.get(module)
    if rec is None:
        if _forward.is_grafted_class(type(module)):  # a copy of a grafted module
            return types.MethodType(_forward.base_class(type(module)).forward, module)
        return module.forward
    if rec.had_instance_forward:
        return rec.previous
    return types.MethodType((rec.cls or type(module)).forward, module)


def ungraft_module(module: torch.nn.Module) -> bool:
    rec = _GRAFTED.pop(module, None)
    if rec is None:
        if _forward.is_grafted_class(type(module)):  # a copy of a grafted module (copy.deepcopy)
            module.__class__ = _forward.base_class(type(module))
            return True
        return False
    if rec.cls is not None:
        if not _forward.is_grafted_class(type(module)):
            # The class was swapped again since (FSDP2's fully_shard makes a subclass of the
            # module's class): putting rec.cls back would drop that wrapper's class.
            _GRAFTED[module] = rec
            warnings.warn(
                f"kg.ungraft: the {rec.cls.__name__} module's class is now {type(module).__qualname__}, "
                "set after it was grafted; it keeps its grafted forward. Ungraft before wrapping the "
                "module (fully_shard and the like), or graft after", GraftWarning, stacklevel=3)
            return False
        module.__class__ = rec.cls
    elif rec.had_instance_forward:
        module.forward = rec.previous
    else:
        module.__dict__.pop("forward", None)
    return True


def ungraft_modules(model: torch.nn.Module) -> int:
    return sum(ungraft_module(m) for m in list(model.modules()))


def warn_kept(label: str, why: str) -> None:
    warnings.warn(f"kg.graft: kept the original forward of {label}: {why}", GraftWarning, stacklevel=4)
