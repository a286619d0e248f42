"""cuTile (``kg.cutile``) candidates ahead of time: the launch function's ``(grid, kernel, args)``
on fake tensors gives the grid and every kernel parameter as expressions; the kernel is exported
for each arch with ``cuda.tile.compilation.export_kernel`` (tileiras, no GPU needed).

The launch follows ``backends/_cutile.py``'s calling convention (``cutile_python_v2``): parameters
in declaration order, ``ct.Constant`` ones compiled in; an n-dim array is a pointer, n sizes and n
strides (int32, or int64 for 2**31 elements or more); an int is an int32, a float a float32;
block (1, 1, 1) (the CTA size is the cubin's own) and no dynamic shared memory. What the exported
signature assumes is guarded (int32 indices: fewer than 2**31 elements; a unit last stride) or
checked per call (16-byte aligned pointers), and the symbol is the one the JIT path computes, so
``KERNELGRAFT_CUTILE_CUBINS`` and bundles hold the same cubins."""

from __future__ import annotations

import torch

from ...symbolic.expr import Unsupported
from ...symbolic.trace import Context

__all__ = ["record", "compile_call", "toolchain_version", "check_compile", "COMPILES"]

COMPILES = "the cuTile kernel"  # what `kernelgraft check` says it compiled

_INT32 = 2**31


def toolchain_version() -> str:
    from importlib.metadata import version

    from .jit import toolchain_reason

    reason = toolchain_reason()
    if reason:
        raise RuntimeError(reason)
    return version("cuda-tile")


def check_compile(spec, config, tensors, arch: str) -> None:
    """What ``kernelgraft check`` compiles of a candidate it cannot run: the cubin of the sample's
    own signature (bundles hold cuTile too; this is the one the JIT runner would look up)."""
    from .jit import build_cubin, toolchain_reason

    reason = toolchain_reason()
    if reason:
        raise Unsupported(f"cuTile cannot compile here: {reason}")
    build_cubin(spec, config, tensors, arch)


def _grid(ctx: Context, grid) -> list[str]:
    dims = list(grid) if isinstance(grid, (tuple, list)) else [grid]
    if not 1 <= len(dims) <= 3:
        raise Unsupported(f"grid {grid!r}")
    return [ctx.text(d) for d in dims] + ["1"] * (3 - len(dims))


def _int32(text: str) -> str:
    return f"(({text}) >= -2147483648) and (({text}) < 2147483648)"


def record(ctx: Context, args: tuple, kwargs: dict, spec) -> dict:
    from .jit import _constant_params, _unpack, kernel_key

    where = f"kg.cutile({spec.display_name})"
    result = spec.launch(*args, **kwargs)
    grid = result[0] if isinstance(result, tuple) and len(result) == 3 else None
    if isinstance(grid, torch.SymInt):  # _unpack takes an int grid, not a symbolic one
        result = ((grid,), *result[1:])
    grid, kernel, kargs = _unpack(result, where)
    constants = _constant_params(kernel)
    if len(kargs) != len(constants):
        raise Unsupported(f"the kernel takes {len(constants)} arguments, the launch gave {len(kargs)}")
    params: list[dict] = []
    described: list[list] = []
    guards: list[str] = []
    untied = False
    for i, (a, const) in enumerate(zip(kargs, constants)):
        if const:
            if isinstance(a, torch.SymInt):  # a tile size from the shapes: compiled in, so static
                raise Unsupported(f"ct.Constant argument {i} depends on input shapes")
            if not isinstance(a, (int, float, bool)):
                raise Unsupported(f"ct.Constant argument {i} of type {type(a).__name__}")
            described.append(["const", a])
        elif isinstance(a, torch.Tensor):
            # the elements a view spans: its numel when contiguous, more for a strided view
            extent = 1 + sum((n - 1) * s for n, s in zip(a.shape, a.stride()))
            wide = (ctx.hint(a.numel()) >= _INT32 or ctx.hint(extent) >= _INT32
                    or any(ctx.hint(s) >= _INT32 for s in a.stride()))
            index = "i64" if wide else "i32"
            params.append({"kind": "ptr", "source": ctx.tensor_source(a)})
            params += [{"kind": index, "expr": ctx.text(s)} for s in (*a.shape, *a.stride())]
            if not wide:  # strides of a view of a contiguous tensor are at most its numel
                guards.append(f"({ctx.text(a.numel())}) < {_INT32}")
                if any(isinstance(s, torch.SymInt) for s in a.stride()):  # the caller's strides
                    guards += [f"({ctx.text(s)}) < {_INT32}" for s in a.stride()]
                    guards.append(f"({ctx.text(extent)}) < {_INT32}")
            unit_last = a.dim() > 0 and ctx.hint(a.stride()[-1]) == 1
            if unit_last and isinstance(a.stride()[-1], torch.SymInt):
                guards.append(f"({ctx.text(a.stride()[-1])}) == 1")
            described.append(["array", str(a.dtype).removeprefix("torch."), a.dim(), wide, unit_last])
        elif isinstance(a, bool):
            raise Unsupported(f"argument {i} is a bool (cuTile takes it as a ct.Constant)")
        elif isinstance(a, (int, torch.SymInt)):
            text = ctx.text(a)
            params.append({"kind": "i32", "expr": text})
            guards.append(_int32(text))
            described.append(["int"])
        elif isinstance(a, float):
            text, tied = ctx.scalar(a)
            untied |= not tied
            params.append({"kind": "f32", "expr": text})
            described.append(["float"])
        else:
            raise Unsupported(f"kernel argument {i} of type {type(a).__name__}")
    return {
        "backend": "cutile", "spec": spec, "jit": kernel, "config": kwargs, "kernel_hash": kernel_key(kernel),
        "args": described, "grid": _grid(ctx, grid), "block": [1, 1, 1], "shared_mem": "0", "params": params,
        # fake tensors look 16-byte aligned: the cubin is exported for aligned bases, and a
        # misaligned pointer is refused per call (the bundle's "aligned" check)
        "aligned": sorted({p["source"] for p in params if "source" in p}),
        "untied_float": untied, "guards": guards,
    }


def compile_call(call: dict, arch: str) -> tuple[dict, dict[str, bytes]]:
    from .jit import export_cubin, signature_of

    where = f"kg.cutile({call['spec'].display_name})"
    described = [tuple(d) if d[0] != "array" else ("array", getattr(torch, d[1]), d[2], d[3], d[4], True)
                 for d in call["args"]]
    sig = signature_of(call["jit"], described, where)
    image = export_cubin(call["jit"], sig, arch, where)
    entry = {
        "kernel": sig.symbol,
        "block": call["block"],
        "shared_mem": call["shared_mem"],
        "grid": call["grid"],
        "params": call["params"],
        "aligned": list(call["aligned"]),
        "cutile": {"kernel_hash": call["kernel_hash"], "symbol": sig.symbol, "args": call["args"]},
    }
    return entry, {"cubin": image}
