"""Why the tuner and the bench ranked softmax kernels differently at bf16[2048, 32768].

Until run 4 of `benchmarks/results/2026-11-30-h200-5/` the tuner's cold-L2 mode replayed a CUDA graph of back-to-back launches over
rotated input copies, while ``kernelgraft bench`` times one launch at a time after an L2 flush;
the tuner now times cold the way the bench does. Prints the tuner's ranking
(``kg.tune.decision``) for the vocab-wide shape next to per-launch and graph-replay timings of the
two fastest kernels. GPU only: ``python research/diag_softmax_choice.py``.
"""

import json

import torch
from triton.testing import do_bench, do_bench_cudagraph

import kernelgraft as kg
from kernelgraft.backends.cuda.jit import CudaRunner
from kernelgraft.examples import _softmax_cuda as C
from kernelgraft.examples.softmax import softmax


def main():
    x = torch.randn(2048, 32768, device="cuda", dtype=torch.bfloat16)
    with kg.tune("on", cold_l2=True):
        softmax(x)
        d = kg.tune.decision(softmax, x)
    ranking = [(e["impl_name"], e["config"], round(e.get("ms", 0) * 1e3, 2)) for e in (d.ranking if d else [])[:8]]
    out = torch.empty_like(x)
    timings = {}
    for spec in (C.CUDA_ROW_TMA, C.CUDA_ROW_REGS):
        for c in spec.configs:
            r = CudaRunner(spec, c)
            r(x, out)
            name = f"{spec.display_name} {c.label()}"
            timings[name] = {"per_launch_flushed_us": do_bench(lambda r=r: r(x, out), warmup=50, rep=300) * 1e3,
                             "graph_replay_us": do_bench_cudagraph(lambda r=r: r(x, out), rep=300) * 1e3}
            print(name, timings[name], flush=True)
    print("tuner ranking (impl, config, us):")
    for row in ranking:
        print("  ", row)
    print(json.dumps({"ranking": ranking, "timings": timings}))


if __name__ == "__main__":
    main()
