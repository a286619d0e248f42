"""Round 4 of the softmax exploration: registers, spills and time of the cluster kernel with
occupancy hints (MIN_BLOCKS), and of Triton's one-pass rows kernel, on bf16[2048, 32768]."""
import json

import torch
from triton.testing import do_bench

import kernelgraft as kg
from kernelgraft.backends.cuda.jit import CudaRunner
from kernelgraft.examples import _softmax_cuda as S
from kernelgraft.examples import softmax as T


def attrs(runner):
    from cuda.bindings import driver as d

    (launcher,) = runner._launchers.values()
    h = launcher.function.handle(0)
    get = lambda a: int(d.cuFuncGetAttribute(a, h)[1])  # noqa: E731
    A = d.CUfunction_attribute
    return {"regs": get(A.CU_FUNC_ATTRIBUTE_NUM_REGS), "local_bytes": get(A.CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)}


def main():
    x = torch.randn(2048, 32768, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    want = torch.softmax(x.float(), -1)
    nbytes = 2 * x.numel() * 2
    res = {}
    configs = []
    for c, t, ch in ((4, 256, 4), (8, 128, 4), (2, 512, 4)):
        for mb in (1, 2, 3, 4, 6, 8):
            if t * mb <= 2048:
                configs.append({"CLUSTER": c, "THREADS": t, "CHUNKS": ch, "MIN_BLOCKS": mb})
    spec = kg.cuda(S._CLUSTER_SOURCE, "softmax_cluster<{T}, {CLUSTER}, {THREADS}, {CHUNKS}>",
                   launch=S.launch_softmax_cluster, configs=configs, min_capability=(9, 0))
    for cfg in spec.configs:
        name = "cluster " + cfg.label()
        try:
            r = CudaRunner(spec, cfg)
            fn = lambda r=r: r(x, out)  # noqa: E731
            out.fill_(float("nan")); fn(); torch.cuda.synchronize()
            err = (out.float() - want).abs().max().item()
            ms = do_bench(fn, warmup=50, rep=200)
            res[name] = {"us": ms * 1e3, "gbps": nbytes / ms / 1e6, "maxerr": err, **attrs(r)}
        except Exception as exc:
            res[name] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        print(name, res[name], flush=True)
    for nw in (16, 32):
        k = T._softmax_rows_kernel[(2048,)](x, out, 2048, 32768, ROWS=1, BLOCK=32768, num_warps=nw)
        ms = do_bench(lambda: T._softmax_rows_kernel[(2048,)](x, out, 2048, 32768, ROWS=1, BLOCK=32768,
                                                              num_warps=nw), warmup=50, rep=200)
        res[f"triton rows nw{nw}"] = {"us": ms * 1e3, "gbps": nbytes / ms / 1e6,
                                      "regs": getattr(k, "n_regs", None), "spills": getattr(k, "n_spills", None)}
        print(f"triton rows nw{nw}", res[f"triton rows nw{nw}"], flush=True)
    y = torch.empty_like(x)
    ms = do_bench(lambda: y.copy_(x), warmup=50, rep=200)
    res["copy same bytes"] = {"us": ms * 1e3, "gbps": nbytes / ms / 1e6}
    print("copy", res["copy same bytes"], flush=True)
    print(json.dumps(res))


main()
