"""CuTe DSL (``kg.cutedsl``) candidates ahead of time: the launch function's ``(host_fn, args)`` on
fake tensors gives each runtime argument of the ``@cute.jit`` host function as a pointer source or
an expression of the sizes; ``cutlass.Constexpr`` arguments are compiled in (one that depends on a
size pins it with a guard). Each (host function, dtypes, constexpr values, arch) is compiled with
``cute.compile`` as the JIT path compiles it (tensors as 16-byte aligned ``cute.Pointer``: the
bundle checks alignment per call), exported and linked into one shared library
(``_cutedsl_so``) that the loaders call through ``kg_cutedsl_launch``.

The manifest entry looks like the other backends' (``params``, ``aligned``, guards, outputs), with
grid ``[1, 1, 1]``, block ``[1, 1, 1]`` and no shared memory: the host function computes and
issues its own launches. ``images``: ``so`` (the library) and ``runtime`` (the CUDA dialect
runtime it needs, shipped so that the bundle names every native file it loads)."""

from __future__ import annotations

import hashlib
import inspect
import json

import torch

from ...symbolic.expr import Unsupported
from ...symbolic.trace import Context

__all__ = ["record", "compile_call", "toolchain_version", "target_arch", "check_compile", "COMPILES"]

COMPILES = "the CuTe DSL host function"  # what `kernelgraft check` says it compiled

# cutlass numeric annotations -> the manifest's scalar kinds
_KINDS = {"Int8": "i8", "Int16": "i16", "Int32": "i32", "Int64": "i64", "Uint8": "u8", "Uint16": "u16",
          "Uint32": "u32", "Uint64": "u64", "Float32": "f32", "Float64": "f64", "Boolean": "u8"}


def toolchain_version() -> str:
    from .jit import CuteDSLBackend, _version
    from .so import runtime_library, toolchain

    why = CuteDSLBackend().available()
    if why:
        raise RuntimeError(why)
    runtime_library()
    return f"nvidia-cutlass-dsl {_version()}, {toolchain()}"


def target_arch(spec, arch: str) -> str:
    """The ``cute.compile`` target for a bundle arch: the spec's own, else ``sm_90a`` for
    ``sm_90`` (Hopper's WGMMA/TMA need the ``a`` target, as the JIT path compiles)."""
    if spec.arch:
        return spec.arch
    digits = arch.removeprefix("sm_").rstrip("a")
    return f"sm_{digits}a" if int(digits) >= 90 else f"sm_{digits}"


def check_compile(spec, config, tensors, arch: str) -> None:
    """What ``kernelgraft check`` compiles of a candidate it cannot run: ``cute.compile`` alone
    (linking the bundle's library adds nothing to check), for the target JIT and bundles compile
    for (``sm_90a`` for ``sm_90``); ``compile_for`` keeps its own cache."""
    from .jit import compile_for

    compile_for(spec, config, tensors, target_arch(spec, arch))


def _annotations(host_fn) -> list[str]:
    from .jit import _params

    fn = inspect.unwrap(getattr(host_fn, "func", host_fn))
    names, _ = _params(host_fn)
    sig = inspect.signature(fn)
    out = []
    for name in names:
        ann = sig.parameters[name].annotation
        out.append(getattr(ann, "__name__", str(ann)).rsplit(".", 1)[-1])
    return out


