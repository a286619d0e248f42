"""The example GEMM's 30 Triton configs as an op of their own, for bench_tune_gemm.py.

The example op also holds a CUDA C++ (WMMA) candidate; the tuner's acceptance checks compare it
with an exhaustive sweep and with ``triton.autotune`` over the same Triton configs, so the benchmark
tunes this Triton-only op (same kernel, configs and pruning hook). Imported by the benchmark and by
its child process that checks a new process reuses the decisions.
"""

import torch

import kernelgraft as kg
from kernelgraft.examples import gemm as G


gemm_triton = kg.op("kgbench::gemm_triton", impls=[G.TRITON], prune=G.PRUNE,
                    dtypes=(torch.bfloat16, torch.float16, torch.float32),
                    ndim={"a": 2, "b": 2})(G.gemm.reference)
