"""The stand-in for mini-sglang's `Engine`: the same attributes its scheduler reads, and a forward
that runs the simulator's toy model over the stand-in tensors instead of a real model.

What the scheduler gets is what upstream's engine gives it: an engine stream (current from now on,
as upstream sets it), a `page_table` of `max_running_req + 1` rows (the last for the dummy
request, pointed at a dummy page), the page count, `max_seq_len`, an attention backend whose
`prepare_metadata` stages per-batch metadata through pinned memory on the current stream, a graph
runner that never captures (a CUDA graph needs a real GPU), upstream's own `Sampler` for
`prepare`, and `forward_batch`. The forward is one kernel on the engine stream: it reads the
gathered input ids, positions, KV locations, the metadata, the page table rows and the KV cells of
each request's context, writes the new KV cells, and writes one sampled token per request into
`next_tokens_gpu`. Then, as upstream does: `complete_one()` for every request, a non-blocking copy
of the samples to pinned host memory, and `copy_done` recorded on the engine stream.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from overlapcheck.adapters.minisgl.checkout import current_features
from overlapcheck.backends.sim.toy_model import DTYPE, ToyModel
from overlapcheck.backends.torchsim.dispatch import plain
from overlapcheck.backends.torchsim.session import FREE_BYTES, SimulatedCuda
from overlapcheck.backends.torchsim.tensor import SimTensor
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.footprints import ranges
from overlapcheck.core.trace import PAGE_TABLE, Launch, Op


class StandInMetadata:
    """Per-batch attention metadata: query/key lengths through pinned memory, on the device."""

    def __init__(self, cu_seqlens_q: torch.Tensor, seq_lens: torch.Tensor) -> None:
        self.cu_seqlens_q = cu_seqlens_q
        self.seq_lens = seq_lens

    def get_last_indices(self, bs: int) -> torch.Tensor:
        return self.cu_seqlens_q[1 : 1 + bs] - 1


class StandInAttention:
    """Prepares metadata as a paged-attention backend would (host lists -> pinned -> H2D on the
    current stream). With CUDA graphs, the capture gets fixed metadata buffers of the largest
    captured size, and a replay first copies the batch's metadata into them on the engine stream,
    as upstream's backends do. `holds_inputs`: the capture holds the batch's input ids, KV
    locations and positions too, as upstream's backends did before 1961602 moved them into the
    graph runner's `GraphCaptureBuffer`."""

    def __init__(
        self,
        device: torch.device,
        holds_inputs: bool = False,
        name: Callable[[torch.Tensor, str], None] | None = None,
    ) -> None:
        self.device = device
        self.capture: StandInMetadata | None = None
        self.holds_inputs = holds_inputs
        self.name = name  # names the capture's buffers in findings
        self.inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def prepare_metadata(self, batch: Any) -> None:
        reqs = batch.padded_reqs
        if getattr(batch, "positions", None) is None:
            # (before 1961602 the scheduler left positions to the attention backend, which
            # staged them through pinned memory on the current stream: so does the stand-in)
            batch.positions = _positions(reqs, self.device)
        cu = [0]
        for req in reqs:
            cu.append(cu[-1] + req.extend_len)
        host_q = torch.tensor(cu, dtype=torch.int32, pin_memory=True)
        host_k = torch.tensor([r.device_len for r in reqs], dtype=torch.int32, pin_memory=True)
        batch.attn_metadata = StandInMetadata(
            host_q.to(self.device, non_blocking=True), host_k.to(self.device, non_blocking=True)
        )

    def init_capture_graph(self, max_seq_len: int, bs_list: list[int]) -> None:
        most = max(bs_list)
        self.capture = StandInMetadata(
            torch.zeros(most + 1, dtype=torch.int32, device=self.device),
            torch.zeros(most, dtype=torch.int32, device=self.device),
        )
        if self.holds_inputs:  # (input ids, KV locations, positions: zeros, as upstream's)
            made = []
            for what in ("input_ids", "out_loc", "positions"):
                made.append(torch.zeros(most, dtype=torch.int32, device=self.device))
                if self.name is not None:
                    self.name(made[-1], f"capture.{what}")
            self.inputs = (made[0], made[1], made[2])

    def prepare_for_capture(self, batch: Any) -> None:
        assert self.capture is not None
        bs = batch.padded_size
        batch.attn_metadata = StandInMetadata(
            self.capture.cu_seqlens_q[: bs + 1], self.capture.seq_lens[:bs]
        )
        if self.inputs is not None:
            batch.input_ids, batch.out_loc, batch.positions = (t[:bs] for t in self.inputs)

    def prepare_for_replay(self, batch: Any) -> None:
        assert self.capture is not None
        bs = batch.padded_size
        if self.inputs is not None:
            given_now = (batch.input_ids, batch.out_loc, batch.positions)
            for held, given in zip(self.inputs, given_now, strict=True):
                held[:bs].copy_(given)
        self.capture.cu_seqlens_q[: bs + 1].copy_(batch.attn_metadata.cu_seqlens_q)
        self.capture.seq_lens[:bs].copy_(batch.attn_metadata.seq_lens)