def record(ctx: Context, args: tuple, kwargs: dict, spec) -> dict:
    from .jit import _dtype_map, _params, _unpack

    where = f"kg.cutedsl({spec.display_name})"
    host_fn, hargs = _unpack(spec.launch(*args, **kwargs), where)
    names, constants = _params(host_fn)
    if len(hargs) + 1 != len(names):
        raise Unsupported(f"{getattr(host_fn, '__name__', host_fn)} takes {len(names)} parameters (the last "
                          f"the stream), the launch gave {len(hargs)} arguments")
    labels = _annotations(host_fn)
    params, described, untied = [], [], False
    for i, (a, const, label) in enumerate(zip(hargs, constants, labels)):
        if isinstance(a, torch.Tensor):
            if a.dtype not in _dtype_map():
                raise Unsupported(f"argument {names[i]} of dtype {a.dtype}")
            params.append({"kind": "ptr", "source": ctx.tensor_source(a)})
            described.append(["ptr", str(a.dtype).removeprefix("torch.")])
        elif const:
            # compiled in: a value of the sizes is specialised (the ShapeEnv records the guard)
            value = int(a) if isinstance(a, torch.SymInt) else bool(a) if isinstance(a, torch.SymBool) else a
            if not isinstance(value, (int, float, bool, str, type(None))):
                raise Unsupported(f"cutlass.Constexpr argument {names[i]} of type {type(value).__name__}")
            described.append(["const", value])
        elif label in _KINDS:
            kind = _KINDS[label]
            if kind[0] == "f":
                text, tied = ctx.scalar(a)
                untied |= not tied
            else:
                text = ctx.text(a)
            params.append({"kind": kind, "expr": text})
            described.append([kind])
        else:
            raise Unsupported(f"host parameter {names[i]} annotated {label}: bundles pass cute.Pointer, "
                              "cutlass numeric scalars and cutlass.Constexpr")
    return {
        "backend": "cutedsl", "spec": spec, "jit": host_fn, "config": kwargs,
        "impl": spec.fingerprint, "host_fn": f"{getattr(host_fn, '__module__', '')}.{getattr(host_fn, '__qualname__', host_fn)}",
        "args": described, "params": params,
        "aligned": sorted({p["source"] for p in params if "source" in p}),
        "untied_float": untied, "guards": [],
    }


def _compile_args(call: dict, host_fn) -> list:
    """Stand-ins for ``cute.compile``: what it reads of them is the types, the constexpr values and
    the pointers' alignment (16 bytes, as the bundle checks per call)."""
    import cutlass.cute as cute
    from cuda.bindings import driver as cu

    from .jit import _dtype_map

    dtypes = {str(k).removeprefix("torch."): v for k, v in _dtype_map().items()}
    out = []
    for desc in call["args"]:
        if desc[0] == "ptr":
            out.append(cute.runtime.make_ptr(dtypes[desc[1]], 1 << 20, cute.AddressSpace.gmem, assumed_align=16))
        elif desc[0] == "const":
            out.append(desc[1])
        elif desc[0][0] == "f":
            out.append(1.0)
        else:
            out.append(1)
    out.append(cu.CUstream(0))
    return out


def compile_call(call: dict, arch: str) -> tuple[dict, dict[str, bytes]]:
    import cutlass.cute as cute

    from ...errors import CompileError
    from .so import ABI, ENTRY, build_library, export_object, runtime_library

    spec, host_fn = call["spec"], call["jit"]
    target = target_arch(spec, arch)
    options = f"--gpu-arch {target} --opt-level {spec.opt_level}"
    if spec.ptxas_options:
        options += f" --ptxas-options '{spec.ptxas_options}'"
    identity = {k: v for k, v in call.items() if k not in ("spec", "jit")}
    digest = hashlib.sha256(json.dumps([target, options, identity], sort_keys=True, default=str).encode()).hexdigest()
    prefix = f"kg_{digest[:20]}"
    # kept alive until the export: the compiled function refers to its arguments weakly
    stand_ins = _compile_args(call, host_fn)
    try:
        compiled = cute.compile(host_fn, *stand_ins, options=options)
    except Exception as exc:
        raise CompileError(f"cute.compile of {call['host_fn']} for {target} failed: {type(exc).__name__}: {exc}") from exc
    header, obj = export_object(compiled, prefix)
    kinds = [p["kind"] for p in call["params"]]
    library = build_library(header, obj, prefix, kinds)
    del stand_ins
    entry = {
        "kernel": prefix, "entry": ENTRY,
        "grid": ["1", "1", "1"], "block": [1, 1, 1], "shared_mem": "0",
        "params": call["params"], "aligned": list(call["aligned"]),
        "cutedsl": {"abi": ABI, "host_fn": call["host_fn"], "function": compiled.function_name,
                    "target": target, "options": options, "kinds": kinds},
    }
    return entry, {"so": library, "runtime": runtime_library().read_bytes()}
