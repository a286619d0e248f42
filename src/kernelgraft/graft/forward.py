"""The class a module grafted by type takes on: a subclass of its own class, named as it, whose
``forward`` is straight-line code generated for the graft's binding.

Why a class and not a forward set on the instance: under ``torch.compile`` Dynamo goes straight to
the ``forward`` of a module's class, guarded by the module's type and by ``forward`` not being in
the instance's ``__dict__``. An instance forward makes it trace ``nn.Module.__call__`` instead and
guard the forward's function, code and every closure cell it reads, per grafted module, and
guards run on every call of the compiled model, before its first kernel: a Llama of 4 layers with
9 grafted norms had 227 more lines of guards and paid about 20 us more per forward on the CPU,
nearly all of it in the guard check (``research/diag_graft_host.py``).

Why generated code: the binding (which forward argument or attribute feeds which op parameter)
then sits in the code as constants, which need no guard. What the code reads from its globals (the
op, the general forward) is guarded once per compiled frame, however many modules share the class.
Calls the straight line does not cover (keyword arguments, another number of positional ones)
take the general forward, which handles every case. In eager the straight line also skips the
general forward's mapping of arguments (a grafted norm's call took about 3 us less on the CPU).
"""

from __future__ import annotations

import itertools
import abc
import copy
import copyreg
import keyword
import linecache
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["BASE_ATTR", "base_class", "is_grafted_class", "refuses", "grafted_class"]

# The class attribute that marks a grafted class and names the class it stands in for.
BASE_ATTR = "__kernelgraft_base__"
_numbers = itertools.count(1)  # tells generated forwards apart in tracebacks


def base_class(cls: type) -> type:
    """The module class a grafted class stands in for (``cls`` itself when not grafted)."""
    return cls.__dict__.get(BASE_ATTR, cls)


def is_grafted_class(cls: type) -> bool:
    return BASE_ATTR in cls.__dict__


def refuses(cls: type) -> str | None:
    """Why making a subclass of ``cls`` could change more than the module (then the graft sets the
    forward on the instance instead), else None: a class ``__init_subclass__`` (it may register every
    subclass by name, and the grafted class would stay registered after kg.ungraft) or a metaclass
    other than ``type``/``ABCMeta`` (its ``__new__`` and ``__init__`` run too)."""
    if type(cls) not in (type, abc.ABCMeta):
        return f"its metaclass {type(cls).__qualname__} runs on a subclass"
    hook = next((c for c in cls.__mro__ if c is not object and "__init_subclass__" in c.__dict__), None)
    if hook is not None:
        return f"{hook.__qualname__}.__init_subclass__ runs on a subclass"
    return None


def _reduce_ex(self: Any, protocol: int) -> Any:
    """Pickled (``torch.save``) as the class it stands in for: a saved model loads, ungrafted,
    where kernelgraft is not installed."""
    grafted = type(self)
    func, args, *rest = object.__reduce_ex__(self, protocol)
    if func is copyreg.__newobj__:  # pickle wants the object's own class there: rebuild it as copyreg does below protocol 2
        return (copyreg._reconstructor, (base_class(grafted), object, None), *rest)
    return (func, tuple(base_class(grafted) if a is grafted else a for a in args), *rest)


def _deepcopy(self: Any, memo: dict) -> Any:
    """``copy.deepcopy`` as for any module (its reduction), keeping the grafted class: a copy runs
    as the original does, and ``kg.ungraft`` on it gives its class back."""
    return copy._reconstruct(self, memo, *object.__reduce_ex__(self, 4))


def grafted_class(cls: type, binding: Any, general: Callable, training: bool, required: int | None) -> type:
    """A subclass of ``cls`` named as it whose ``forward`` calls ``binding.op``; ``general`` is the
    forward for any call, ``required`` the number of positional arguments the straight line takes
    (None: every call takes ``general``)."""
    forward = _generate(cls, binding, general, training, required)
    forward.__kernelgraft_binding__ = binding  # type: ignore[attr-defined]
    forward.__wrapped__ = cls.forward  # type: ignore[attr-defined]  # inspect.signature shows the original's
    namespace = {"forward": forward, BASE_ATTR: cls, "__module__": cls.__module__,
                 "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
                 "__reduce_ex__": _reduce_ex, "__deepcopy__": _deepcopy}
    return type(cls)(cls.__name__, (cls,), namespace)