def _positions(reqs: list[Any], device: torch.device) -> torch.Tensor:
    """Each request's new positions, `cached_len` to `device_len`, one after another."""
    host = torch.empty(sum(r.extend_len for r in reqs), dtype=torch.int32, pin_memory=True)
    offset = 0
    for req in reqs:
        torch.arange(req.cached_len, req.device_len, out=host[offset : offset + req.extend_len])
        offset += req.extend_len
    return host.to(device, non_blocking=True)


class NoGraphs:
    """mini-sglang's graph runner with graphs disabled: no padding, never a replay."""

    max_graph_bs = 0

    def can_use_cuda_graph(self, batch: Any) -> bool:
        return False

    def pad_batch(self, batch: Any) -> int:
        batch.padded_reqs = batch.reqs
        return 0  # the padding added (older schedulers pad `out_loc` by it)

    def destroy_cuda_graphs(self) -> None:
        return None


class EngineParts:
    """What a stand-in engine is built from (one per run; with no model: the GPU runner's)."""

    def __init__(
        self, config: SchedulerConfig, cuda: EngineCuda, model: ToyModel | None, upstream: Any
    ) -> None:
        self.config = config
        self.cuda = cuda
        self.model = model
        self.upstream = upstream  # mini-sglang's modules by name (checkout.load)
        self.batches = 0
        self.replaying: Any = None  # the batch whose graph is being replayed
        # Each launched batch's id in the trace, by the Batch object (alive until processed).
        self.batch_ids: dict[int, tuple[int, str]] = {}


