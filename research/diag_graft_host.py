"""Where does a compiled grafted Llama spend more host time per forward than the compiled plain
one? (`benchmarks/results/2026-12-02-h200-1/`, H200: 1.017x prefill, 1.027x decode with every op site inlined and equal GPU
time.) CPU, tiny Llama, one token. Three copies compiled with fullgraph=True: plain; RMSNorm
grafted by type (the grafted class, as kg.graft does now); RMSNorm grafted with the forward set on
each instance (kg.graft before the fix, forced here). Prints per copy: graphs, graph breaks,
Dynamo's guards (lines of the guard tree; explain()'s count last), then the host time per call
in interleaved rounds, paired with the plain copy's: the whole call and Dynamo's guard check alone.

By default the compiled graph is replaced by a function that returns its first outputs, so the
call is Dynamo's part only (guards, the frame's bytecode, the output's rebuild); with --inductor
it is Inductor's code (the sites inlined by the in-graph choice, a fake timer deciding for it) and
the call also holds the graph's CPU kernels. A cProfile of 300 calls per copy is printed with
--profile (the grafted copies show the same Python calls as the plain one: no frame of kernelgraft
runs per call).

    TRITON_INTERPRET=1 python research/diag_graft_host.py [--layers 4] [--rounds 40] [--inductor] [--profile]

Result (2026-12-02, CPU of 2 cores, torch 2.13, 4 layers, 9 grafted norms; four runs): guard
lines plain / class / instance 1467 / 1473 / 1694 (explain: 1106 / 1110 / 1208), one graph and no
break each. Instance forward: +19 to +26 us per call, +18 to +22 us of it in the guard check
(Dynamo traces nn.Module.__call__ for a module with an instance forward and guards the forward's
closure, per module). Grafted class: within noise of plain (-2 to +2 us, call and guards). The
same Python calls per forward in all three (cProfile, with and without --inductor). With
--inductor the CPU kernels make the call ~1 ms and the differences drown in noise.
"""

import argparse
import contextlib
import copy
import cProfile
import pstats
import statistics
import sys
import timeit
from pathlib import Path

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import kernelgraft as kg
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.graft import modules as _modules

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_graft_llama import _own_code  # noqa: E402  (each copy behind a code object of its own)

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, default=4)
p.add_argument("--rounds", type=int, default=40)
p.add_argument("--calls", type=int, default=300, help="calls per copy and round")
p.add_argument("--inductor", action="store_true")
p.add_argument("--profile", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
torch.set_grad_enabled(False)
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=args.layers, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
plain = LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, 128, (1, 1))
inputs = ((ids,), {"use_cache": False})


def timer(trial, settings):  # the in-graph choice inlines a site whose kernel is no faster
    trial.run(0)
    return 1.0


timer.host_ms = lambda trial: 0.5

# the settings the in-graph choice reads at every compile, for the whole run
contextlib.ExitStack().enter_context(kg.tune("on", timer=timer, compete=True))
models = {"plain": plain, "class": copy.deepcopy(plain), "instance": copy.deepcopy(plain)}
kg.graft(models["class"], {LlamaRMSNorm: rmsnorm}, example_inputs=inputs)
swap = _modules._swap_class
_modules._swap_class = lambda *a: False  # as kg.graft did before: the forward on the instance
try:
    kg.graft(models["instance"], {LlamaRMSNorm: rmsnorm}, example_inputs=inputs)
finally:
    _modules._swap_class = swap


def cached(gm, example_inputs):
    out = gm(*example_inputs)
    return lambda *a: out


compiled, guard_checks = {}, {}
for name, model in models.items():
    counters.clear()
    c = torch.compile(_own_code(model, name), fullgraph=True, backend="inductor" if args.inductor else cached)
    c(ids, use_cache=False)
    compiled[name] = c
    entries = _debug_get_cache_entry_list(type(c._orig_mod).forward.__code__)
    lines = sum(len(str(e.guard_manager).splitlines()) for e in entries)
    print(f"{name}: graphs {counters['stats']['unique_graphs']}, graph breaks "
          f"{sum(counters['graph_break'].values())}, cache entries {len(entries)}, guard lines {lines}",
          flush=True)
    local = {"self": c._orig_mod, "ids": ids, "use_cache": False}
    assert entries[0].guard_manager.check(local), entries[0].guard_manager.check_verbose(local)
    guard_checks[name] = (entries[0].guard_manager, local)

calls = {k: [] for k in compiled}
guards = {k: [] for k in compiled}
names = list(compiled)
for r in range(args.rounds):
    for name in names[r % 3:] + names[:r % 3]:
        c = compiled[name]
        calls[name].append(timeit.timeit(lambda: c(ids, use_cache=False), number=args.calls) / args.calls * 1e6)
        gm, local = guard_checks[name]
        guards[name].append(timeit.timeit(lambda: gm.check(local), number=args.calls) / args.calls * 1e6)
print(f"host us per call, medians of {args.rounds} rounds x {args.calls} calls "
      f"({'Inductor' if args.inductor else 'graph returns cached outputs'}):")
for name in names:
    print(f"  {name:9s} call {statistics.median(calls[name]):7.1f}  guard check {statistics.median(guards[name]):6.1f}"
          + ("" if name == "plain" else
             f"  | paired vs plain: call {statistics.median(a - b for a, b in zip(calls[name], calls['plain'])):+6.2f}"
             f"  guards {statistics.median(a - b for a, b in zip(guards[name], guards['plain'])):+6.2f}"))
for name, c in compiled.items():  # a recompile during the rounds would have been timed too
    assert len(_debug_get_cache_entry_list(type(c._orig_mod).forward.__code__)) == 1, name
for name, model in models.items():  # last: explain() resets Dynamo
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(ids, use_cache=False)
    print(f"{name}: explain: {explained.graph_count} graph(s), {explained.graph_break_count} break(s), "
          f"{len(explained.out_guards)} guards")
if args.profile:
    for name, model in models.items():
        torch._dynamo.reset()
        c = torch.compile(_own_code(model, name), fullgraph=True, backend="inductor" if args.inductor else cached)
        c(ids, use_cache=False)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            c(ids, use_cache=False)
        prof.disable()
        print(f"===== {name}")
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(12)
