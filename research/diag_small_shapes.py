"""Why does the llm suite time tiny shapes of tuned ops (rmsnorm 1x4096, rmsnorm_residual 1x4096,
add_relu 4096, swiglu 1x14336) well above their kernels? (the quick suite of `benchmarks/results/2026-12-01-h200-2/`: 5.6-27 us by
graph replay against 1.9 us measured for the rmsnorm kernel in `benchmarks/results/2026-12-01-h200-1/`.) Profiles one replay of a graph of 10
op calls and lists the GPU kernels it ran, per op, with the plan and the tuner's decision."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import kernelgraft as kg
from kernelgraft.examples import add_relu, rmsnorm, rmsnorm_residual, swiglu


def cases():
    bf = dict(device="cuda", dtype=torch.bfloat16)
    yield rmsnorm.rmsnorm, (torch.randn(1, 4096, **bf), torch.randn(4096, **bf), 1e-6)
    yield rmsnorm_residual.rmsnorm_residual, (torch.randn(1, 4096, **bf), torch.randn(1, 4096, **bf),
                                              torch.randn(4096, **bf), 1e-6)
    yield add_relu.add_relu, (torch.randn(4096, **bf), torch.randn(4096, **bf))
    yield swiglu.swiglu, (torch.randn(1, 14336, **bf), torch.randn(1, 14336, **bf))


def main() -> None:
    for op, args in cases():
        for _ in range(3):
            op(*args)
        torch.cuda.synchronize()
        decision = kg.tune.decision(op, *args)
        plan = op.dispatcher.plan_for(args)
        print(f"== {op.name}: plan {getattr(getattr(plan, 'candidate', None), 'label', plan)}")
        if decision is not None:
            for r in decision.ranking[:4]:
                print(f"   ranked {r.get('impl_name')} {r.get('config')} {r.get('ms', 0) * 1e3:.2f} us")
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            op(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(10):
                op(*args)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        end.synchronize()
        print(f"   graph replay: {start.elapsed_time(end) * 1e3 / 200:.2f} us per call")
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        print(f"   {len(kernels)} GPU events in one replay of 10 calls:")
        seen: dict[str, list[float]] = {}
        for e in kernels:
            seen.setdefault(e.name[:90], []).append(e.device_time)
        for name, times in seen.items():
            print(f"     {len(times):3d} x {sum(times) / len(times):8.2f} us  {name}")


if __name__ == "__main__":
    main()
