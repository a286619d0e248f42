"""RMSNorm: every candidate of the four backends (Triton, CUDA C++, cuTile, CuTe DSL) timed alone,
then the op tuned across all of them; the tuned op must be at least as fast as the best single
backend on every shape. GPU only; kernel times come from CUDA-graph replays (no host cost).

    KERNELGRAFT_CUTILE_CUBINS=.carry/cutile_cubins python benchmarks/bench_rmsnorm_backends.py

Prints per shape the best time of each backend and the tuned/best ratio last; JSON to $OUT.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import environment, write_json  # noqa: E402

# LLM-like rows x hidden sizes, large enough (>= ~5 us) that graph-replay timings are stable.
SHAPES = [(512, 4096), (2048, 2048), (4096, 4096), (16384, 1024), (8192, 8192), (32768, 2048)]
DTYPE = torch.bfloat16
EPS = 1e-6


def graph_time_us(fn, calls=20, replays=20, repeats=5) -> float:
    """Median per-call GPU time of ``fn`` from replays of a graph holding ``calls`` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / (replays * calls))
    times.sort()
    return times[len(times) // 2]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import kernelgraft as kg
    from kernelgraft.examples import rmsnorm as ex

    op = ex.rmsnorm
    results = []
    for rows, cols in SHAPES:
        entry: dict = {"shape": [rows, cols], "candidates": {}, "backends": {}}
        results.append(entry)
        try:
            x = torch.randn(rows, cols, device="cuda", dtype=DTYPE)
            w = torch.randn(cols, device="cuda", dtype=DTYPE)
            ref = op.reference(x, w, EPS)
            for cand in op.candidates(x, w, EPS):
                if cand.impl.backend == "torch":  # the reference itself: timed as the peers
                    continue
                if not cand.supported:
                    entry["candidates"][cand.label] = {"skipped": cand.reason}
                    continue
                try:
                    runner = op.dispatcher.runner(cand)
                    out = torch.full_like(x, float("nan"))
                    runner(x, w, EPS, out)
                    torch.cuda.synchronize()
                    # the same rule as `kernelgraft check`: relative error against float64
                    from kernelgraft.check._compare import compare, tolerance

                    ref64 = op.reference(x.double(), w.double(), EPS)
                    ok, err, why = compare(out, ref64, tolerance(out.dtype))
                    if not ok:
                        raise AssertionError(f"relative error {err} against the float64 reference {why}")
                    us = graph_time_us(lambda r=runner, o=out: r(x, w, EPS, o))
                    entry["candidates"][cand.label] = {"us": us, "max_err": err}
                    b = cand.impl.backend
                    entry["backends"][b] = min(entry["backends"].get(b, float("inf")), us)
                except Exception as exc:
                    traceback.print_exc()
                    entry["candidates"][cand.label] = {"error": f"{type(exc).__name__}: {exc}"}
            tune = kg.tune("on") if hasattr(kg, "tune") else contextlib.nullcontext()
            with tune:
                y = op(x, w, EPS)  # tunes this shape
                torch.cuda.synchronize()
                entry["tuned_max_err"] = (y.float() - ref.float()).abs().max().item()
                entry["tuned_us"] = graph_time_us(lambda: op(x, w, EPS))
                try:
                    plan = op.dispatcher.plan_for((x, w, EPS))
                    entry["tuned_choice"] = plan.candidate.label if plan and plan.candidate else "reference"
                except Exception as exc:
                    entry["tuned_choice"] = f"? ({type(exc).__name__}: {exc})"
        except Exception as exc:
            traceback.print_exc()
            entry["error"] = f"{type(exc).__name__}: {exc}"

    path = write_json("rmsnorm_backends", {"env": environment(), "dtype": str(DTYPE), "results": results},
                      args.out)
    names = ["triton", "cuda", "cutile", "cutedsl"]
    print(f"\nRMSNorm {DTYPE}, us per call from CUDA-graph replays (results in {path})")
    print(f"{'shape':>12s} " + " ".join(f"{n:>9s}" for n in names) + f" {'tuned':>9s} {'tuned/best':>10s}  choice")
    for e in results:
        b = e.get("backends", {})
        cells = " ".join(f"{b[n]:9.2f}" if n in b else f"{'-':>9s}" for n in names)
        best = min(b.values()) if b else None
        tuned = e.get("tuned_us")
        ratio = f"{tuned / best:10.3f}" if tuned and best else f"{'-':>10s}"
        shape = "x".join(map(str, e["shape"]))
        tuned_s = f"{tuned:9.2f}" if tuned else f"{'-':>9s}"
        print(f"{shape:>12s} {cells} {tuned_s} {ratio}  {e.get('tuned_choice', e.get('error', ''))[:60]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
