"""Per config of the FP8 K-cache scatter's Triton kernel, its global loads and stores by vector
width in the sm_90 PTX and SASS, and instructions per token; with ``--cuda``, the same for the
CUDA C++ kernel (NVRTC). Everything is cross-compiled: no GPU needed.

The Triton kernel is compiled as Triton's JIT specialises it for the bench's largest shape
(``fp8_kcache_scatter._bench_case(131072)``: bf16 k[131072, 128], ue8m0, a dense uint8 cache
[4096, 64, 132]): pointers 16-byte aligned, ints that are multiples of 16 marked so, an int equal
to 1 a constant. Run: ``python research/explore_fp8_scatter_ptx.py [--ptx DIR] [--cuda]``.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # the interpreter's kernels cannot be compiled
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton 3.9 warns when unset; 1 is the JIT's default

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kernelgraft.examples import fp8_kcache_scatter as F  # noqa: E402

N_TOKENS, NUM_BLOCKS, BLOCK_SIZE, CACHE_STRIDE, HEAD_DIM = 131072, 4096, 64, 132, 128
_PTX_MEM = re.compile(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st|red|atom)\.global[\w.:]*)", re.M)
_SASS = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)")
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_config(config: dict, ue8m0: bool = True):
    """Triton's compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``) for one config, with the
    arguments launch_fp8_kcache_scatter passes at the largest bench shape."""
    kernel = F._fp8_kcache_scatter_kernel
    jit = kernel if isinstance(kernel, triton.runtime.jit.JITFunction) else triton.JITFunction(kernel.fn)
    ints = {"n_tokens": N_TOKENS, "n_slots": NUM_BLOCKS * BLOCK_SIZE, "cache_stride": CACHE_STRIDE,
            "stride_page": BLOCK_SIZE * CACHE_STRIDE, "stride_row": CACHE_STRIDE, "stride_col": 1}
    pointers = {"k_ptr": "*bf16", "cache_ptr": "*u8", "slot_ptr": "*i64"}
    launch = dict(config)
    num_warps = launch.pop("num_warps")
    if "EVICT_FIRST" in launch or "EVICT" in jit.arg_names:  # launch_fp8_kcache_scatter's mapping
        launch["EVICT"] = "evict_first" if launch.pop("EVICT_FIRST", False) else ""
    constexprs = {
        "HEAD_DIM": HEAD_DIM, "BLOCK_SIZE": BLOCK_SIZE, "QBLOCK": 128, "QPAD": 128,
        "UE8M0": ue8m0, "PAGE_CONTIGUOUS": True, "SCALE32": True, "SOFT_FP8": False, **launch,
    }
    signature, attrs = {}, {}
    for i, p in enumerate(jit.params):
        name = p.name
        if name in pointers:
            signature[name] = pointers[name]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ints and ints[name] == 1:  # Triton's JIT turns an int equal to 1 into a constant
            signature[name] = "constexpr"
            constexprs[name] = 1
        elif name in ints:
            signature[name] = "i32"
            if ints[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "constexpr"
    unknown = set(constexprs) - set(jit.arg_names)
    if unknown:
        raise SystemExit(f"config keys {sorted(unknown)} are not parameters of the kernel")
    src = ASTSource(jit, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def ptx_summary(ptx: str, elements: int, threads: int) -> str:
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    instrs = [ln for ln in (line.strip() for line in body.splitlines())
              if ln and not ln.startswith(("//", ".", "$", "{", "}")) and not ln.endswith(":")]
    mem = ", ".join(f"{n} {op}" for op, n in sorted(collections.Counter(_PTX_MEM.findall(ptx)).items()))
    return f"PTX: {len(instrs)} instructions a thread ({len(instrs) * threads / elements * 128:.0f} a token); {mem}"


def sass_summary(cubin: bytes, elements: int, threads: int) -> str:
    """Instructions of the SASS main path: up to the last EXIT, leaving out the out-of-line slow
    path of a correctly rounded division that follows it, and the padding."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-sass", f.name],
                              capture_output=True, text=True, check=True).stdout
        res = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-res-usage", f.name],
                             capture_output=True, text=True, check=True).stdout
    ops = _SASS.findall(sass)
    last_exit = max(i for i, op in enumerate(ops) if op == "EXIT")
    main = [op for op in ops[:last_exit + 1] if op != "NOP"]
    mem = collections.Counter(op for op in main if op.startswith(("LDG", "STG", "LDS", "STS", "BAR")))
    regs = re.search(r"REG:(\d+)", res).group(1)
    return (f"SASS: {len(main)} instructions a thread on the main path ({len(main) * threads / elements * 128:.0f} "
            f"a token), {regs} registers; " + ", ".join(f"{n} {op}" for op, n in sorted(mem.items())))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ptx", help="also write each config's PTX into this folder")
    parser.add_argument("--fmt", default="ue8m0", choices=["ue8m0", ""])
    parser.add_argument("--cuda", action="store_true", help="also the CUDA C++ kernel (NVRTC, bf16)")
    args = parser.parse_args()
    print(f"triton {triton.__version__}, sm_90, bf16 k[{N_TOKENS}, {HEAD_DIM}], "
          f"cache uint8[{NUM_BLOCKS}, {BLOCK_SIZE}, {CACHE_STRIDE}], scale_fmt {args.fmt!r}")
    for config in (c.as_dict() for c in F.TRITON.configs):
        compiled = compile_config(config, ue8m0=args.fmt == "ue8m0")
        name = " ".join(f"{k}={v}" for k, v in config.items())
        elements, threads = config["TOKENS"] * HEAD_DIM, 32 * config["num_warps"]
        print(f"{name}: {elements // threads} elements a thread", flush=True)
        print("    " + ptx_summary(compiled.asm["ptx"], elements, threads))
        print("    " + sass_summary(compiled.asm["cubin"], elements, threads), flush=True)
        if args.ptx:
            os.makedirs(args.ptx, exist_ok=True)
            with open(os.path.join(args.ptx, name.replace(" ", "_").replace("=", "") + ".ptx"), "w") as f:
                f.write(compiled.asm["ptx"])
    if args.cuda:
        import kernelgraft as kg
        from kernelgraft.backends.cuda.jit import CudaRunner

        for config in F.CUDA.configs:
            compiled = CudaRunner(F.CUDA, config).compile("sm_90", {"T": kg.ctype(torch.bfloat16)})
            # one kernel holds both paths (the vector one and the warp-per-block one for other
            # layouts), so these are its whole SASS's counts, not one path's
            summary = sass_summary(compiled.image, 1, 1)
            print(f"CUDA {config.label()}: SASS, both paths: {summary.split(' a thread')[0].split(': ')[1]}; "
                  + summary.split("; ", 1)[1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
