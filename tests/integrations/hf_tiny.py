"""A tiny seeded Llama built from a config (no download) and a cache-free reference prefill,
shared by the transformers tests and their subprocess driver."""

from __future__ import annotations

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

VOCAB = 1000
BLOCK = 16  # tokens per offloaded block in the tests


def tiny_model(seed: int = 0) -> LlamaForCausalLM:
    """2 layers, hidden 128, 4 heads, 2 KV heads, head_dim 32, vocabulary 1,000, fp32."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def prompts(seed: int = 1) -> list[list[int]]:
    """Five prompts: two share a 100-token system prompt, one extends the first, one is a
    whole number of blocks, one shares nothing."""
    gen = torch.Generator().manual_seed(seed)

    def rand(n: int) -> list[int]:
        return torch.randint(0, VOCAB, (n,), generator=gen).tolist()

    system = rand(100)
    first = system + rand(61)
    return [first, system + rand(45), first + rand(70), system + rand(28), rand(50)]


def reference(
    model: LlamaForCausalLM, tokens: list[int], cut: int | None = BLOCK
) -> tuple[torch.Tensor, DynamicCache]:
    """Last-token logits of a cold prefill with transformers' own DynamicCache, cut at
    multiples of ``cut`` tokens (``None``: one forward)."""
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([tokens])
    start, logits = 0, None
    with torch.inference_mode():
        while start < len(tokens):
            stop = len(tokens) if cut is None else min(len(tokens), (start // cut + 1) * cut)
            out = model(ids[:, start:stop], cache=cache, use_cache=True, logits_to_keep=1)
            logits, start = out.logits[0, -1], stop
    assert logits is not None
    return logits, cache
