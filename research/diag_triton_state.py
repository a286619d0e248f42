"""Does Inductor's first compile in a process change what Triton's cache key depends on (ptxas,
libdevice, cache dir), so that a kernel compiled ahead by a worker is no longer found in the cache?

Prints, before and after a torch.compile of a tiny function (a real compile when the Inductor cache
is fresh, a cache hit when it is not): the Triton environment and knobs, ptxas versions, and the
cache hash of one small Triton kernel compiled in-process.

    python research/diag_triton_state.py [--inductor-cache DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

import torch
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=m) * 2.0, mask=m)


def _version(path: str | None) -> str | None:
    if not path or not os.path.exists(path):
        return None
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1] if out else None


def state() -> dict:
    from triton import knobs
    from triton.backends.nvidia import compiler

    x = torch.randn(4096, device="cuda")
    y = torch.empty_like(x)
    k = _scale[(4,)](x, y, x.numel(), BLOCK=1024)
    torch_ptxas = os.path.join(os.path.dirname(torch.__file__), "bin", "ptxas")
    return {"TRITON_PTXAS_PATH": os.environ.get("TRITON_PTXAS_PATH"),
            "TRITON_LIBDEVICE_PATH": os.environ.get("TRITON_LIBDEVICE_PATH"),
            "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR"),
            "knobs.cache.dir": str(knobs.cache.dir),
            "knobs.nvidia.libdevice_path": knobs.nvidia.libdevice_path,
            "knobs.nvidia.ptxas": getattr(knobs.nvidia.ptxas, "path", None),
            "ptxas_version_cached": compiler.get_ptxas_version(90),
            "torch_bin_ptxas": _version(torch_ptxas),
            "triton_bundled_ptxas": _version(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                                          "bin", "ptxas")),
            "kernel_hash": k.hash}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inductor-cache", default=None)
    args = parser.parse_args()
    if args.inductor_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = args.inductor_cache
    before = state()

    def tiny(t: torch.Tensor) -> torch.Tensor:
        return torch.relu(t) * 2.0 + 1.0

    torch.compile(tiny, dynamic=False)(torch.randn(16, device="cuda"))
    torch.cuda.synchronize()
    after = state()
    try:
        from torch._inductor import config

        numerics = {k: getattr(config.eager_numerics, k) for k in dir(config.eager_numerics) if not k.startswith("_")}
    except Exception as exc:  # noqa: BLE001
        numerics = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"torch": torch.__version__, "triton": triton.__version__, "before": before, "after": after,
                      "changed": sorted(k for k in before if before[k] != after[k]), "eager_numerics": str(numerics)}))


if __name__ == "__main__":
    main()
