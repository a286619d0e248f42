"""Is a compiled grafted model whose op sites Inductor's in-graph choice inlined the same program as
the compiled model as written? (`benchmarks/results/2026-12-02-h200-1/`: on the H200 it took 1.017x the time with equal GPU time.)
CPU, tiny Llama, fake timer (so the decision inlines RMSNorm): writes both Inductor outputs to
/tmp/inline_code_{plain,grafted}.py and prints the in-graph choices and Dynamo's guard counts.
Run with TRITON_INTERPRET=1. Result (2026-12-02): the `call` wrappers are identical, kernels differ
only in the order of a product's operands; guards 1452 (plain) vs 1679 (grafted) for 2 layers."""

import copy

import torch
import torch._inductor.config as inductor_config
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._inductor.utils import run_and_get_code
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRMSNorm

import kernelgraft as kg
from kernelgraft.examples.rmsnorm import rmsnorm
from kernelgraft.graft import inline as _inline

torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
plain = LlamaForCausalLM(cfg).eval()
grafted = copy.deepcopy(plain)
ids = torch.randint(0, 128, (1, 8))


def timer(trial, settings):
    trial.run(0)
    return 1.0


timer.host_ms = lambda trial: 0.5
with kg.tune("on", timer=timer, compete=True), inductor_config.patch(fx_graph_cache=False):
    kg.graft(grafted, {LlamaRMSNorm: rmsnorm}, example_inputs=((ids,), {"use_cache": False}))
    for name, model in (("plain", plain), ("grafted", grafted)):
        torch._dynamo.reset()
        with torch.no_grad():
            _, code = run_and_get_code(lambda: torch.compile(model, fullgraph=True)(ids, use_cache=False))
        with open(f"/tmp/inline_code_{name}.py", "w") as f:
            f.write("\n".join(code))
        entries = _debug_get_cache_entry_list(type(model).forward.__code__)
        guards = sum(len(str(e.guard_manager).splitlines()) for e in entries)
        print(name, "guard lines", guards)
print(_inline.choices())
