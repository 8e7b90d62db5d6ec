"""Sampling: greedy, or seeded temperature / top-k / top-p per sequence."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from overlapcheck.core.messages import SamplingParams


def is_greedy(params: Sequence[SamplingParams | None]) -> bool:
    return all(p is None or p.temperature <= 0 or p.top_k == 1 for p in params)


def sample(
    logits: torch.Tensor, params: Sequence[SamplingParams | None], generator: torch.Generator | None
) -> torch.Tensor:
    """One token per row of float32 `logits`, as int32. Rows without params are greedy."""
    greedy = logits.argmax(dim=-1)
    if is_greedy(params):
        return greedy.to(torch.int32)
    dev, vocab = logits.device, logits.shape[-1]
    chosen = [p or SamplingParams() for p in params]
    temp = torch.tensor([max(p.temperature, 1e-5) for p in chosen], device=dev)
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in chosen], device=dev)
    top_p = torch.tensor([p.top_p for p in chosen], device=dev)
    scaled, order = (logits / temp[:, None]).sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=dev)[None, :]
    probs = torch.softmax(scaled, dim=-1)
    # top-p: drop a token once the mass before it already reaches p (the first always stays)
    outside = (rank >= top_k[:, None]) | (probs.cumsum(-1) - probs >= top_p[:, None])
    probs = torch.softmax(scaled.masked_fill(outside, float("-inf")), dim=-1)
    picked = order.gather(1, torch.multinomial(probs, 1, generator=generator)).squeeze(1)
    is_greedy_row = torch.tensor([p.temperature <= 0 or p.top_k == 1 for p in chosen], device=dev)
    return torch.where(is_greedy_row, greedy, picked).to(torch.int32)
