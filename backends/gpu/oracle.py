"""The sequential reference: Hugging Face `transformers` on the same weights, one request at a time.

CPU: float32 on both sides, so the engine's greedy tokens must equal the reference's exactly.

CUDA: the engine runs in bf16 (weights and activations; FlashInfer accumulates in fp32), the
reference in float32 on the same bf16 weights. bf16 keeps 8 significant bits, so each rounding
moves a value by up to 2^-9 of itself; through the layers and the final dot product this moves the
logits by about a percent of their scale, and near-ties can flip. So each emitted token is checked
under teacher forcing (the reference is fed the engine's own previous tokens) and must score within
`BF16_LOGIT_MARGIN` of the reference's best logit. The margin is 0.5: random presets have logits of
std 4 (`weights.LOGIT_STD`), where rounding moves them by ~0.1 (the CUDA tests report the largest
deficit seen), while a real scheduling error -- a stale input token, another request's KV, a
wrong position -- changes the context and moves logits by units.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig

BF16_LOGIT_MARGIN = 0.5


class HFOracle:
    def __init__(
        self, config: PretrainedConfig, tensors: dict[str, torch.Tensor], device: torch.device
    ) -> None:
        self.device = device
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict({k: v.float().cpu() for k, v in tensors.items()}, strict=True)
        self.model = model.to(device=device, dtype=torch.float32).eval()
        self._greedy: dict[tuple[tuple[int, ...], int], list[int]] = {}
        # transformers renamed `past_key_values` to `cache` (5.2x); accept both.
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    @torch.no_grad()
    def step(self, ids: list[int], past: Any) -> tuple[torch.Tensor, Any]:
        """Feed `ids` after the cached context `past`; the next-token logits and the new cache."""
        ids_t = torch.tensor([ids], device=self.device)
        out = self.model(input_ids=ids_t, use_cache=True, **{self._cache_arg: past})
        return out.logits[0, -1].float(), getattr(out, self._cache_arg)

    def greedy(self, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
        """`max_tokens` greedy tokens after `prompt`, EOS ignored (callers cut at their EOS)."""
        key = (prompt, max_tokens)
        if key not in self._greedy:
            tokens: list[int] = []
            logits, past = self.step(list(prompt), None)
            while len(tokens) < max_tokens:
                tokens.append(int(logits.argmax()))
                if len(tokens) < max_tokens:
                    logits, past = self.step(tokens[-1:], past)
            self._greedy[key] = tokens
        return self._greedy[key]

    def forcing(self, prompt: tuple[int, ...]) -> TeacherForcing:
        logits, past = self.step(list(prompt), None)
        return TeacherForcing(self, logits, past)


@dataclass
class TeacherForcing:
    """The reference fed one request's emitted tokens, one at a time."""

    oracle: HFOracle
    logits: torch.Tensor
    past: Any
    deficits: list[float] = field(default_factory=list)

    derailed: bool = False  # fed something that is not a token id: nothing after it is judged

    def accept(self, token: int) -> float:
        """How far `token` scores below the reference's best logit here; then feed it."""
        if self.derailed or not 0 <= token < len(self.logits):
            # Not even a token id (a read before the copy landed, say): the reference cannot
            # take it (the embedding would assert on the device), so it fails, as does the rest.
            self.derailed = True
            self.deficits.append(float("inf"))
            return float("inf")
        deficit = float(self.logits.max() - self.logits[token])
        self.deficits.append(deficit)
        self.logits, self.past = self.oracle.step([token], self.past)
        return deficit
