"""The stand-in for vLLM's worker (its v2 `GPUModelRunner`): what it keeps per request and what it
runs on the device for each `SchedulerOutput`, under the simulated CUDA.

Like vLLM's model runner it keeps its own state per request in a slot (`req_index`): the token
history (`token_pool`: prompt, then every token it sampled, as vLLM's `all_token_ids`), the
number of positions whose KV is computed (`num_computed`, on the device: the scheduler's count
is only an upper bound under async scheduling with drafts, until `update_from_output` rolls
rejected drafts back), the drafts it proposed (`drafts`) and the request's block table row. A
finished or preempted request's slot is freed; a preempted one comes back as a new request
whose prefill is prompt + outputs. The scheduler's placeholders (`-1` draft ids under
`AsyncScheduler`) are never read: the drafts come from the worker's own device buffer.

Each step, on the engine stream (vLLM's main stream): the new requests' rows and the new block
ids are staged through pinned memory and written into the device buffers; then one kernel,
"the model": for each sequence its input ids (the token history from `num_computed` on, then its
drafts), its context's KV cells through its block table row, the new KV cells written, greedy
targets from the simulator's toy model, drafts accepted while they match (vLLM's rejection
sampler, greedy), `num_computed` and the history advanced, and the next drafts proposed by an
n-gram lookup over the history (vLLM's ngram drafter runs on the GPU too). The sampled ids then
go to pinned host memory on a copy stream that waits for the engine stream, with an event (vLLM's
async output copy); the output is read once that event has fired.

In the KV-connector mode the connector's loads of external KV (the prompt's KV a remote prefill
computed) are written into their freshly allocated blocks on a transfer stream that waits for
nothing, as a NIC's writes would; the worker reports a load finished once its event has fired.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from overlapcheck.backends.sim.toy_model import DTYPE, ToyModel
from overlapcheck.backends.torchsim.dispatch import plain
from overlapcheck.backends.torchsim.session import SimulatedCuda
from overlapcheck.backends.torchsim.tensor import SimTensor
from overlapcheck.core.errors import InvariantError

LOOKUP_MIN, LOOKUP_MAX = 1, 3  # the n-gram lengths the drafter matches (configs.py sets vLLM's)


@dataclass(slots=True)
class Seq:
    """One sequence of a batch, as the worker's host side knows it when it launches."""

    req_id: str
    uid: int
    index: int  # the request's slot
    start: int  # num_computed at launch (the worker's own count, in program order)
    inputs: int  # input ids read from the history
    drafts: int  # draft tokens verified
    samples: bool  # whether the step samples (not a partial prefill chunk)


@dataclass(slots=True)
class Launched:
    """One executed step: its sequences, the output's host buffer and the copy's event."""

    batch: int
    label: str
    seqs: list[Seq]
    host: torch.Tensor | None  # pinned [n, 2 + drafts]: accepted count, tokens; then drafts
    done: Any  # the output copy's event
    keep: list[torch.Tensor] = field(default_factory=list)  # device buffers the copy reads


@dataclass(slots=True)
class Load:
    """A connector load of external KV: tokens `start..start+len(tokens)` into `cells`."""

    req_id: str
    cells: np.ndarray
    tokens: np.ndarray


