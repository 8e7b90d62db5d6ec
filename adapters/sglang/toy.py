"""The model SGLang's own `ModelRunner` runs: the simulator's toy model, as an `nn.Module` under an
architecture name of its own, registered in SGLang's `ModelRegistry`.

Its forward does what attention does with the KV cache, on the cache SGLang built and through the
rows SGLang wrote: it stores each new input token's id as the "key" of its KV cell
(`out_cache_loc`, layer 0), reads every request's whole context back through its row of
`req_to_token` (`req_pool_indices`, `seq_lens`), and returns logits that give the toy model's next
token a probability of one. SGLang's own sampler then samples it and writes it where it writes
samples; a corrupted row, a reused KV cell or a stale input id changes the tokens, which the
`oracle` invariant compares with the sequential reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from overlapcheck.backends.sim.toy_model import DTYPE, ToyModel

ARCH = "OverlapcheckToyForCausalLM"
LOW = -1e9  # the logit of every token but the toy model's: probability 0 after softmax


class _Holder:
    """What the next forward uses (one run at a time in a process): the toy model, and the KV
    pool and request-to-token rows of the scheduler's model runner."""

    model: ToyModel | None = None
    kv_pool: Any = None
    req_to_token: Any = None
    # On the simulated CUDA: the forward as one kernel there (`kernel.DeviceForward`).
    device_forward: Callable[[torch.Tensor, Any, int], torch.Tensor] | None = None


HOLDER = _Holder()


def make_model_class(logits_output: type) -> type[nn.Module]:
    """The `nn.Module` class, over SGLang's `LogitsProcessorOutput`."""

    class OverlapcheckToyForCausalLM(nn.Module):
        def __init__(self, config: Any, quant_config: Any = None, prefix: str = "") -> None:
            super().__init__()
            self.config = config
            self.vocab_size = int(config.vocab_size)
            self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)

        def load_weights(self, weights: Any) -> None:
            return None

        def forward(
            self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any, **_: Any
        ) -> Any:
            return logits_output(next_token_logits=self._logits(input_ids, forward_batch))

        def _logits(self, input_ids: torch.Tensor, batch: Any) -> torch.Tensor:
            if HOLDER.device_forward is not None:
                return HOLDER.device_forward(input_ids, batch, self.vocab_size)
            model = HOLDER.model
            assert model is not None, "no toy model set for this run"
            keys = HOLDER.kv_pool.get_key_buffer(0)
            keys[batch.out_cache_loc.long(), 0, 0] = input_ids.to(keys.dtype)
            rows = HOLDER.req_to_token
            pool_indices = batch.req_pool_indices.tolist()
            lengths = batch.seq_lens.tolist()
            logits = torch.full(
                (len(lengths), self.vocab_size), LOW, dtype=torch.float32, device=input_ids.device
            )
            for i, (row, length) in enumerate(zip(pool_indices, lengths, strict=True)):
                cells = rows[int(row), : int(length)].long()
                context = keys[cells, 0, 0].to(torch.int64).numpy().astype(DTYPE)
                token = model.next_token_of(np.ascontiguousarray(context).tobytes())
                logits[i, token] = 0.0
            return logits

    return OverlapcheckToyForCausalLM
