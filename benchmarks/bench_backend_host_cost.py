"""Host cost per eager call of a tiny op in each backend (kernelgraft op, its runner alone) and of
the naive CuTe DSL call (three ``from_dlpack`` tensors per call). GPU only.

    KERNELGRAFT_CUTILE_CUBINS=.carry/cutile_cubins python benchmarks/bench_backend_host_cost.py

Two controls run no kernelgraft code per call: the bare ``cuLaunchKernel`` of the CUDA C++ kernel
and the CuTe DSL program's packed C entry point called with its values packed once (what the
native replay calls for a CuTe DSL plan), both through ctypes. The script also runs against a tree
from before the package restructure (PYTHONPATH to its src; the imports fall back to the older
module names), so an A/B of two trees can time both with this one script.

Prints a table of microseconds per call and ratios to torch.add; JSON goes to $OUT (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import traceback

# The native replay's host cost is what this measures: PyTorch competing in tuning could
# make the reference serve a tiny op, which runs on the Python path. KERNELGRAFT_COMPETE=1 overrides.
os.environ.setdefault("KERNELGRAFT_COMPETE", "0")
# The plans are made again (and tuned) in the first timed round; a compile pool would start one
# worker process per core there, each importing torch, Triton and CuTe DSL while the rounds run.
# Trees without a pool ignore the variable. KERNELGRAFT_COMPILE_WORKERS=N overrides.
os.environ.setdefault("KERNELGRAFT_COMPILE_WORKERS", "0")

import torch  # noqa: E402

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import environment, write_json  # noqa: E402


def per_call_us(fn, n=3000, repeats=5) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()  # host time only: launches are queued, the GPU lags behind
        torch.cuda.synchronize()
        best = min(best, (t1 - t0) / n * 1e6)
    return best


def naive_cutedsl(x, y, out):
    import cutlass
    import cutlass.cute as cute
    from cuda.bindings import driver as cu
    from cutlass.cute.runtime import from_dlpack

    from kernelgraft.examples._cute_kernels import _cute_add_relu_kernel

    @cute.jit
    def host(mx: cute.Tensor, my: cute.Tensor, mo: cute.Tensor, n: cutlass.Int32, stream: cu.CUstream):
        _cute_add_relu_kernel(mx, my, mo, n, 256).launch(
            grid=((n + 255) // 256, 1, 1), block=(256, 1, 1), stream=stream)

    def conv(t):
        return from_dlpack(t, assumed_align=16).mark_layout_dynamic()

    stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
    compiled = cute.compile(host, conv(x), conv(y), conv(out), x.numel(), stream)

    def call():
        compiled(conv(x), conv(y), conv(out), x.numel(), cu.CUstream(torch.cuda.current_stream().cuda_stream))

    call()
    torch.cuda.synchronize()
    ref = torch.relu(x + y)
    assert torch.allclose(out, ref), "naive CuTe DSL result differs from torch"
    return call


def cutedsl_packed_call(spec, config, x, y, out):
    """The compiled CuTe DSL host function's packed C entry point with its argument slots filled
    once (the library's executor, as kernelgraft's CuTe DSL runner reaches it): the per-call work
    of a CuTe DSL launch below kernelgraft, through ctypes."""
    import ctypes

    try:
        from kernelgraft.backends.cutedsl import jit as cutedsl
    except ImportError:  # a tree before the restructure
        from kernelgraft.backends import _cutedsl as cutedsl  # type: ignore[no-redef]

    dev = x.device.index or 0
    arch = cutedsl.default_arch(torch.cuda.get_device_capability(dev))
    compiled, _, _ = cutedsl.compile_for(spec, config, (x, y, out), arch)
    kinds = [t for _, t in cutedsl.slot_kinds(compiled)]
    executor = compiled.to(dev)
    result = executor.cuda_result
    ctx = executor.exec_context
    tail = ([ctypes.addressof(result)] if result is not None else []) + (
        list(ctx.kernel_functions_ptrs) if ctx is not None else [])
    values = [x.data_ptr(), y.data_ptr(), out.data_ptr(), x.numel(), torch.cuda.current_stream(dev).cuda_stream]
    if len(kinds) != len(values):
        raise RuntimeError(f"the host function takes {len(kinds)} runtime arguments, expected {len(values)}")
    slots = [k(v) for k, v in zip(kinds, values)]
    addrs = [ctypes.addressof(s) for s in slots] + tail
    packed = (ctypes.c_void_p * len(addrs))(*addrs)
    capi = executor.jit_module.capi_func

    def call():
        capi(packed)

    call.keep = (executor, slots, packed)  # type: ignore[attr-defined]
    return call


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--n", type=int, default=1024)
    args = parser.parse_args()
    import kernelgraft as kg
    from kernelgraft.examples import add_relu as ex

    x = torch.randn(args.n, device="cuda")
    y = torch.randn(args.n, device="cuda")
    ref = torch.relu(x + y)
    rows: dict[str, dict] = {}

    profiles: list[str] = []
    paths: dict = {}

    def profile(name, fn, n=3000):
        """Where the host time of one path goes (cProfile, top functions by own time)."""
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(8)
        profiles.append(f"==== {name}\n{text.getvalue()}")

    def record(name, fn, check=None):
        try:
            if check is not None:
                got = check()
                torch.cuda.synchronize()
                if not torch.allclose(got, ref):
                    raise AssertionError(f"{name}: result differs from torch")
            for _ in range(50):
                fn()
            torch.cuda.synchronize()
            paths[name] = fn
            rows[name] = {}
        except Exception as exc:
            traceback.print_exc()
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"}

    record("torch.add", lambda: torch.add(x, y))
    record("torch relu(x+y)", lambda: torch.relu(x + y))
    try:
        from kernelgraft import native as _native

        _native.load  # noqa: B018 - a tree before the restructure has kernelgraft._native instead
    except (ImportError, AttributeError):
        from kernelgraft import _native  # type: ignore[no-redef]

    native = _native.load()  # the native replay, built (or loaded from the cache) before timing
    print(f"native replay: {'ready' if native is not None else _native.reason()}")
    ops: dict[str, object] = {}
    with (kg.tune("off") if hasattr(kg, "tune") else contextlib.nullcontext()):
        for spec in ex.IMPLS:
            op = kg.op(f"kgbench_host::add_relu_{spec.backend}", impls=[spec], fallback="error")(
                ex.add_relu.reference)
            record(f"op {spec.backend}", lambda op=op: op(x, y), check=lambda op=op: op(x, y))
            ops[f"op {spec.backend}"] = op

            py_op = kg.op(f"kgbench_host::add_relu_{spec.backend}_py", impls=[spec], fallback="error")(
                ex.add_relu.reference)

            def python_path(op=py_op):
                # A twin op without the native replay: a plan whose signature has a replay
                # replays every call of that signature, so each call first takes the replay off
                # the op and its plans (a few dict stores, timed with the path).
                op.dispatcher.drop_replays()
                return op(x, y)

            record(f"op {spec.backend} (python path)", python_path, check=python_path)
            ops[f"op {spec.backend} (python path)"] = py_op
            try:
                cand = next(c for c in op.candidates(x, y) if c.supported)
                runner = op.dispatcher.runner(cand)
                out = torch.empty_like(x)
                record(f"runner {spec.backend}", lambda r=runner, o=out: r(x, y, o),
                       check=lambda r=runner, o=out: (r(x, y, o), o)[1])
            except Exception as exc:
                rows[f"runner {spec.backend}"] = {"error": f"{type(exc).__name__}: {exc}"}
    # Where a CUDA C++ launch's host time goes: the driver launcher with its values packed
    # already, the bare ctypes cuLaunchKernel, and the stream lookup alone.
    try:
        try:
            from kernelgraft.driver import cu as _cu
            from kernelgraft.driver.module import current_stream
            from kernelgraft.driver.params import value_of
        except ImportError:  # a tree before the restructure
            from kernelgraft.driver import _cu  # type: ignore[no-redef]
            from kernelgraft.driver._module import current_stream  # type: ignore[no-redef]
            from kernelgraft.driver._params import value_of  # type: ignore[no-redef]

        spec = next(s for s in ex.IMPLS if s.backend == "cuda")
        op = kg.op("kgbench_host::add_relu_cuda_parts", impls=[spec], fallback="error")(ex.add_relu.reference)
        cand = next(c for c in op.candidates(x, y) if c.supported)
        runner = op.dispatcher.runner(cand)
        out = torch.empty_like(x)
        runner(x, y, out)
        (launcher,) = getattr(runner, "__wrapped__", runner)._launchers.values()
        launch = spec.launch(x, y, out, **cand.config.as_dict())
        values = [value_of(a) for a in launch.args]
        dev = x.device.index or 0
        record("cuda launcher, values packed",
               lambda v=values, g=launch.grid, b=launch.block: launcher(dev, g, b, v))
        fn = launcher.function
        raw, handle = _cu.raw_launch(), fn._raw_handle(dev, fn.handle(dev))
        params = launcher.buffer.address(values)
        stream = current_stream(dev)
        g = launch.grid if isinstance(launch.grid, int) else launch.grid[0]
        b = launch.block if isinstance(launch.block, int) else launch.block[0]
        record("ctypes cuLaunchKernel alone",
               lambda g=g, b=b, p=params: raw(handle, g, 1, 1, b, 1, 1, 0, stream or None, p, None))
        record("current_stream lookup", lambda: current_stream(dev))
    except Exception as exc:
        traceback.print_exc()
        rows["cuda launcher, values packed"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        spec = next(s for s in ex.IMPLS if s.backend == "cutedsl")
        op = kg.op("kgbench_host::add_relu_cutedsl_parts", impls=[spec], fallback="error")(ex.add_relu.reference)
        cand = next(c for c in op.candidates(x, y) if c.supported)
        out = torch.empty_like(x)
        call = cutedsl_packed_call(spec, cand.config, x, y, out)
        record("cutedsl packed call alone", call, check=lambda: (call(), out)[1])
    except Exception as exc:
        traceback.print_exc()
        rows["cutedsl packed call alone"] = {"error": f"{type(exc).__name__}: {exc}"}
    try:
        out = torch.empty_like(x)
        call = naive_cutedsl(x, y, out)
        record("naive cutedsl from_dlpack", call)
    except Exception as exc:
        traceback.print_exc()
        rows["naive cutedsl from_dlpack"] = {"error": f"{type(exc).__name__}: {exc}"}

    # Interleaved rounds, median per path: drift and queue effects hit every path alike.
    import statistics

    samples: dict = {name: [] for name in paths}
    for _ in range(15):
        for name, fn in paths.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(1000):
                fn()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            samples[name].append((t1 - t0) / 1000 * 1e6)
    for name, times in samples.items():
        rows[name] = {"us": statistics.median(times), "min_us": min(times)}
    # Whether each op's native replay was in place when timed (timing ran outside kg.tune("off"):
    # a new selection epoch, so the plans were made, and recorded, again there).
    for name, op in ops.items():
        if "us" in rows.get(name, {}):
            rows[name]["native_replay"] = op.dispatcher.current_replay() is not None
    for name, fn in paths.items():
        profile(name, fn)
    base = rows.get("torch.add", {}).get("us")
    if args.out:
        with open(os.path.join(args.out, "backend_host_cost_profiles.txt"), "w") as f:
            f.write("\n".join(profiles))
    payload = {"env": environment(), "n": args.n, "rows": rows,
               "native": native is not None, "native_reason": _native.reason()}
    path = write_json("backend_host_cost", payload, args.out)
    print(f"\nhost cost per call, {args.n} fp32 elements (results in {path})")
    print(f"{'path':34s} {'us/call':>9s} {'x torch.add':>12s}")
    for name, r in rows.items():
        if "us" in r:
            ratio = f"{r['us'] / base:.2f}" if base else "-"
            mark = "  (native replay)" if r.get("native_replay") else ""
            print(f"{name:34s} {r['us']:9.2f} {ratio:>12s}{mark}")
        else:
            print(f"{name:34s} {'ERROR':>9s}  {r['error'][:80]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