def make_engine_class(parts: EngineParts) -> Callable[[Any], Any]:
    """A class with `Engine(config)`'s signature, bound to one run's parts."""

    class StandInEngine:
        def __init__(self, config: Any) -> None:
            cfg = parts.config
            up = parts.upstream
            self.device = parts.cuda.torch_device
            self.stream = torch.cuda.Stream()
            torch.cuda.set_stream(self.stream)
            self.dtype = torch.int32
            self.tp_cpu_group = None
            self.num_pages = cfg.num_pages
            self.max_seq_len = cfg.max_seq_len
            num_tokens = cfg.num_pages * cfg.page_size
            self.kv = torch.full(
                (num_tokens + cfg.page_size,), -1, dtype=torch.int32, device=self.device
            )
            parts.cuda.name(self.kv, "kv")
            self.page_table = torch.zeros(
                (config.max_running_req + 1, cfg.max_seq_len),
                dtype=torch.int32,
                device=self.device,
            )
            parts.cuda.name(self.page_table, "page_table")
            holds = not current_features().capture_buffer
            self.attn_backend = StandInAttention(self.device, holds, parts.cuda.name)
            self.ctx = construct(
                up["minisgl.core"].Context,
                page_size=cfg.page_size,
                attn_backend=self.attn_backend,
                kv_cache=self.kv,
                page_table=self.page_table,
            )
            self.ctx.page_table, self.ctx.attn_backend = self.page_table, self.attn_backend
            up["minisgl.core"].set_global_ctx(self.ctx)
            self.sampler = construct(
                up["minisgl.engine.sample"].Sampler, device=self.device, vocab_size=cfg.vocab_size
            )
            self.dummy_req = up["minisgl.core"].Req(
                input_ids=torch.tensor([0], dtype=torch.int32, device="cpu"),
                table_idx=config.max_running_req,
                cached_len=0,
                output_len=1,
                uid=-1,
                sampling_params=None,
                cache_handle=None,
            )
            self.page_table[self.dummy_req.table_idx].fill_(num_tokens)
            self.dummy_page = num_tokens  # (what a padded batch's rows pointed at before 1961602)
            # upstream's sizes rule: the config's list when given (empty: graphs off)
            sizes = list(config.cuda_graph_bs or [])
            self.graph_runner: Any = make_graph_runner(parts, self, sizes) if sizes else NoGraphs()
            # Upstream's engine ends its set-up by measuring free memory, which synchronizes the
            # device (`_sync_get_memory`): nothing it issued is still running when it returns.
            torch.cuda.synchronize(self.device)

        def forward_batch(self, batch: Any, args: Any) -> Any:
            assert torch.cuda.current_stream() == self.stream
            parts.batches += 1
            label = f"{'P' if batch.is_prefill else 'D'}{parts.batches}"
            parts.batch_ids[id(batch)] = (parts.batches, label)
            if self.graph_runner.can_use_cuda_graph(batch):
                # upstream's replay: the batch into the captured buffers, then the graph; the
                # sampler reads the logits of the batch's own rows
                parts.replaying = batch
                logits = self.graph_runner.replay(batch)
                parts.replaying = None
                tokens = logits.argmax(dim=-1).to(torch.int32)
            else:
                tokens = torch.empty(batch.size, dtype=torch.int32, device=self.device)
                assert isinstance(tokens, SimTensor)
                _launch_forward(parts, self, batch, tokens, parts.batches)
            for req in batch.reqs:
                req.complete_one()
            next_tokens_cpu = tokens.to("cpu", non_blocking=True)
            copy_done = torch.cuda.Event()
            copy_done.record(self.stream)
            return parts.upstream["minisgl.engine"].ForwardOutput(
                tokens, next_tokens_cpu, copy_done
            )

        def shutdown(self) -> None:
            return None

    return StandInEngine


def construct(upstream_class: Any, **offered: Any) -> Any:
    """`upstream_class(...)` with those of `offered` its signature takes, by name: the
    parameters of mini-sglang's `Context` and `Sampler` changed over its history (an older
    `Context` also takes `attn_backend`, `kv_cache` and `page_table`, set on it after here; an
    older `Sampler` no `vocab_size`)."""
    accepted = inspect.signature(upstream_class).parameters
    return upstream_class(**{k: v for k, v in offered.items() if k in accepted})


def _launch_forward(
    parts: EngineParts, engine: Any, batch: Any, tokens: SimTensor, batch_id: int
) -> None:
    """The model as one kernel on the current (engine) stream, over what the batch names."""
    label = f"{'P' if batch.is_prefill else 'D'}{batch_id}"
    _launch_model(
        parts,
        engine,
        Inputs(
            list(batch.reqs), batch.input_ids, batch.positions, batch.out_loc, batch.attn_metadata
        ),
        _Out(tokens, lambda values: torch.from_numpy(values)),
        batch.is_prefill,
        label,
        batch_id,
    )


class Inputs(NamedTuple):
    """What a forward kernel reads: its sequences (a padded batch's dummy rows included) and
    the tensors holding their input ids, positions, KV locations and attention metadata."""

    reqs: list[Any]
    input_ids: Any
    positions: Any
    out_loc: Any
    meta: Any


class _Out(NamedTuple):
    """Where a forward writes its samples, and the values it writes for the sampled tokens."""

    tensor: Any
    values: Callable[[np.ndarray], torch.Tensor]