def refused_dtypes(op: Any) -> list[tuple[int, frozenset]]:
    """(parameter index, the dtypes it takes) for each tensor parameter of ``op`` that declares
    its dtypes: a grafted forward hands a call with another dtype to the original forward."""
    out = []
    for i, p in enumerate(op.signature.params):
        allowed = op._dtypes.get(p.name)
        if allowed and p.kind == "tensor":
            out.append((i, frozenset(allowed)))
    return out


def _generate(cls: type, binding: Any, general: Callable, training: bool, required: int | None) -> Callable:
    op = binding.op
    # No __name__: Dynamo then guards these globals as one dict of their own (by its id), once per
    # compiled frame, instead of looking for a module of that name.
    scope: dict[str, Any] = {"_general": general, "_op": op, "_overload": op.overload,
                             "_is_compiling": torch.compiler.is_compiling,
                             "_grad_enabled": torch.is_grad_enabled, "_Tensor": torch.Tensor}
    lines = ["def forward(self, *args, **kwargs):"]
    if required is None:
        lines.append("    return _general(self, *args, **kwargs)")
    else:
        lines += [f"    if kwargs or len(args) != {required}:",
                  "        return _general(self, *args, **kwargs)"]
        # Op parameters in order, as the general forward reads them (the same reads, same order).
        for i, (kind, src) in enumerate(binding.sources):
            if kind == "arg":
                if src < required:
                    lines.append(f"    v{i} = args[{src}]")
                else:  # a trailing forward parameter the call leaves at its default
                    scope[f"_d{i}"] = binding.forward_defaults[src]
                    lines.append(f"    v{i} = _d{i}")
                # the original takes any layout; kernels may need a dense one (no-op if dense)
                lines += [f"    if isinstance(v{i}, _Tensor):", f"        v{i} = v{i}.contiguous()"]
            elif kind == "attr" and isinstance(src, str):
                # read at every call, so a later module.eps = ... or .to(dtype) is seen
                plain = src.isidentifier() and not keyword.iskeyword(src)
                lines.append(f"    v{i} = self.{src}" if plain else f"    v{i} = getattr(self, {src!r})")
            elif kind == "attr":
                scope[f"_s{i}"] = src
                lines.append(f"    v{i} = _s{i}(self)")
            else:
                scope[f"_c{i}"] = src
                lines.append(f"    v{i} = _c{i}")
        lines.append("    call = (" + "".join(f"v{i}, " for i in range(len(binding.sources))) + ")")
        if not training:
            # An inference graft: a call that needs gradients takes the general forward, which
            # runs the original (and says why, once).
            lines += ["    if _grad_enabled():",
                      "        for v in call:",
                      "            if isinstance(v, _Tensor) and v.requires_grad:",
                      "                return _general(self, *args, **kwargs)"]
        lines += ["    if _is_compiling():",
                  "        return _overload(*call)"]
        # Eager only (Dynamo never reads past the return above, so no guards): a tensor in a
        # dtype the op does not take (a model moved to float64 after grafting) runs the original.
        for i, dtypes in refused_dtypes(binding.op):
            scope[f"_t{i}"] = dtypes
            lines += [f"    if isinstance(v{i}, _Tensor) and v{i}.dtype not in _t{i}:",
                      "        return _general(self, *args, **kwargs)"]
        lines.append("    return _op(*call)")
    source = "\n".join(lines) + "\n"
    filename = f"<kernelgraft graft {next(_numbers)}: {cls.__qualname__}.forward -> {op.name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # tracebacks show it
    exec(compile(source, filename, "exec"), scope)
    forward = scope["forward"]
    forward.__qualname__ = f"{cls.__qualname__}.forward"
    forward.__module__ = __name__
    return forward
