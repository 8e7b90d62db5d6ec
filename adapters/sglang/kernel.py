"""The toy model's forward as one kernel on the simulated CUDA's current stream (the forward
stream, where SGLang's `ModelRunner` runs its model).

What it does is what attention does with SGLang's KV cache: it stores each new input id as the
"key" of its KV cell (`out_cache_loc`, layer 0 of SGLang's own `MHATokenToKVPool`, one element
per token), reads every request's context back through its `req_to_token` row
(`req_pool_indices`, `seq_lens`), and writes logits that give the toy model's next token
probability one. SGLang's own sampler samples them.

Its footprint is declared once at issue from the program-order (logical) copies: the input ids,
positions, `out_cache_loc`, `req_pool_indices`, `seq_lens`, the rows' cells of `req_to_token`
it reads, the KV cells of each context (read, in sequence order: the order the checks expect),
the KV cells it writes and the logits. What it computes on the device is computed from the
physical copies when the kernel starts, so a row or a cell overwritten before the forward ran
changes the tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from overlapcheck.adapters.sglang.transport import uid_of
from overlapcheck.backends.sim.toy_model import DTYPE, ToyModel
from overlapcheck.backends.torchsim.dispatch import not_program, plain
from overlapcheck.backends.torchsim.memory import view_cells
from overlapcheck.backends.torchsim.session import SimulatedCuda
from overlapcheck.backends.torchsim.tensor import SimTensor

LOW = -1e9  # the logit of every token but the toy model's
not_program(__file__)  # what it allocates is SGLang's model runner's


class DeviceForward:
    """The forward kernel for one run: its simulated CUDA, its toy model, SGLang's KV key
    buffer (layer 0) and `req_to_token`."""

    def __init__(self, cuda: SimulatedCuda, model: ToyModel, keys: Any, rows: Any) -> None:
        self.cuda = cuda
        self.model = model
        self.keys: SimTensor = keys
        self.rows: SimTensor = rows
        self.batches = 0
        found = cuda.interceptor.locate(keys)
        assert found is not None, "the KV key buffer is not on the simulated device"
        buffer, logical = found
        with plain():
            # each token's layer-0 key, as element offsets into its allocation
            self.key_cells = view_cells(buffer, logical[:, 0, 0])

    def __call__(self, input_ids: torch.Tensor, batch: Any, vocab: int) -> torch.Tensor:
        self.batches += 1
        ids: SimTensor = input_ids  # type: ignore[assignment]
        loc: SimTensor = batch.out_cache_loc
        pool_idx: SimTensor = batch.req_pool_indices
        seq_lens: SimTensor = batch.seq_lens
        logits = torch.empty((len(seq_lens), vocab), dtype=torch.float32, device=ids.device)
        out: SimTensor = logits  # type: ignore[assignment]
        width = int(self.rows.shape[1])
        keys, rows = self.keys, self.rows
        with plain():
            slots = pool_idx.logic.numpy().astype(np.int64)
            ends = seq_lens.logic.numpy().astype(np.int64)
            row_cells = np.concatenate(
                [
                    np.arange(r * width, r * width + e, dtype=np.int64)
                    for r, e in zip(slots, ends, strict=True)
                ]
                or [np.zeros(0, dtype=np.int64)]
            )
            context = rows.logic.reshape(-1).numpy()[row_cells].astype(np.int64)
            written = loc.logic.numpy().astype(np.int64)
        key_cells = self._cells(context)
        accesses: list[tuple[torch.Tensor, np.ndarray | None, str]] = [
            (ids, None, "r"),
            (batch.positions, None, "r"),
            (loc, None, "r"),
            (pool_idx, None, "r"),
            (seq_lens, None, "r"),
            (rows, row_cells, "r"),
            (keys, key_cells, "r"),
            (keys, self._cells(written), "w"),
            (out, None, "w"),
        ]

        def compute(
            key_values: torch.Tensor,
            row_values: torch.Tensor,
            id_values: torch.Tensor,
            loc_values: torch.Tensor,
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
            """(logits, the KV cells written, their values) from what the kernel reads."""
            flat_keys = key_values[:, 0, 0].numpy().copy()
            cells = np.mod(loc_values.numpy().astype(np.int64), len(flat_keys))
            new = id_values.numpy().astype(flat_keys.dtype)
            flat_keys[cells] = new
            table = row_values.reshape(-1).numpy()
            values = np.full((len(slots), vocab), LOW, dtype=np.float32)
            for i, (slot, end) in enumerate(zip(slots, ends, strict=True)):
                at = np.mod(
                    table[slot * width : slot * width + end].astype(np.int64), len(flat_keys)
                )
                ctx = flat_keys[at].astype(np.int64).astype(DTYPE)
                values[
                    i, int(self.model.next_token_of(np.ascontiguousarray(ctx).tobytes())) % vocab
                ] = 0.0
            return values, cells, new

        with plain():  # program order: the logical copies get the same computation at issue
            values, cells, new = compute(keys.logic, rows.logic, ids.logic, loc.logic)
            keys.logic[torch.from_numpy(cells), 0, 0] = torch.from_numpy(new)
            out.logic.copy_(torch.from_numpy(values))
        key_phys, row_phys, id_phys, loc_phys, out_phys = (
            keys.phys,
            rows.phys,
            ids.phys,
            loc.phys,
            out.phys,
        )

        def start() -> Callable[[], None]:
            with plain():
                got, at, vals = compute(key_phys, row_phys, id_phys, loc_phys)

            def end() -> None:
                with plain():
                    key_phys[torch.from_numpy(at), 0, 0] = torch.from_numpy(vals)
                    out_phys.copy_(torch.from_numpy(got))

            return end

        new_tokens = len(written)
        cost = self.cuda.device.timing.forward(new_tokens, int(ends.sum()))
        uids = tuple(uid_of(r) for r in getattr(batch, "rids", None) or ())
        label = f"{'P' if batch.forward_mode.is_extend() else 'D'}{self.batches}"
        shape = (slots - 1, ends)  # SGLang's row 0 is its padding row: rows 1..N are slots 0..N-1
        self.cuda.launch(
            "forward", label, accesses, cost, start, batch=self.batches, uids=uids, shape=shape
        )
        return logits

    def _cells(self, tokens: np.ndarray) -> np.ndarray:
        """The cells of tokens' layer-0 keys in the key buffer's allocation."""
        out: np.ndarray = self.key_cells[np.mod(tokens, len(self.key_cells))]
        return out
