"""Why does the grafted one-token Llama decode cost ~90 us more per kernelgraft op under
torch.compile than the plain compiled model (2026-12-01-h200-5, run 4: 2.996 vs 1.827 ms for 13
op calls), when prefill pays ~9 us per op and CUDA graphs ~17? Profiles the host side of the
compiled grafted decode (cProfile over 50 forwards) and prints each op's plans."""

import cProfile
import os
import pstats
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from _common import add_llama_arguments, build_llama  # noqa: E402
import argparse  # noqa: E402

import kernelgraft as kg  # noqa: E402
from kernelgraft.examples.rmsnorm import rmsnorm  # noqa: E402
from kernelgraft.examples.swiglu import swiglu, swiglu_pattern  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402

p = argparse.ArgumentParser()
add_llama_arguments(p)
args = p.parse_args(["--batch", "1", "--seq", "1"])
model, ids = build_llama(args)
inputs = ((ids,), {"use_cache": False})
with torch.no_grad():
    kg.graft(model, {LlamaRMSNorm: rmsnorm}, example_inputs=inputs)
    kg.graft(model, pattern=swiglu_pattern, replacement=swiglu, example_inputs=inputs)
    c = torch.compile(model, fullgraph=True)
    for _ in range(5):
        c(ids, use_cache=False)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(50):
        c(ids, use_cache=False)
    torch.cuda.synchronize()
    print(f"compiled grafted decode: {(time.perf_counter() - t) / 50 * 1e3:.3f} ms per forward", flush=True)
    for op in (rmsnorm, swiglu):
        for key, plan in op.dispatcher.plans().items():
            print(op.name, key, plan, flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        c(ids, use_cache=False)
    torch.cuda.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)
