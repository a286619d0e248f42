"""Why do copies of one compiled one-token Llama decode read a few percent apart, run after run
(`benchmarks/results/2026-12-02-h200-5/`, run 1: the original and its first copy 1.02x the other six copies, every round;
grafted copies 1.01-1.04x)? Builds plain copies before and after the grafts (with and without
Inductor's FX graph cache) and grafted copies, then per variant: the paired ratio of its calls
taken in turn (GPU events), its host time per call, and a CPU profile of its forward (which
region the extra time sits in, and which compiled graph serves it).

    python research/diag_decode_copies.py

Result (H200, `benchmarks/results/2026-12-02-h200-5/`, run 2): P0-P3 and F1 read 0.967-1.000x of P2, each the same in all
5 rounds; G1-G3 0.986-1.000x; host time in turn gives the same ratios. P4, P5 and F2 were compiled
while the grafted copies' SwiGLU pattern was active, so Inductor rewrote them: they are not plain.
The profile ran variant after variant, not in turn, so its columns carry the host's drift."""

import copy
import os
import re
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "benchmarks"))
import bench_graft_llama as B  # noqa: E402
from _common import add_llama_arguments, build_llama  # noqa: E402
import argparse  # noqa: E402

import kernelgraft as kg  # noqa: E402
from kernelgraft.examples.rmsnorm import rmsnorm  # noqa: E402
from kernelgraft.examples.swiglu import swiglu, swiglu_pattern  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402
import torch._inductor.config as inductor_config  # noqa: E402

p = argparse.ArgumentParser()
add_llama_arguments(p)
args = p.parse_args(["--batch", "1", "--seq", "1"])
model, ids = build_llama(args)
inputs = ((ids,), {"use_cache": False})
torch._dynamo.config.cache_size_limit = 64
variants = {}


def run(m):
    with torch.no_grad():
        return m(ids, use_cache=False)


def compiled(name, m, fresh=False):
    t = time.time()
    c = torch.compile(B._own_code(m, name), fullgraph=True)
    if fresh:
        with inductor_config.patch(fx_graph_cache=False):
            run(c)
    else:
        run(c)
    variants[name] = c
    print(f"{name}: compiled in {time.time() - t:.1f} s, {B.guard_count(c)} guard lines", flush=True)


compiled("P0", model)
for k in range(1, 4):
    compiled(f"P{k}", copy.deepcopy(model))
compiled("F1", copy.deepcopy(model), fresh=True)  # a plain copy Inductor compiles again, no cache
for k in range(1, 4):
    g = copy.deepcopy(model)
    kg.graft(g, {LlamaRMSNorm: rmsnorm}, example_inputs=inputs)
    kg.graft(g, pattern=swiglu_pattern, replacement=swiglu, example_inputs=inputs)
    compiled(f"G{k}", g)
for k in range(4, 6):  # plain copies compiled after the grafts (their pass is installed)
    compiled(f"P{k}", copy.deepcopy(model))
compiled("F2", copy.deepcopy(model), fresh=True)

fns = {n: (lambda c=c: run(c)) for n, c in variants.items()}
medians, per_round, per_call = B.interleaved(fns, rounds=5, iters=100)
print("\npaired ratio to P2 (GPU events, calls in turn), and per round:")
for n in fns:
    rounds = [B.paired_ratio({"a": per_call[n][r * 100:(r + 1) * 100], "b": per_call["P2"][r * 100:(r + 1) * 100]},
                             "a", "b") for r in range(5)]
    print(f"  {n}: {B.paired_ratio(per_call, n, 'P2'):.3f}  ({' '.join(f'{x:.3f}' for x in rounds)})  "
          f"median {medians[n]:.3f} ms", flush=True)


class Host:  # the interleaved clock on the host: perf_counter, no events
    stamp = staticmethod(time.perf_counter)
    elapsed = staticmethod(lambda a, b: (b - a) * 1e3)
    sync = staticmethod(torch.cuda.synchronize)


hmed, _, hcall = B.interleaved(fns, rounds=3, iters=100, clock=Host())
print("\nhost time per call (perf_counter, calls in turn), paired ratio to P2:")
for n in fns:
    print(f"  {n}: {hmed[n]:.3f} ms, {B.paired_ratio(hcall, n, 'P2'):.3f}", flush=True)

from torch.profiler import ProfilerActivity, profile  # noqa: E402

CALLS = 30
table = {}
graphs = {}
for n, fn in fns.items():
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        key = e.key
        m = re.search(r"CompiledFxGraph (\w+)", key)
        if m:
            graphs.setdefault(n, set()).add(m.group(1))
            key = key.replace(m.group(1), "<graph>")
        key = re.sub(r"forward_\w+", "forward_<v>", key)
        key = re.sub(r"\b\d+/\d+\b", "<frame>", key)
        rows[key] = rows.get(key, 0.0) + e.cpu_time_total / CALLS
    table[n] = rows
print("\ncompiled graphs serving each variant:", {n: sorted(g) for n, g in graphs.items()})
keys = sorted({k for rows in table.values() for k, _ in sorted(rows.items(), key=lambda kv: -kv[1])[:25]},
              key=lambda k: -table["P2"].get(k, 0.0))
names = list(table)
print("\nCPU us per forward (profiler, total incl. children):")
print(f"{'event':<60}" + "".join(f"{n:>8}" for n in names))
for k in keys:
    print(f"{k[:60]:<60}" + "".join(f"{table[n].get(k, 0.0):8.1f}" for n in names))
