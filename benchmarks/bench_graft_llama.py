"""Forward time of a small Llama (Hugging Face transformers, random weights) before and after
grafting kernelgraft ops: RMSNorm by module type (kgexamples::rmsnorm), the SwiGLU gate by pattern
(kgexamples::swiglu), in eager and under torch.compile (Inductor). Eager grafted runs twice: with
the ops' native replay, and on their Python path (KERNELGRAFT_NATIVE=0 for new plans). Last, under
torch.compile, each residual add and the norm of its sum grafted by pattern as one
kgexamples::rmsnorm_residual, with the SwiGLU pattern.

In eager only the module graft applies (a pattern graft acts inside torch.compile). Each section
runs in its own try/except, reports and continues. Prints a ratio table last; writes JSON to
--out (default $OUT/bench_graft_llama.json). Runtime about 2-3 minutes on an H200 (two or, with
--cudagraphs, four Inductor compiles).

    python benchmarks/bench_graft_llama.py [--hidden 2048 --layers 4 --batch 4 --seq 1024] [--cudagraphs]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import add_llama_arguments, build_llama  # noqa: E402


def _time(fn, warmup: int, iters: int) -> float:
    """Median milliseconds per call, CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_llama_arguments(parser)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--cudagraphs", action="store_true", help="also time mode='reduce-overhead'")
    parser.add_argument("--eager-only", action="store_true",
                        help="skip torch.compile (a decode-sized run: --batch 1 --seq 1 --eager-only)")
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "bench_graft_llama.json"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 1
    t_start = time.time()

    import transformers
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    import kernelgraft as kg
    from kernelgraft import _native
    from kernelgraft.examples.rmsnorm import rmsnorm
    from kernelgraft.examples.rmsnorm_residual import add_rmsnorm_pattern, rmsnorm_residual

    # Build (or load) the native replay before timing: it otherwise builds in the background.
    print(f"native replay: {'ready' if _native.load() is not None else _native.reason()}", flush=True)
    from kernelgraft.examples.swiglu import swiglu, swiglu_pattern

    result: dict = {
        "config": vars(args),
        "versions": {
            "torch": torch.__version__, "transformers": transformers.__version__,
            "triton": getattr(sys.modules.get("triton"), "__version__", None),
            "python": platform.python_version(), "gpu": torch.cuda.get_device_name(),
        },
        "times_ms": {}, "errors": {}, "max_abs_diff_vs_eager": {}, "notes": [],
    }
    times, errors, diffs = result["times_ms"], result["errors"], result["max_abs_diff_vs_eager"]

    model, ids = build_llama(args)

    def run(m):
        with torch.no_grad():
            return m(ids, use_cache=False).logits

    expected = run(model)

    def section(name, fn):
        print(f"[{time.time() - t_start:6.1f}s] {name} ...", flush=True)
        try:
            fn()
        except Exception as exc:  # report and continue with the next section
            errors[name] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()

    def measure(name, m):
        out = run(m)
        diffs[name] = float((out.float() - expected.float()).abs().max())
        times[name] = _time(lambda: run(m), warmup=3, iters=args.iters)
        print(f"    {name}: {times[name]:.3f} ms (max |logits - eager| {diffs[name]:.3g})", flush=True)

    section("eager", lambda: measure("eager", model))

    def compiled(name, mode=None):
        torch._dynamo.reset()
        m = torch.compile(model, fullgraph=True, mode=mode)
        t0 = time.time()
        run(m)
        result.setdefault("compile_s", {})[name] = round(time.time() - t0, 1)
        measure(name, m)

    if not args.eager_only:
        section("compile", lambda: compiled("compile"))
    if args.cudagraphs and not args.eager_only:
        section("compile_cudagraphs", lambda: compiled("compile_cudagraphs", "reduce-overhead"))

    reports = {}

    def do_graft():
        inputs = ((ids,), {"use_cache": False})
        for key, rules, kw in (("module", {LlamaRMSNorm: rmsnorm}, {}),
                               ("pattern", None, {"pattern": swiglu_pattern, "replacement": swiglu})):
            call = (model, rules) if rules is not None else (model,)
            try:
                reports[key] = kg.graft(*call, example_inputs=inputs, **kw)
            except kg.VerificationError as exc:  # keep timing; the numbers say how far off
                result["notes"].append(f"{key} graft failed verification, grafted unverified: {exc}")
                print(f"    {result['notes'][-1]}", flush=True)
                reports[key] = kg.graft(*call, verify=False, **kw)
        result["graft"] = {k: {"count": r.count, "verified": r.verified, "kept": r.kept}
                           for k, r in reports.items()}
        print(f"    module graft: {reports['module']}; pattern graft: {reports['pattern']}", flush=True)

    section("graft", do_graft)
    section("eager_grafted", lambda: measure("eager_grafted", model))

    def python_path():
        # The same grafted model with the native replay off (new plans are not recorded): what
        # the ops' eager calls cost on kernelgraft's Python path.
        before = os.environ.get("KERNELGRAFT_NATIVE")
        os.environ["KERNELGRAFT_NATIVE"] = "0"
        try:
            rmsnorm.dispatcher.reset()
            measure("eager_grafted_python_path", model)
        finally:
            if before is None:
                del os.environ["KERNELGRAFT_NATIVE"]
            else:
                os.environ["KERNELGRAFT_NATIVE"] = before
            rmsnorm.dispatcher.reset()

    section("eager_grafted_python_path", python_path)
    if not args.eager_only:
        section("compile_grafted", lambda: compiled("compile_grafted"))
    if "pattern" in reports:
        result["pattern_matches_compiled"] = reports["pattern"].compiled

    def fused():
        # Under torch.compile an opaque RMSNorm keeps Inductor from fusing the residual add into
        # it; graft the add and the norm together (one rmsnorm_residual per add) instead.
        kg.ungraft(model)
        inputs = ((ids,), {"use_cache": False})
        fused_reports = {
            "add_rmsnorm": kg.graft(model, pattern=add_rmsnorm_pattern, replacement=rmsnorm_residual,
                                    example_inputs=inputs),
            "swiglu": kg.graft(model, pattern=swiglu_pattern, replacement=swiglu, example_inputs=inputs),
        }
        result["graft_fused"] = {k: {"count": r.count, "verified": r.verified} for k, r in fused_reports.items()}
        print("    fused graft: " + ", ".join(f"{k} {r.count} site(s), verified={r.verified}"
                                          for k, r in fused_reports.items()), flush=True)
        compiled("compile_grafted_fused")

    if not args.eager_only:
        section("compile_grafted_fused", fused)
    if args.cudagraphs and not args.eager_only:
        section("compile_cudagraphs_grafted", lambda: compiled("compile_cudagraphs_grafted", "reduce-overhead"))
    try:
        kg.ungraft(model)
    except Exception as exc:
        errors["ungraft"] = repr(exc)

    result["total_s"] = round(time.time() - t_start, 1)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2, default=str)

    def ratio(a, b):
        return f"{times[a] / times[b]:.3f}" if a in times and b in times else "n/a"

    rows = [
        ("eager grafted / eager", ratio("eager_grafted", "eager")),
        ("eager grafted, Python path / eager", ratio("eager_grafted_python_path", "eager")),
        ("compile grafted / compile", ratio("compile_grafted", "compile")),
        ("compile, add+norm fused graft / compile", ratio("compile_grafted_fused", "compile")),
        ("compile / eager", ratio("compile", "eager")),
        ("compile grafted / eager", ratio("compile_grafted", "eager")),
    ]
    if args.cudagraphs:
        rows.append(("cudagraphs grafted / cudagraphs", ratio("compile_cudagraphs_grafted", "compile_cudagraphs")))
    print(f"\nLlama {args.layers}x{args.hidden} bf16, {args.batch}x{args.seq} tokens, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}; times: "
          + ", ".join(f"{k} {v:.3f} ms" for k, v in times.items()))
    if errors:
        print("errors: " + "; ".join(f"{k}: {v[:200]}" for k, v in errors.items()))
    print(f"{'ratio (lower = grafted faster)':<34} value")
    for name, value in rows:
        print(f"{name:<34} {value}")
    return 0 if not errors else 2


if __name__ == "__main__":
    sys.exit(main())
