"""Why does bench_llm_suite time the tuned op at one-row shapes far above its kernel? (`benchmarks/results/2026-12-01-h200-3/`,
run 5: rmsnorm 1 x 4096 19.7 us per call by graph replay in the suite, 1.68 us in
diag_small_shapes.py a minute before; softmax 32 x 4096 9.6 us; add_relu 4096 5.1 us.)

Replays the suite's sequence for each shape (eager reference, torch.compile(dynamic=True) of it,
then the op under kg.tune("on") timed by kernelgraft.bench.measure with the suite's settings), then
profiles replays of a graph captured the way the bench captures it (capture_calls, 20 calls) and
lists the GPU kernels one call runs, with their times. Each timing prints its calls per graph:
the hypothesis tested in `benchmarks/results/2026-12-01-h200-4/` is that the suite's graphs held one or two calls (an eager estimate
inflated by the first calls' host work), adding the graph launch's latency to every call; the
bench and tuner timers now correct the count by a timed replay (_timing._capture.replay_graph)."""

from __future__ import annotations

import collections

import torch
from torch.profiler import ProfilerActivity, profile

import kernelgraft as kg
from kernelgraft.timing.capture import capture_calls
from kernelgraft.bench import measure
from kernelgraft.examples import add_relu, rmsnorm, softmax


def cases():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    yield rmsnorm.rmsnorm, (torch.randn(1, 4096, **bf), torch.randn(4096, **bf), 1e-6)
    yield softmax.softmax, (torch.randn(32, 4096, **bf),)
    yield add_relu.add_relu, (torch.randn(4096, **bf), torch.randn(4096, **bf))


def timed(label: str, fn) -> None:
    t = measure(fn, graph=True, warmup_ms=30.0, rep_ms=40.0)
    print(f"   {label:28s} {t.median_us:8.2f} us (p20 {t.p20_us:.2f}, p80 {t.p80_us:.2f}, {t.reps} reps, {t.method}, {getattr(t, 'calls', '?')} calls per graph)")


def kernels_of(fn, calls: int = 20) -> None:
    graph = torch.cuda.CUDAGraph()
    failed = capture_calls(graph, lambda _: fn(), calls)
    if failed:
        print(f"   capture failed: {failed}")
        return
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            graph.replay()
        torch.cuda.synchronize()
    per = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    print(f"   GPU events per op call ({calls} calls per graph, 5 replays):")
    for name, times in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        print(f"      {len(times) / (5 * calls):6.2f} x {sum(times) / len(times):8.2f} us  {name[:110]}")


def main() -> None:
    for op, args in cases():
        print(f"== {op.name} {[tuple(a.shape) for a in args if isinstance(a, torch.Tensor)]}")
        compiled = torch.compile(op.reference, dynamic=True)
        timed("eager reference", lambda: op.reference(*args))
        timed("torch.compile(dynamic)", lambda: compiled(*args))
        with kg.tune("on"):
            timed("tuned op (suite's timer)", lambda: op(*args))
            plan = op.dispatcher.plan_for(args)
            print(f"   plan: {getattr(getattr(plan, 'candidate', None), 'label', plan)}; "
                  f"replay: {op.dispatcher.current_replay() is not None}")
            kernels_of(lambda: op(*args))
        with kg.tune("off"):
            timed("default candidate, tune off", lambda: op(*args))
        with kg.tune("on", compete=False):
            timed("tuned op, compete off", lambda: op(*args))


if __name__ == "__main__":
    main()
