"""Diagnose the bench's tuned-row anomaly: same kernel as the best candidate, several times slower."""
import importlib
import json
import time
import torch
import kernelgraft as kg
from kernelgraft.bench.timing import measure
from kernelgraft.bench.run import _candidate_fn

def host_us(fn, n=300):
    for _ in range(20): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt

cases = [("kernelgraft.examples.rmsnorm_residual", 0), ("kernelgraft.examples.softmax", 0),
         ("kernelgraft.examples.fp8_kcache_scatter", 0), ("kernelgraft.examples.rmsnorm", 0)]
for modname, idx in cases:
    mod = importlib.import_module(modname)
    op = next(v for v in vars(mod).values() if isinstance(v, kg.KernelOp) and getattr(v, "sample_inputs", None) and hasattr(mod, "bench_inputs"))
    args = tuple(list(mod.bench_inputs())[idx])
    counter = {"plans": 0}
    orig = op._make_plan
    def counted(a, orig=orig):
        counter["plans"] += 1
        return orig(a)
    op._make_plan = counted
    with kg.tune("off"):
        op(*args)
    cands = [c for c in op.candidates(*args) if c.supported]
    res = {"op": op.name}
    with kg.tune("on", cold_l2=True):
        t0 = time.perf_counter(); op(*args); torch.cuda.synchronize(); res["tune_s"] = time.perf_counter() - t0
        plan = op.dispatcher.plan_for(args)
        label = plan.candidate.label
        res["chosen"] = label
        best = next(c for c in cands if c.label == label)
        cf = _candidate_fn(op, best, args)
        n0 = counter["plans"]
        res["host_op_on"] = host_us(lambda: op(*args))
        res["host_cand"] = host_us(cf)
        res["plans_made_during_host"] = counter["plans"] - n0
        res["meas_op_on_1"] = measure(lambda: op(*args)).median_us
        res["meas_op_on_2"] = measure(lambda: op(*args)).median_us
        res["meas_cand_on"] = measure(cf).median_us
    res["host_op_after"] = host_us(lambda: op(*args))
    res["meas_op_after"] = measure(lambda: op(*args)).median_us
    res["meas_cand_after"] = measure(cf).median_us
    res["plans_total"] = counter["plans"]
    res["dispatch_flags"] = [torch._C._len_torch_dispatch_stack(), torch._C._is_torch_function_mode_enabled(), torch.compiler.is_compiling()]
    print(json.dumps(res), flush=True)
