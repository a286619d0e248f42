"""Triton candidates ahead of time: record the one ``kernel[grid](...)`` call a launch function
makes, then compile it for a named arch with ``triton.compile(ASTSource(...), target=GPUTarget)``.

What the binary assumes, and the runner checks per call or the guards check per shape:
- every pointer is 16-byte aligned (``tt.divisibility`` 16, as Triton's JIT assumes for aligned
  tensors); a misaligned pointer falls back to the JIT or the reference;
- ints are never turned into constants (Triton's JIT specialises ``== 1``); an int whose sample
  value is a multiple of 16 is compiled as such and guarded by ``% 16 == 0``; i32 vs i64 follows the
  sample and is guarded by the range;
- the kernel's parameters are the non-constexpr arguments, then Triton's global and profile
  scratch pointers (null: kernels that need scratch memory are refused); ``num_warps * 32``
  threads per block and ``metadata.shared`` bytes of dynamic shared memory.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any

import torch

from .jit import bind_arguments, ptx_param_sizes
from ...driver.params import SIZES
from ...symbolic.expr import Unsupported
from ...symbolic.trace import Context

__all__ = ["record", "compile_call", "toolchain_version", "COMPILES"]

COMPILES = "the Triton kernel"  # what `kernelgraft check` says it compiled

_LOCK = threading.Lock()
_OPTION_KEYS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion"}
_TYPES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
    torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    torch.bool: "i1",
}


def toolchain_version() -> str:
    import triton

    return triton.__version__


@contextlib.contextmanager
def _recording():
    from triton.runtime.jit import KernelInterface

    calls: list[tuple] = []
    original = KernelInterface.__getitem__

    def getitem(kernel, grid):
        return lambda *args, **kwargs: calls.append((kernel, grid, args, kwargs))

    with _LOCK:
        KernelInterface.__getitem__ = getitem
        try:
            yield calls
        finally:
            KernelInterface.__getitem__ = original


def _jit(kernel) -> Any:
    from triton.runtime.jit import JITFunction

    if isinstance(kernel, JITFunction):
        return kernel
    fn = getattr(kernel, "fn", None)
    if type(kernel).__name__ == "InterpretedFunction" and fn is not None:
        # Under TRITON_INTERPRET=1 kernels are interpreter objects; the compiler wants the JIT kind.
        cached = getattr(kernel, "_kernelgraft_jit", None)
        if cached is None:
            cached = JITFunction(fn, **getattr(kernel, "kwargs", {}))
            kernel._kernelgraft_jit = cached
        return cached
    raise Unsupported(f"{type(kernel).__name__} launches (autotune/heuristics wrappers) are not AOT-able")


def record(ctx: Context, args: tuple, kwargs: dict, spec) -> dict:
    with _recording() as calls:
        spec.launch(*args, **kwargs)
    if len(calls) != 1:
        raise Unsupported(f"the launch function made {len(calls)} kernel launches; AOT needs exactly one")
    kernel, grid, kargs, kkwargs = calls[0]
    jit = _jit(kernel)
    names = jit.arg_names
    bound = bind_arguments(jit, kargs, kkwargs)
    options = {}
    for key, value in kkwargs.items():
        if key in names:
            continue
        elif key in _OPTION_KEYS:
            options[key] = ctx.hint(value)
        else:
            raise Unsupported(f"launch option {key}={value!r} is not supported by the AOT path")
    signature, constexprs, attrs, params, aligned, untied = {}, {}, {}, [], [], False
    guards: list[str] = []
    for i, p in enumerate(jit.params):
        if p.name not in bound:
            raise Unsupported(f"kernel argument {p.name} has no value")
        value = bound[p.name]
        if p.is_constexpr or value is None:
            if isinstance(value, torch.SymInt):
                value = int(value)  # the ShapeEnv records the guard that fixes this value
            elif isinstance(value, torch.SymBool):  # e.g. a layout test of the strides: guarded too
                value = bool(value)
            signature[p.name] = "constexpr"
            constexprs[p.name] = value
            continue
        if isinstance(value, torch.Tensor):
            if value.dtype not in _TYPES:
                raise Unsupported(f"tensor dtype {value.dtype}")
            signature[p.name] = "*" + _TYPES[value.dtype]
            source = ctx.tensor_source(value)
            params.append({"kind": "ptr", "source": source})
            aligned.append(source)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[p.name] = "i1"
            params.append({"kind": "i8", "expr": repr(value)})
        elif isinstance(value, (int, torch.SymInt)):
            text, hint = ctx.text(value), ctx.hint(value)
            wide = not -2**31 <= hint < 2**31
            signature[p.name] = "i64" if wide else "i32"
            params.append({"kind": "i64" if wide else "i32", "expr": text})
            if isinstance(value, torch.SymInt):
                guards.append(f"({text} >= {-2**31}) and ({text} < {2**31})" if not wide else
                              f"({text} >= {-2**63}) and ({text} < {2**63})")
                if hint % 16 == 0 and not p.do_not_specialize:
                    guards.append(f"(({text}) % 16 == 0)")
                    attrs[(i,)] = [["tt.divisibility", 16]]
            elif hint % 16 == 0 and hint != 0 and not p.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            text, tied = ctx.scalar(value)
            untied |= not tied
            signature[p.name] = "fp32"
            params.append({"kind": "f32", "expr": text})
        else:
            raise Unsupported(f"kernel argument {p.name} of type {type(value).__name__}")
    if callable(grid):
        grid = grid({**bound, **kkwargs})
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    if not 1 <= len(grid) <= 3:
        raise Unsupported(f"grid {grid!r}")
    return {
        "backend": "triton", "jit": jit, "signature": signature, "constexprs": constexprs,
        "attrs": attrs, "options": options, "grid": [ctx.text(g) for g in grid], "params": params,
        "aligned": aligned, "untied_float": untied, "guards": guards,
    }


def compile_call(call: dict, arch: str) -> tuple[dict, dict[str, bytes]]:
    """(kernel entry for the manifest, {suffix: image}) for one recorded call and arch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if os.environ.get("TRITON_INTERPRET") == "1":
        # Triton's standard library (tl.sum, ...) is then made of interpreter objects.
        raise Unsupported("Triton's interpreter is on (TRITON_INTERPRET=1) in this process, so its "
                          "kernels cannot be compiled; run `kernelgraft aot` (it turns the "
                          "interpreter off) or unset TRITON_INTERPRET")
    cc = int(arch.removeprefix("sm_").rstrip("a"))
    src = ASTSource(call["jit"], dict(call["signature"]), constexprs=dict(call["constexprs"]),
                    attrs=dict(call["attrs"]))
    compiled = triton.compile(src, target=GPUTarget("cuda", cc, 32), options=dict(call["options"]))
    md = compiled.metadata
    if getattr(md, "global_scratch_size", 0) or getattr(md, "launch_cooperative_grid", False) \
            or getattr(md, "launch_pdl", False) or getattr(md, "tensordesc_meta", None):
        raise Unsupported("kernels with global scratch, cooperative/PDL launches or TMA descriptors")
    if getattr(md, "num_ctas", 1) != 1:
        raise Unsupported("num_ctas > 1 (thread block clusters)")
    params = list(call["params"])
    ptx = compiled.asm["ptx"]
    # Triton's launcher appends scratch pointers after the arguments (3.9: global + profile; older
    # releases fewer): take their number from the kernel's own PTX parameter list.
    sizes = ptx_param_sizes(ptx, md.name)
    if sizes is None:
        raise Unsupported(f"kernel {md.name} not found in its PTX")
    extra = len(sizes) - len(params)
    roles = ["global_scratch", "profile_scratch"]
    if not 0 <= extra <= len(roles):
        raise Unsupported(f"kernel {md.name}: {extra} parameters beyond its arguments")
    params += [{"kind": "ptr", "null": True, "role": roles[i]} for i in range(extra)]
    # the kernel's own parameter list (from its PTX) must match what the runner will pack
    packed = [SIZES[p["kind"]] for p in params]
    if sizes != packed:
        raise Unsupported(f"kernel {md.name}: PTX parameter sizes {sizes} differ from the packed {packed}")
    entry = {
        "kernel": md.name,
        "block": [md.num_warps * md.warp_size if hasattr(md, "warp_size") else md.num_warps * 32, 1, 1],
        "shared_mem": str(int(md.shared)),
        "grid": list(call["grid"]) + ["1"] * (3 - len(call["grid"])),
        "params": params,
        "aligned": list(call["aligned"]),
        "triton": {
            "signature": call["signature"],
            "constexprs": {k: v for k, v in call["constexprs"].items()},
            "divisible_by_16": [list(call["signature"])[k[0]] for k in call["attrs"]],
            "options": call["options"], "num_warps": md.num_warps, "num_stages": md.num_stages,
            "hash": md.hash, "scratch": {"global": getattr(md, "global_scratch_size", 0),
                                         "profile": getattr(md, "profile_scratch_size", 0)},
        },
    }
    ptx_bytes = ptx.encode() if isinstance(ptx, str) else bytes(ptx)
    return entry, {"cubin": bytes(compiled.asm["cubin"]), "ptx": ptx_bytes}
