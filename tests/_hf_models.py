"""Small Hugging Face models built from their configs (random weights, seeded, no download) for
the graft tests, and their logits."""

from __future__ import annotations

import torch

_LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=256, max_position_embeddings=128)
_MIXTRAL = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                num_local_experts=8, num_experts_per_tok=2)


def tiny_llama(device="cpu", dtype=torch.float32, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**{**_LLAMA, **overrides})).to(device=device, dtype=dtype).eval()


def tiny_mixtral(device="cpu", dtype=torch.float32, **overrides):
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    return MixtralForCausalLM(MixtralConfig(**{**_MIXTRAL, **overrides})).to(device=device, dtype=dtype).eval()


def logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits
