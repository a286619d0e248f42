"""Timings of every config of the FP8 K-cache scatter's Triton and CUDA kernels at prefill sizes
(``fp8_kcache_scatter._bench_case``), on the GPU: per call after an L2 flush (the bench's default
``cold`` timing) and by CUDA-graph replay (the LLM suite's, which gave 13.96 us at 131072 tokens
before this round). First, every config against the reference, byte for byte, on the example's
sample inputs and on a large case with NaN, Inf, an all-zero row, a padding slot and an
out-of-range slot. Run: ``PYTHONPATH=src python3 research/explore_fp8_scatter_time.py``.
"""
import torch

from kernelgraft.backends.cuda.jit import CudaRunner
from kernelgraft.bench.timing import measure
from kernelgraft.examples import fp8_kcache_scatter as F

SIZES = (131072, 524288, 32768)


_CUDA = {f"cuda {c.label()}": CudaRunner(F.CUDA, c) for c in F.CUDA.configs}  # each compiles once


def candidates(k, cache, slots, qbs, fmt):
    """{label: fn()} for every config of both kernels on these arguments."""
    runs = {f"triton {c.label()}": (lambda c=c: F.launch_fp8_kcache_scatter(k, cache, slots, qbs, fmt, **c.as_dict()))
            for c in F.TRITON.configs}
    runs.update({name: (lambda r=r: r(k, cache, slots, qbs, fmt)) for name, r in _CUDA.items()})
    return runs


def mismatches(k, cache, slots, qbs, fmt, want, tag):
    """Every config run on a copy of ``cache``: the labels whose bytes differ from ``want``."""
    bad = []
    for name in candidates(k, cache, slots, qbs, fmt):
        got = cache.clone()
        candidates(k, got, slots, qbs, fmt)[name]()
        if not torch.equal(got, want):
            bad.append(f"{name} {tag}")
    return bad


def check():
    op, n, bad = F.fp8_kcache_scatter, 0, []
    cases = list(F.sample_inputs("cuda"))
    k, cache, slots, qbs, fmt = F._bench_case(32768)
    k[5, 3], k[6, 7], k[7, :], k[9, 1] = float("nan"), float("inf"), 0, -float("inf")
    slots[11] = -1
    cases += [(k, cache, slots, qbs, f) for f in ("ue8m0", "")]
    for k, cache, slots, qbs, fmt in cases:
        want = cache.clone()
        op.run(k, want, slots, qbs, fmt, impl="reference")
        bad += mismatches(k, cache, slots, qbs, fmt, want, f"{tuple(k.shape)} {k.dtype} {cache.stride()} {fmt!r}")
        n += len(candidates(k, cache, slots, qbs, fmt))
    # an out-of-range slot on CUDA: the token is skipped like a padding token (module docstring)
    k, cache, slots, qbs, fmt = F._bench_case(4096)
    skipped = slots.clone()
    skipped[3] = -1
    slots[3] = cache.shape[0] * cache.shape[1] + 7
    want = cache.clone()
    op.run(k, want, skipped, qbs, fmt, impl="reference")
    bad += mismatches(k, cache, slots, qbs, fmt, want, "out-of-range slot")
    n += len(candidates(k, cache, slots, qbs, fmt))
    print(f"byte-exact check: {n} runs, {len(bad)} mismatches", *bad, sep="\n  ", flush=True)


def main():
    check()
    for n in SIZES:
        k, cache, slots, qbs, fmt = F._bench_case(n)
        nbytes = F.cost(k, cache, slots, qbs, fmt)[0]
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        copy = measure(lambda: dst.copy_(src)).median_us
        print(f"\n{n} tokens, {nbytes / 1e6:.1f} MB moved; a copy of as many bytes {copy:.2f} us (cold)", flush=True)
        runs = {name: fn for name, fn in candidates(k, cache, slots, qbs, fmt).items()
                if "TOKENS=1," not in name and "TOKENS=4," not in name}  # decode configs
        cold = {name: [] for name in runs}
        graph = {name: [] for name in runs}
        for _ in range(2):  # interleaved rounds: their spread is the noise
            for name, fn in runs.items():
                cold[name].append(measure(fn, warmup_ms=50, rep_ms=40, max_reps=400).median_us)
                graph[name].append(measure(fn, graph=True, warmup_ms=30, rep_ms=30).median_us)
        for name in runs:
            c, g = min(cold[name]), min(graph[name])
            print(f"  {name:45s} cold {c:7.2f} us ({nbytes / c / 1e3:5.0f} GB/s)   graph {g:7.2f} us "
                  f"({nbytes / g / 1e3:5.0f} GB/s)", flush=True)


if __name__ == "__main__":
    main()