class StandInWorker:
    """vLLM's worker for one run: per-request device state, the step's kernels, the output copy."""

    def __init__(
        self,
        cuda: SimulatedCuda,
        model: ToyModel,
        max_num_reqs: int,
        max_model_len: int,
        block_size: int,
        num_blocks: int,
        drafts: int,
        uid_of: dict[str, int],
    ) -> None:
        self.cuda = cuda
        self.model = model
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.block_size = block_size
        self.width = -(-max_model_len // block_size)  # block-table columns
        self.k = drafts
        self.uid_of = uid_of  # req_id -> the harness's uid (the adapter keeps it)
        dev = cuda.torch_device
        self.engine = torch.cuda.Stream()
        self.copy = torch.cuda.Stream()
        self.transfer = torch.cuda.Stream()
        torch.cuda.set_stream(self.engine)
        self.token_pool = torch.zeros((max_num_reqs, max_model_len), dtype=torch.int32, device=dev)
        self.block_table = torch.zeros((max_num_reqs, self.width), dtype=torch.int32, device=dev)
        self.kv = torch.full((num_blocks * block_size,), -1, dtype=torch.int32, device=dev)
        self.num_computed = torch.zeros(max_num_reqs, dtype=torch.int32, device=dev)
        self.drafts = torch.zeros((max_num_reqs, max(drafts, 1)), dtype=torch.int32, device=dev)
        for tensor, name in (
            (self.token_pool, "token_pool"),
            (self.block_table, "block_table"),
            (self.kv, "kv"),
            (self.num_computed, "num_computed"),
            (self.drafts, "drafts"),
        ):
            cuda.name(tensor, name)
        self.index: dict[str, int] = {}  # req_id -> slot
        self.free: list[int] = list(range(max_num_reqs - 1, -1, -1))  # popped from the end
        self.prefill_len: dict[str, int] = {}
        self.blocks: dict[str, int] = {}  # req_id -> block-table columns filled
        self.batches = 0
        self.loads: list[tuple[str, Any]] = []  # (req_id, event) of loads not yet reported
        self.last_drafts: dict[str, list[int]] = {}  # sync mode: the drafts for the scheduler
        # The set-up ends with a device synchronize, as vLLM's memory profiling does.
        torch.cuda.synchronize()

    # -- per-request state -----------------------------------------------------------------------

    def update_states(self, out: Any) -> None:
        """vLLM's `finish_requests`, `add_requests`, `update_requests`: slots freed and taken,
        rows and block ids staged to the device on the engine stream."""
        gone = set(out.finished_req_ids)
        if out.preempted_req_ids:
            gone |= set(out.preempted_req_ids)
        for req_id in sorted(gone):
            slot = self.index.pop(req_id, None)
            if slot is not None:
                self.free.append(slot)
                self.prefill_len.pop(req_id, None)
                self.blocks.pop(req_id, None)
        pool: list[tuple[np.ndarray, np.ndarray]] = []
        table: list[tuple[np.ndarray, np.ndarray]] = []
        computed: list[tuple[np.ndarray, np.ndarray]] = []
        width, length = self.width, self.max_model_len
        for new in out.scheduled_new_reqs:
            if new.req_id in self.index:  # a streaming update: vLLM removes and re-adds it
                self.free.append(self.index.pop(new.req_id))
            slot = self.free.pop()
            self.index[new.req_id] = slot
            tokens = np.asarray(new.prefill_token_ids, dtype=np.int64)
            self.prefill_len[new.req_id] = len(tokens)
            pool.append((slot * length + np.arange(len(tokens)), tokens))
            ids = np.asarray(new.block_ids[0], dtype=np.int64)
            self.blocks[new.req_id] = len(ids)
            table.append((slot * width + np.arange(len(ids)), ids))
            computed.append((np.array([slot]), np.array([new.num_computed_tokens])))
        cached = out.scheduled_cached_reqs
        for req_id, new_ids in zip(cached.req_ids, cached.new_block_ids, strict=True):
            if new_ids is None or not new_ids[0]:
                continue
            slot = self.index[req_id]
            ids = np.asarray(new_ids[0], dtype=np.int64)
            begin = self.blocks[req_id]
            self.blocks[req_id] = begin + len(ids)
            table.append((slot * width + begin + np.arange(len(ids)), ids))
        self._stage(
            [(self.token_pool, pool), (self.block_table, table), (self.num_computed, computed)]
        )

    def _stage(
        self, targets: list[tuple[torch.Tensor, list[tuple[np.ndarray, np.ndarray]]]]
    ) -> None:
        """Writes of (flat cells, values) into device buffers, as vLLM's staged writes: one
        pinned buffer of cells and values, one copy to the device on the current stream, then
        an index_put per buffer."""
        parts = [(t, w) for t, w in targets if w]
        if not parts:
            return
        with plain():
            sizes = [sum(len(c) for c, _ in w) for _, w in parts]
            staged = np.empty((2, sum(sizes)), dtype=np.int32)
            staged[0] = np.concatenate([c for _, w in parts for c, _ in w])
            staged[1] = np.concatenate([v for _, w in parts for _, v in w])
        pinned = torch.tensor(staged, dtype=torch.int32, pin_memory=True)
        all_cells, all_values = pinned.to(self.cuda.torch_device, non_blocking=True).unbind(0)
        at = 0
        for (target, _), size in zip(parts, sizes, strict=True):
            cells, values = all_cells, all_values
            if len(parts) > 1:
                cells, values = cells.narrow(0, at, size), values.narrow(0, at, size)
            target.view(-1).index_put_((cells,), values)
            at += size

    # -- the step ------------------------------------------------------------------------------

    def execute(self, out: Any, connector_loads: Sequence[Load]) -> Launched | None:
        """Run one `SchedulerOutput` (states, connector loads, the model, the output copy).
        None when it scheduled no tokens."""
        self.update_states(out)
        for load in connector_loads:
            self._start_load(load)
        if out.total_num_scheduled_tokens == 0:
            return None
        seqs = self._batch(out)
        self.batches += 1
        has_prefill = any(s.inputs > 1 or not s.samples for s in seqs)
        label = f"{'P' if has_prefill else 'D'}{self.batches}"
        dev = self.cuda.torch_device
        result = torch.empty((len(seqs), 3 + 2 * self.k), dtype=torch.int32, device=dev)
        self._launch(seqs, result, label)
        # vLLM's async output copy: a copy stream ordered after the engine stream's work so far.
        self.copy.wait_stream(self.engine)
        with torch.cuda.stream(self.copy):
            host = torch.empty(result.shape, dtype=torch.int32, pin_memory=True)
            host.copy_(result, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.copy)
        return Launched(self.batches, label, seqs, host, done, [result])

    def _batch(self, out: Any) -> list[Seq]:
        """The batch's sequences, in the scheduler's order, from the worker's own counts."""
        counts: SimTensor = self.num_computed  # type: ignore[assignment]
        with plain():
            computed = counts.logic.numpy()
        seqs = []
        spec = out.scheduled_spec_decode_tokens
        for req_id, n in out.num_scheduled_tokens.items():
            slot = self.index[req_id]
            drafts = min(len(spec.get(req_id, ())), self.k)
            start = int(computed[slot])
            inputs = n - drafts
            if n <= 0 or start + n > self.max_model_len:
                # vLLM's runner keeps each request's tokens in a row max_model_len wide (its
                # `[max_num_reqs, max_model_len]` buffers) and repeats positions per scheduled
                # token: a step past the row, or of no tokens, is one it cannot run.
                raise InvariantError(
                    "no-crash",
                    f"vLLM scheduled {n} token(s) for request {req_id} from position {start} "
                    f"(drafts {drafts}): past max_model_len {self.max_model_len}, out of its "
                    "model runner's per-request buffers"
                    if n > 0
                    else f"vLLM scheduled {n} tokens for request {req_id}: its model runner "
                    "cannot run a step of no tokens",
                )
            samples = start + inputs >= self.prefill_len[req_id]
            seqs.append(Seq(req_id, self.uid_of[req_id], slot, start, inputs, drafts, samples))
        return seqs

    def _launch(self, seqs: list[Seq], result: torch.Tensor, label: str) -> None:
        """The model as one kernel on the engine stream, over what the batch names. Its
        footprint and its effect in program order come from the logical copies at issue; what
        it computes on the device, from the physical copies when it runs."""
        cuda = self.cuda
        named: dict[str, SimTensor] = {
            "pool": self.token_pool,  # type: ignore[dict-item]
            "table": self.block_table,  # type: ignore[dict-item]
            "kv": self.kv,  # type: ignore[dict-item]
            "computed": self.num_computed,  # type: ignore[dict-item]
            "drafts": self.drafts,  # type: ignore[dict-item]
        }
        res: SimTensor = result  # type: ignore[assignment]
        step = _Step(self, seqs)
        with plain():
            logic = {key: t.logic.reshape(-1).numpy() for key, t in named.items()}
            reads, writes, rows = step.run(logic)
            # What the kernel read, in program order: if the device holds the same when it
            # runs, it computes the same (the step is a function of the cells it reads).
            seen = {key: logic[key][cells] for key, cells in reads.items()}
            for key, cells, values in writes:
                logic[key][cells] = values
            res.logic.copy_(torch.from_numpy(rows))
        accesses: list[tuple[torch.Tensor, np.ndarray | None, str]] = []
        for key in ("pool", "drafts", "computed", "table", "kv"):
            accesses.append((named[key], reads[key], "r"))
        for key in ("kv", "pool", "computed", "drafts"):
            written = [c for k, c, _ in writes if k == key]
            if written:
                accesses.append((named[key], np.concatenate(written), "w"))
        accesses.append((res, None, "w"))
        phys = {key: t.phys.reshape(-1) for key, t in named.items()}
        res_phys = res.phys

        def start() -> Any:
            with plain():
                arrays = {key: t.numpy() for key, t in phys.items()}
                if all(np.array_equal(arrays[k][reads[k]], seen[k]) for k in reads):
                    done, values = writes, rows
                else:
                    _, done, values = step.run(arrays)

            def end() -> None:
                with plain():
                    for key, cells, vals in done:
                        arrays[key][cells] = vals
                    res_phys.copy_(torch.from_numpy(values))

            return end

        new_tokens = sum(s.inputs + s.drafts for s in seqs)
        context = sum(s.start + s.inputs + s.drafts for s in seqs)
        cost = cuda.device.timing.forward(new_tokens, context)
        uids = tuple(s.uid for s in seqs)
        ends = np.array([s.start + s.inputs + s.drafts for s in seqs], dtype=np.int64)
        shape = (np.array([s.index for s in seqs], dtype=np.int64), ends)
        drafts = np.array([s.drafts for s in seqs], dtype=np.int64)
        cuda.launch(
            "forward",
            label,
            accesses,
            cost,
            start,
            batch=self.batches,
            uids=uids,
            shape=shape,
            drafts=drafts,
        )

    # -- the KV connector's loads ----------------------------------------------------------------

    def _start_load(self, load: Load) -> None:
        """External KV into its blocks on the transfer stream, which waits for nothing (a NIC's
        writes are unordered with the engine stream); its event says when it has landed."""
        dev = self.cuda.torch_device
        with torch.cuda.stream(self.transfer):
            with plain():
                host_cells = torch.from_numpy(load.cells.astype(np.int64))
                host_tokens = torch.from_numpy(load.tokens.astype(np.int32))
            cells = host_cells.pin_memory().to(dev, non_blocking=True)
            tokens = host_tokens.pin_memory().to(dev, non_blocking=True)
            self.kv.index_put_((cells,), tokens)
            landed = torch.cuda.Event()
            landed.record(self.transfer)
        self.loads.append((load.req_id, landed))

    def finished_loads(self, wait: bool) -> set[str]:
        """The loads whose event has fired (queried, so the host is ordered after them); with
        `wait`, the host first blocks on the oldest one (the engine would spin on it)."""
        if wait and self.loads:
            self.loads[0][1].synchronize()
        done = {req_id for req_id, event in self.loads if event.query()}
        self.loads = [(r, e) for r, e in self.loads if r not in done]
        return done

    # -- the output -----------------------------------------------------------------------------

    def output(self, launched: Launched) -> tuple[list[str], list[list[int]]]:
        """Wait for the output copy's event, then read the sampled ids from pinned memory
        (what the kernel wrote, as the copy saw it). Also keeps each request's proposed drafts
        for `take_draft_token_ids`."""
        launched.done.synchronize()
        assert launched.host is not None
        with plain():
            rows = launched.host.numpy().copy()
        k = self.k
        req_ids, sampled = [], []
        self.last_drafts = {}
        for s, row in zip(launched.seqs, rows, strict=True):
            req_ids.append(s.req_id)
            n = int(row[0])
            sampled.append([int(t) for t in row[1 : 1 + n]] if n > 0 else [])
            if k and n > 0:
                count = max(0, min(int(row[2 + k]), k))
                self.last_drafts[s.req_id] = [int(t) for t in row[3 + k : 3 + k + count]]
        launched.keep.clear()
        launched.host = None
        return req_ids, sampled


class _Step:
    """What one step's kernel computes, from the arrays it reads (flat views by name)."""

    def __init__(self, worker: StandInWorker, seqs: list[Seq]) -> None:
        self.seqs = seqs
        self.model = worker.model
        self.bs = worker.block_size
        self.length = worker.max_model_len
        self.width = worker.width
        self.k = worker.k
        self.dwidth = max(worker.k, 1)

    def run(
        self, a: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], list[tuple[str, np.ndarray, np.ndarray]], np.ndarray]:
        """(cells read by buffer, writes as (buffer, cells, values), result rows)."""
        bs, length, width, k, dwidth = self.bs, self.length, self.width, self.k, self.dwidth
        pool, table, kv, computed, drafts = (
            a["pool"],
            a["table"],
            a["kv"],
            a["computed"],
            a["drafts"],
        )
        n_kv = len(kv)
        reads: dict[str, list[np.ndarray]] = {key: [] for key in a}
        writes: list[tuple[str, np.ndarray, np.ndarray]] = []
        rows = np.full((len(self.seqs), 3 + 2 * k), -1, dtype=np.int32)
        # First every sequence's new KV is written (vLLM writes the layer's cache before its
        # attention), then each sequence attends over its context in the cache.
        planned = []
        after = kv.copy()
        for s in self.seqs:
            slot = s.index
            reads["computed"].append(np.array([slot]))
            c = int(computed[slot])
            end = c + s.inputs + s.drafts
            in_cells = slot * length + np.arange(c, c + s.inputs)
            reads["pool"].append(in_cells)
            draft_cells = slot * dwidth + np.arange(s.drafts)
            reads["drafts"].append(draft_cells)
            table_cells = slot * width + np.arange(-(-end // bs))
            reads["table"].append(table_cells)
            blocks = table[table_cells].astype(np.int64)
            positions = np.arange(end)
            kv_cells = np.mod(blocks[positions // bs] * bs + positions % bs, n_kv)
            reads["kv"].append(kv_cells)  # attention reads the new positions too
            query = np.concatenate([pool[in_cells], drafts[draft_cells]]).astype(np.int64)
            writes.append(("kv", kv_cells[c:], query))
            after[kv_cells[c:]] = query
            planned.append((c, end, kv_cells, query))
        for i, (s, (c, end, kv_cells, query)) in enumerate(zip(self.seqs, planned, strict=True)):
            slot, row_at = s.index, s.index * length
            if not s.samples:
                writes.append(("computed", np.array([slot]), np.array([end])))
                rows[i, 0] = 0
                continue
            full = after[kv_cells].astype(DTYPE)
            base = c + s.inputs
            model = self.model
            targets = [model.next_token_of(full[: base + j].tobytes()) for j in range(s.drafts + 1)]
            accepted = 0
            while accepted < s.drafts and int(query[s.inputs + accepted]) == targets[accepted]:
                accepted += 1
            emitted = np.asarray(targets[: accepted + 1], dtype=np.int64)
            at = c + s.inputs
            writes.append(("pool", row_at + at + np.arange(len(emitted)), emitted))
            writes.append(("computed", np.array([slot]), np.array([at + accepted])))
            rows[i, 0] = len(emitted)
            rows[i, 1 : 1 + len(emitted)] = emitted
            if k:
                reads["pool"].append(row_at + np.arange(at))
                known = np.concatenate([pool[row_at : row_at + at], emitted]).astype(np.int64)
                proposal = _ngram(known, k)
                rows[i, 2 + k] = len(proposal)
                rows[i, 3 + k : 3 + k + len(proposal)] = proposal
                padded = np.full(k, known[-1], dtype=np.int64)
                padded[: len(proposal)] = proposal
                writes.append(("drafts", slot * dwidth + np.arange(k), padded))
        cat = {
            key: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for key, v in reads.items()
        }
        return cat, writes, rows


def _ngram(history: np.ndarray, k: int) -> np.ndarray:
    """Up to `k` tokens that followed the latest earlier occurrence of the history's longest
    suffix of LOOKUP_MAX..LOOKUP_MIN tokens (vLLM's ngram drafter's rule); none if no match."""
    total = len(history)
    for n in range(min(LOOKUP_MAX, total - 1), LOOKUP_MIN - 1, -1):
        # windows starting at 0 .. total-n-1: every occurrence but the suffix itself
        windows = np.lib.stride_tricks.sliding_window_view(history[: total - 1], n)
        hits = np.flatnonzero((windows == history[total - n :]).all(axis=1))
        if len(hits):
            begin = int(hits[-1])
            return history[begin + n : begin + n + k].astype(np.int64)
    return np.zeros(0, dtype=np.int64)
