"""An op rebuilt from a bundle's manifest when its Python module cannot be imported (no Triton,
no source): the schema from the recorded parameters, a meta function from the recorded output
shapes, and one ``bundle`` impl per bundled candidate. Its reference cannot run (the bundle holds
no code), so inputs that no bundled kernel covers raise ``UnsupportedError``."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import BundleError, UnsupportedError
from ..spec import Config, ImplSpec
from .bundle_spec import parse_schema
from ..symbolic.expr import compile_exprs
from .program import shape_guards
from .runner import BundledRunner, _dtype

__all__ = ["BundledImpl", "make_op", "RUNNERS"]

RUNNERS: dict[tuple[str, Config], BundledRunner] = {}
_HINTS = {"tensor": torch.Tensor, "tensor_list": list[torch.Tensor], "int": int, "float": float,
          "bool": bool, "str": str, "dtype": torch.dtype}


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class BundledImpl(ImplSpec):
    """A candidate that exists only as binaries in a bundle."""

    backend = "bundle"

    bundle_key: str = ""
    origin: str = ""  # the backend it was compiled from
    index: int = -1   # the impl's position in the original op

    def code_identity(self) -> str:
        return self.bundle_key


class BundleBackend:
    name = "bundle"

    def available(self) -> str | None:
        return None if _has_bindings() else "bundled kernels need cuda-bindings (pip install 'kernelgraft[cuda]')"

    def device_reason(self, device: torch.device) -> str | None:
        return None if device.type == "cuda" else f"bundled kernels run on CUDA tensors, got {device.type}"

    def bind(self, spec: ImplSpec, config: Config) -> BundledRunner:
        try:
            return RUNNERS[(spec.bundle_key, config)]  # type: ignore[attr-defined]
        except KeyError:
            raise UnsupportedError(f"{spec!r}: config {config.as_dict()} is not in the bundle") from None


def _has_bindings() -> bool:
    import importlib.util

    return importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.bindings") is not None


# Registered by kernelgraft.wiring: serves the candidates of ops rebuilt from a manifest.
BACKEND = BundleBackend()


def _covers(*args: Any, _key: str = "", **config: Any) -> bool | str:
    runner = RUNNERS.get((_key, Config.of(config, where="bundle")))
    if runner is None:
        return "config not in the bundle"
    return runner.covers(args) or True


def _reference(entry: dict):
    """A stub whose signature gives exactly the manifest's schema (the bundle spec held the params
    to it): ``Optional`` where the schema writes ``?``, dtype defaults by name."""
    where = f"bundle op {entry.get('name')!r}"
    written = parse_schema(entry["schema"])
    if isinstance(written, str) or len(written[0]) != len(entry["params"]):
        raise BundleError(f"{where}: schema {str(entry['schema'])[:120]!r} is not the op's parameters")
    params = []
    for p, s in zip(entry["params"], written[0]):
        kind, name = p.get("kind"), p.get("name")
        if kind not in _HINTS or not isinstance(name, str) or not name.isidentifier():
            raise BundleError(f"{where}: parameter {name!r} of kind {kind!r} is not allowed")
        hint = _HINTS[kind]
        if s.optional:
            hint = typing.Optional[hint]
        default = inspect.Parameter.empty if p.get("required") else p.get("default")
        if kind == "dtype" and isinstance(default, str):
            default = _dtype(default)
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default,
                                        annotation=hint))
    returns = {"none": None, "tensor": torch.Tensor}.get(entry["returns"])
    if entry["returns"] == "tuple":
        returns = tuple[(torch.Tensor,) * int(entry["n_returns"])]
    name = entry["name"]

    def reference(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedError(
            f"{name}: loaded from a bundle without its Python code, and no bundled kernel covers "
            "these inputs (device, dtypes, shapes); import the op's module to get its reference")

    reference.kernelgraft_stub = True  # no real reference: the bundled kernels' guards decide
    reference.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    reference.__annotations__ = {p.name: p.annotation for p in params} | {"return": returns}
    reference.__name__ = reference.__qualname__ = name.split("::")[1]
    reference.__module__ = "kernelgraft.aot.bundled"
    reference.__doc__ = entry.get("doc") or None
    return reference


def _meta(entry: dict, names: Sequence[str], n_inputs: int):
    rules = []
    for cand in entry["candidates"]:
        for k in cand["kernels"]:
            outs = k["outputs"]
            # guards on strides left out: output shapes depend on sizes only, whatever the layout
            rule = (tuple(sorted(k["dtypes"].items())), tuple(sorted(k["ranks"].items())),
                    tuple(shape_guards(k["guards"])), tuple(map(tuple, outs["shapes"])), tuple(outs["dtypes"]),
                    tuple(sorted(k.get("pinned", {}).items())))
            if rule not in rules:
                rules.append(rule)
    index = {n: i for i, n in enumerate(names)}
    compiled = []
    for dtypes, ranks, guards, shapes, out_dtypes, pinned in rules:
        # each guard on its own, as the runner evaluates them: a text joined to another with " and "
        # would bind a top-level `or` of one to its neighbour
        guard = compile_exprs(names[:n_inputs], list(guards) or ["True"])
        sizes = [compile_exprs(names[:n_inputs], list(s)) for s in shapes]
        compiled.append(([(index[n], _dtype(d)) for n, d in dtypes], [(index[n], r) for n, r in ranks],
                         guard, sizes, [_dtype(d) for d in out_dtypes], [(index[n], str(v)) for n, v in pinned]))

    def meta(*args: Any) -> Any:
        for dtypes, ranks, guard, sizes, out_dtypes, pinned in compiled:
            if (all(args[i].dtype == d for i, d in dtypes) and all(args[i].dim() == r for i, r in ranks)
                    and all(args[i] == v for i, v in pinned)):
                try:
                    ok = all(guard(*args))
                except Exception:
                    ok = False
                if ok:
                    device = args[dtypes[0][0]].device if dtypes else None
                    outs = [torch.empty(f(*args), dtype=d, device=device) for f, d in zip(sizes, out_dtypes)]
                    if entry["returns"] == "none":
                        return None
                    return outs[0] if entry["returns"] == "tensor" else tuple(outs)
        raise UnsupportedError(f"{entry['name']}: loaded from a bundle, which records no output shapes "
                               "for these inputs (dtypes, ranks or sizes outside every signature)")

    return meta


def make_op(entry: dict, runners: dict, bundle_id: str):
    """Register a KernelOp for a manifest op entry whose module is not importable."""
    from ..op.api import op as kg_op

    impls = []
    by_impl: dict[int, list] = {}
    for (index, config), runner_and_cand in runners.items():
        by_impl.setdefault(index, []).append((config, runner_and_cand))
    for index in sorted(by_impl):
        items = by_impl[index]
        cand = items[0][1][1]
        key = f"{bundle_id}:{entry['name']}:{index}:{cand['impl_fingerprint']}"
        for config, (runner, _) in items:
            RUNNERS[(key, config)] = runner
        impls.append(BundledImpl(
            launch=None, configs=tuple(c for c, _ in items), name=cand["impl"],
            supports=_bound_covers(key), bundle_key=key, origin=cand["backend"], index=index,
            contiguous=_declared(cand)))
    reference = _reference(entry)
    op = kg_op(entry["name"], impls=impls, mutates_args=tuple(entry.get("mutates_args", ())))(reference)
    names = [p["name"] for p in entry["params"]]
    # the recorded shape formulas read only sizes: plan calls without fake tensors
    op.register_meta(_meta(entry, names, len(names)), shape_only=True)
    return op


def _declared(cand: dict) -> bool | tuple[str, ...]:
    """The candidate's layout declaration as recorded (eager dispatch refuses a call by it, with
    the same words as for the op it was built from)."""
    value = cand.get("contiguous", True)
    if isinstance(value, bool):
        return value
    if isinstance(value, list) and all(isinstance(n, str) for n in value):
        return tuple(value)
    raise BundleError(f"bundle candidate {cand.get('label')!r}: 'contiguous' is {value!r}, not true, false "
                      "or a list of argument names")


def _bound_covers(key: str):
    def covers(*args: Any, **config: Any) -> bool | str:
        return _covers(*args, _key=key, **config)

    covers.__qualname__ = f"covers[{key[-12:]}]"
    return covers