def _launch_model(
    parts: EngineParts,
    engine: Any,
    given: Inputs,
    out: _Out,
    prefill: bool,
    label: str,
    batch_id: int,
    real: int | None = None,
) -> None:
    """The kernel over `given`; only its first `real` sequences are the batch's own (the rest pad
    it to a captured size: their page-table reads are a separate access, so that the checks
    that read a forward's rows from its page-table read see the batch's own)."""
    cuda, model = parts.cuda, parts.model
    assert isinstance(cuda, SimulatedCuda) and model is not None  # (the GPU's is real kernels)
    reqs = given.reqs
    real = len(reqs) if real is None else real
    width = engine.page_table.shape[1]
    rows = [int(r.table_idx) for r in reqs]
    ends = [int(r.device_len) for r in reqs]
    begins = [int(r.cached_len) for r in reqs]
    table: SimTensor = engine.page_table
    kv: SimTensor = engine.kv
    inputs, out_loc, meta = given.input_ids, given.out_loc, given.meta
    with plain():
        row_cells = [
            np.arange(row * width, row * width + end, dtype=np.int64)
            for row, end in zip(rows, ends, strict=True)
        ]
        table_cells = np.concatenate(row_cells)
        kv_of_table = _gather(table.logic.reshape(-1), table_cells, rows, ends, width)
        kv_cells = np.mod(kv_of_table, kv.numel())
        written = np.mod(out_loc.logic.numpy().astype(np.int64), kv.numel())
    own_table = table_cells if real == len(reqs) else np.concatenate(row_cells[:real])
    accesses: list[tuple[torch.Tensor, np.ndarray | None, str]] = [
        (inputs, None, "r"),
        (given.positions, None, "r"),
        (out_loc, None, "r"),
        (meta.cu_seqlens_q, None, "r"),
        (meta.seq_lens, None, "r"),
        (table, own_table, "r"),
        (kv, kv_cells, "r"),
        (kv, written, "w"),
        (out.tensor, None, "w"),
    ]
    if real < len(reqs):  # the padding's rows
        accesses.insert(6, (table, np.concatenate(row_cells[real:]), "r"))
    timing = cuda.device.timing
    new_tokens = sum(e - b for b, e in zip(begins, ends, strict=True))
    cost = timing.forward(new_tokens, sum(ends))

    cached = _Cached(rows, width, begins, ends)

    def compute(
        pool: torch.Tensor, table_values: torch.Tensor, ids: torch.Tensor, loc: torch.Tensor
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Next tokens from what the kernel reads: each request's context is its cached KV
        through its page-table row, then its new input ids."""
        kv_all = pool.numpy()
        ids_np = ids.numpy()
        contexts = cached.contexts(kv_all, table_values.reshape(-1).numpy(), ids_np)
        values = np.fromiter(map(model.next_token_of, contexts), DTYPE, len(contexts))
        return values, np.mod(loc.numpy().astype(np.int64), len(kv_all)), ids_np.astype(DTYPE)

    # program order: the logical copies get the same computation at issue
    with plain():
        logical_tokens, logical_loc, logical_ids = compute(
            kv.logic, table.logic, inputs.logic, out_loc.logic
        )
        _put(kv.logic, logical_loc, logical_ids)
        out.tensor.logic.copy_(out.values(logical_tokens))
    # what the kernel runs on: the physical copies, not the program's tensors (it drops them when
    # it likes; the allocator decides what happens to their memory)
    kv_phys, table_phys, inputs_phys, loc_phys = kv.phys, table.phys, inputs.phys, out_loc.phys
    out_phys = out.tensor.phys

    def start() -> Callable[[], None]:
        with plain():
            values, loc, ids = compute(kv_phys, table_phys, inputs_phys, loc_phys)

        def end() -> None:
            with plain():
                _put(kv_phys, loc, ids)
                out_phys.copy_(out.values(values))

        return end

    uids = tuple(int(r.uid) for r in reqs[:real])
    kind = "forward"
    trace = cuda.device.trace
    seq = len(trace.ops)  # the forward's op, next
    cuda.launch(kind, label, accesses, cost, start, batch=batch_id, uids=uids)
    if width == parts.config.max_seq_len:
        _give_shape(trace.ops[seq], own_table, rows[:real], ends[:real], width)
    if trace.launches is not None:  # ranks compare what they launch (core/ranks.py)
        positions = tuple(zip(begins[:real], ends[:real], strict=True))
        trace.launches.append(Launch(seq, "prefill" if prefill else "decode", uids, positions))


def _gather(
    flat: torch.Tensor, cells: np.ndarray, rows: list[int], ends: list[int], width: int
) -> np.ndarray:
    """`flat[cells]` as int64 (`cells`: each row's first `end` cells of a table `width` wide),
    through numpy's view where every cell is inside the table (torch's indexing costs several
    times more; an index outside it is torch's to refuse, in its own words)."""
    parts = [(row * width, row * width + end - 1) for row, end in zip(rows, ends, strict=True)]
    parts = [p for p in parts if p[1] >= p[0]]
    size = flat.shape[0]
    if flat.dim() == 1 and all(-size <= lo and hi < size for lo, hi in parts):
        values: np.ndarray = flat.numpy()[cells].astype(np.int64)
    else:
        values = flat[torch.from_numpy(cells)].numpy().astype(np.int64)
    return values


def _put(target: torch.Tensor, cells: np.ndarray, values: np.ndarray) -> None:
    """`target[cells] = values` for cells inside `target` (taken modulo its size), through
    numpy's view of it: torch's `index_put_` costs several times more for a few cells. Values
    it would refuse (another length or dtype) go to torch, to be refused in its words."""
    if target.dim() == 1 and len(cells) == len(values):
        view = target.numpy()
        if view.dtype == values.dtype:
            view[cells] = values  # (a repeated cell takes its last value, as torch's on the CPU)
            return
    target[torch.from_numpy(cells)] = torch.from_numpy(values)


def _give_shape(
    op: Op, table_cells: np.ndarray, rows: list[int], ends: list[int], width: int
) -> None:
    """The forward's `Op.shape`, where it is what `forward_shape` derives from the op's first
    page-table read: that read is this kernel's own rows (`table_cells`), each sequence's part
    one to `width` cells from column 0 of its row. The checks then read it at every forward
    without deriving it."""
    if op.shape is not None or not rows or not all(0 < end <= width for end in ends):
        return
    first = next((a for a in op.accesses if a.buffer == PAGE_TABLE and a.mode == "r"), None)
    if first is not None and first.cells is table_cells:
        op.shape = (np.array(rows, dtype=np.int64), np.array(ends, dtype=np.int64))


class _Cached:
    """Where a forward's sequences' cached KV is named: `table[row * width + k]` for k below
    `begin`, each sequence's after the last's. A forward kernel reads its contexts twice (the
    logical copies at issue, the physical ones when it runs): the cells are found once."""

    def __init__(self, rows: list[int], width: int, begins: list[int], ends: list[int]) -> None:
        self.starts = [row * width for row in rows]
        self.begins, self.ends = begins, ends
        # (one gather for every sequence where each row's slice is a plain one: no negative
        # bound, which a slice reads from the end)
        plain_slices = all(s >= 0 and b >= 0 for s, b in zip(self.starts, begins, strict=True))
        self.index: np.ndarray | None = None
        self.top = 0  # the table cells the gather needs
        if plain_slices:
            lengths = np.array(begins, dtype=np.int64)
            self.index = ranges(np.array(self.starts, dtype=np.int64), lengths)
            self.top = max((s + b for s, b in zip(self.starts, begins, strict=True)), default=0)

    def contexts(self, kv: np.ndarray, table: np.ndarray, ids: np.ndarray) -> list[bytes]:
        """Each sequence's context as DTYPE bytes: the KV values its page-table row names
        (modulo the pool's size), then its new input ids (those the batch's ids hold)."""
        starts, begins, ends = self.starts, self.begins, self.ends
        parts: list[np.ndarray] = []
        offset = 0
        if self.index is not None and self.top <= len(table):
            values = kv[np.mod(table[self.index].astype(np.int64), len(kv))]
            at = 0
            for begin, end in zip(begins, ends, strict=True):
                parts.append(values[at : at + begin])
                at += begin
                parts.append(ids[offset : offset + end - begin])
                offset += end - begin
        else:  # (each row's slice as it is, clipped to the table as a slice is)
            for start, begin, end in zip(starts, begins, ends, strict=True):
                cells = np.mod(table[start : start + begin].astype(np.int64), len(kv))
                parts.append(kv[cells])
                parts.append(ids[offset : offset + end - begin])
                offset += end - begin
        if not parts:
            return []
        # one conversion for all: each context's DTYPE values are its pieces', promoted as
        # the pair of them would be (every sequence's pieces have the same two dtypes)
        data = np.concatenate(parts).astype(DTYPE)
        raw, size = data.tobytes(), data.itemsize
        out: list[bytes] = []
        at = 0
        for k in range(0, len(parts), 2):
            n = (len(parts[k]) + len(parts[k + 1])) * size
            out.append(raw[at : at + n])
            at += n
        return out


class StandInGraph:
    """A captured decode graph of `bs` sequences: its replay is one kernel whose footprint is the
    captured one (the capture buffers' first `bs` rows, the metadata buffers, the logits), plus
    the page-table and KV cells of the sequences being replayed (read through the metadata, as
    a paged attention kernel does). It writes each sequence's sample as a one-hot logits row."""

    def __init__(self, parts: EngineParts, engine: Any, batch: Any, logits: Any) -> None:
        self.parts = parts
        self.engine = engine
        self.bs = batch.padded_size
        self.captured = Inputs(
            [], batch.input_ids, batch.positions, batch.out_loc, batch.attn_metadata
        )
        self.logits = logits

    def replay(self) -> None:
        parts, batch = self.parts, self.parts.replaying
        assert batch is not None and batch.padded_size == self.bs
        vocab = int(self.logits.shape[-1])

        def one_hot(values: np.ndarray) -> torch.Tensor:
            rows = torch.zeros(len(values), vocab, dtype=torch.float32)
            rows[torch.arange(len(values)), torch.from_numpy(values.astype(np.int64) % vocab)] = 1
            return rows

        batch_id, label = parts.batch_ids[id(batch)]
        _launch_model(
            parts,
            self.engine,
            self.captured._replace(reqs=list(batch.padded_reqs)),
            _Out(self.logits, one_hot),
            False,
            f"{label} (graph {self.bs})",
            batch_id,
            real=batch.size,
        )


def make_graph_runner(parts: EngineParts, engine: Any, sizes: list[int]) -> Any:
    """mini-sglang's own `GraphRunner` (its sizes, `pad_batch`, `can_use_cuda_graph`, `replay`),
    capturing stand-in graphs: the same capture buffers and per-size batches as upstream's
    `_capture_graphs`, without running a model (there is none to capture). Before 1961602 the
    attention backend's capture held the batch's inputs and the runner only its logits (an
    `empty` tensor), and `_capture_graphs` returned the graphs rather than keeping them."""
    up = parts.upstream
    graph_module = up["minisgl.engine.graph"]
    base = graph_module.GraphRunner
    buffered = current_features().capture_buffer

    class StandInGraphRunner(base):  # type: ignore[misc, valid-type]
        def _capture_graphs(
            self, max_seq_len: int, vocab_size: int, model: Any
        ) -> dict[int, StandInGraph]:
            self.graph_map: dict[int, StandInGraph] = {}
            if self.max_graph_bs == 0:
                return self.graph_map
            if not buffered:
                shape = (self.max_graph_bs, vocab_size)
                self.logits = torch.empty(shape, dtype=torch.float32, device=self.device)
            self.attn_backend.init_capture_graph(
                max_seq_len=max_seq_len, bs_list=self.graph_bs_list
            )
            if buffered:
                self.buffer = graph_module.GraphCaptureBuffer.init(
                    self.max_graph_bs, vocab_size, self.device
                )
            for bs in sorted(self.graph_bs_list, reverse=True):
                batch = up["minisgl.core"].Batch(reqs=[self.dummy_req] * bs, phase="decode")
                batch.padded_reqs = batch.reqs
                self.attn_backend.prepare_for_capture(batch)
                logits = self.buffer.logits if buffered else self.logits
                if buffered:
                    self.buffer.set_batch(batch)
                self.graph_map[bs] = StandInGraph(parts, engine, batch, logits[:bs])
            return self.graph_map

    return StandInGraphRunner(
        stream=engine.stream,
        device=engine.device,
        model=None,
        attn_backend=engine.attn_backend,
        cuda_graph_bs=sizes,
        cuda_graph_max_bs=None,
        free_memory=FREE_BYTES,
        max_seq_len=engine.max_seq_len,
        vocab_size=parts.config.vocab_size,
        dummy_req=engine.dummy_req,
    )


class EngineCuda(Protocol):
    """What the stand-in engine's set-up asks of the CUDA it runs on: the device, and contract
    names for its buffers. `SimulatedCuda` here; the real one on a GPU (`cuda.py`)."""

    @property
    def torch_device(self) -> torch.device: ...

    def name(self, tensor: torch.Tensor, name: str) -> None: ...
