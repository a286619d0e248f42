"""CUDA C++ (``kg.cuda``) candidates ahead of time: the launch function's ``kg.Launch`` on fake
tensors gives grid, block, shared memory and arguments as expressions; the (config, template)
variant is compiled by the NVRTC path for each arch."""

from __future__ import annotations

import torch

from .spec import Launch
from ...driver.params import Scalar, kind_of
from ...symbolic.expr import Unsupported
from ...symbolic.trace import Context

__all__ = ["record", "compile_call", "toolchain_version", "COMPILES"]

COMPILES = "the NVRTC kernel"  # what `kernelgraft check` says it compiled


def toolchain_version() -> str:
    from .nvrtc import nvrtc_version

    return nvrtc_version()


def _dims(ctx: Context, value) -> list[str]:
    dims = list(value) if isinstance(value, (tuple, list)) else [value]
    if not 1 <= len(dims) <= 3:
        raise Unsupported(f"grid/block {value!r}")
    return [ctx.text(d) for d in dims] + ["1"] * (3 - len(dims))


def record(ctx: Context, args: tuple, kwargs: dict, spec) -> dict:
    launch = spec.launch(*args, **kwargs)
    if type(launch) is not Launch:
        raise Unsupported(f"the launch function returned {type(launch).__name__}, not kg.Launch")
    params, untied = [], False
    for i, a in enumerate(launch.args):
        kind = kind_of(a, i)
        if isinstance(a, torch.Tensor):
            params.append({"kind": "ptr", "source": ctx.tensor_source(a)})
        elif a is None:
            params.append({"kind": "ptr", "null": True})
        elif isinstance(a, Scalar) and kind != "ptr":
            if kind in ("f16", "f32", "f64"):
                text, tied = ctx.scalar(a.value)
                untied |= not tied
            else:
                text = ctx.text(a.value)
            params.append({"kind": kind, "expr": text})
        else:
            raise Unsupported(f"kernel argument {i} of type {type(a).__name__}")
    template = dict(launch.template or {})
    for k, v in template.items():
        if not isinstance(v, (str, int, bool)):
            raise Unsupported(f"template value {k}={v!r}")
    return {
        "backend": "cuda", "spec": spec, "config": kwargs, "template": template,
        "grid": _dims(ctx, launch.grid), "block": [ctx.hint(b) for b in _block(launch.block)],
        "shared_mem": ctx.text(launch.shared_mem), "params": params,
        # supports() and the launch ran on fake tensors, which look 16-byte aligned: the bundle
        # knows only that case, so a misaligned pointer falls back (JIT or reference) at run time
        "aligned": sorted({p["source"] for p in params if "source" in p}),
        "untied_float": untied, "guards": [],
    }


def _block(value):
    dims = list(value) if isinstance(value, (tuple, list)) else [value]
    for d in dims:
        if isinstance(d, torch.SymInt):
            raise Unsupported("a block size that depends on input shapes")
    return [int(d) for d in dims] + [1] * (3 - len(dims))


def compile_call(call: dict, arch: str) -> tuple[dict, dict[str, bytes]]:
    from ...spec import Config
    from .jit import CudaRunner

    runner = CudaRunner(call["spec"], Config.of(call["config"], where="kernelgraft aot"))
    compiled = runner.compile(arch, call["template"] or None, kind="cubin")
    entry = {
        "kernel": compiled.symbol,
        "block": call["block"],
        "shared_mem": call["shared_mem"],
        "grid": call["grid"],
        "params": call["params"],
        "aligned": list(call["aligned"]),
        "cuda": {"template": call["template"],
                 "expression": call["spec"].expression(runner.config, call["template"] or None)},
    }
    return entry, {"cubin": compiled.image}
