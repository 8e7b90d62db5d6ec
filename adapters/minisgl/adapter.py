"""mini-sglang's own `Scheduler` as a scheduler under test.

The adapter subclasses it, as mini-sglang's offline `LLM` does, only to supply its offline message
I/O (`offline_receive_msg` / `offline_send_result`, mapped onto the harness's source and sink) and
to mark its host phases for the timeline (each override calls upstream's method unchanged). One
`step()` is one call of upstream's `overlap_loop` (or `normal_loop`), inside the simulated CUDA.

As a front end would, the adapter answers requests that `core.rules` rejects with a `RejectMsg`
and never hands them over (mini-sglang drops an over-long prompt silently and would wait forever
for pages it can never have).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from overlapcheck.adapters.base import Loaded, UpstreamScheduler
from overlapcheck.adapters.minisgl.books import LastList, read_books
from overlapcheck.adapters.minisgl.checkout import RANK
from overlapcheck.adapters.minisgl.checkout import current_features as _checkout_features
from overlapcheck.adapters.minisgl.checkout import load as load_checkout
from overlapcheck.adapters.minisgl.engine import EngineParts, construct, make_engine_class
from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.backends.torchsim.dispatch import plain
from overlapcheck.backends.torchsim.session import SimulatedCuda
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.errors import UserError
from overlapcheck.core.messages import AbortMsg, UserMsg
from overlapcheck.core.protocol import Books, MessageSink, MessageSource
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.core.trace import HOST


class _Idle(Exception):
    """The scheduler asked to block with nothing more to come: the run is over."""


class _Tokenizer:
    def __init__(self, eos: int) -> None:
        self.eos_token_id = eos


def fast_compare_key(x: torch.Tensor, y: torch.Tensor) -> int:
    """mini-sglang's C++ radix kernel: the length of the common prefix of two 1-D CPU tensors."""
    with plain():
        n = min(len(x), len(y))
        differ = (x[:n] != y[:n]).nonzero()
        return int(differ[0, 0]) if len(differ) else n


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    """`owner.name` is `value` inside, what it was after."""
    before = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, before)


class _Clock:
    """`time.monotonic_ns` for the radix cache's LRU stamps: simulated time, ties in call order."""

    def __init__(self, device: SimDevice) -> None:
        self.device = device
        self.calls = 0

    def monotonic_ns(self) -> int:
        self.calls += 1
        return int(self.device.now() * 1e9) * 1_000_000 + self.calls


def upstream_config(
    up: Loaded, cfg: SchedulerConfig, rank: int, ranks: int, graphs: Sequence[int]
) -> Any:
    """mini-sglang's own SchedulerConfig for ours: the toy model, offline, rank `rank` of `ranks`,
    the pools' sizes, the captured batch sizes `graphs` (none: no CUDA graphs). Raises TypeError
    for an API it does not know."""
    return up["minisgl.scheduler"].SchedulerConfig(
        model_path="overlapcheck-toy-model",
        tp_info=up["minisgl.distributed"].DistributedInfo(rank, ranks),
        dtype=torch.int32,
        max_running_req=cfg.num_slots,
        page_size=cfg.page_size,
        max_extend_tokens=cfg.max_extend_tokens,
        cache_type=cfg.cache,
        offline_mode=True,
        cuda_graph_bs=list(graphs),
        max_seq_len_override=cfg.max_seq_len,
        num_page_override=cfg.num_pages,
    )


@contextlib.contextmanager
def building(up: Loaded, rank: int, ranks: int, engine: Any, eos: int) -> Iterator[None]:
    """While mini-sglang's `Scheduler(config)` is built (here, and on the GPU by
    `adapters/minisgl/cuda.py`): rank `rank` of `ranks`, `engine` as its `Engine` class, and a
    tokenizer that knows the EOS token (there is no model to load one from)."""
    scheduler_module = __import__("minisgl.scheduler.scheduler", fromlist=["Scheduler"])
    core: Any = up["minisgl.core"]
    # One Scheduler per run (per rank): upstream sets its context and TP info once per
    # process. Both are read only while the Scheduler is built (the radix cache's page size,
    # the logger's rank), so the ranks of one run can be built one after another here.
    core._GLOBAL_CTX = None
    info: Any = __import__("minisgl.distributed.info", fromlist=["set_tp_info"])
    info._TP_INFO = None
    info.set_tp_info(rank=rank, size=ranks)
    with (
        patched(up["minisgl.engine"], "Engine", engine),
        _tokenizer_patched(scheduler_module, _Tokenizer(eos)),
    ):
        yield


def _tokenizer_patched(
    module: Any, tokenizer: _Tokenizer
) -> contextlib.AbstractContextManager[None]:
    """The scheduler's module loads its tokenizer with `load_tokenizer(path)` (since cd46915) or,
    before, `AutoTokenizer.from_pretrained(path)`: either gives `tokenizer`."""
    if hasattr(module, "load_tokenizer"):
        return patched(module, "load_tokenizer", lambda path: tokenizer)
    loader = type("AutoTokenizer", (), {"from_pretrained": staticmethod(lambda path: tokenizer)})
    return patched(module, "AutoTokenizer", loader)


class MiniSglScheduler(UpstreamScheduler):
    """Drives mini-sglang's Scheduler one loop iteration per `step()`."""

    device: SimDevice

    def __init__(
        self, config: SchedulerConfig, device: SimDevice, source: MessageSource, sink: MessageSink
    ) -> None:
        super().__init__(config, device, source, sink, load_checkout())
        self.up = self.loaded
        self.cuda = SimulatedCuda(device, ("engine", "scheduler"))
        self.parts = EngineParts(config, self.cuda, device.model, self.up)
        self.data: Any = None
        self.clock = _Clock(device)
        self.normal_started = False
        self.can = _checkout_features()
        self._free_list = LastList()  # (the books' free list, made from the last one's)
        with self._block(), self._building():
            self.sched = self._make()
            pool = getattr(self.sched, "token_pool", None)  # (once on its table manager only)
            self.cuda.name(
                pool if pool is not None else self.sched.table_manager.token_pool, "token_pool"
            )
        self._note_frees(self.sched.table_manager)

    def _note_frees(self, table: Any) -> None:
        """Each row upstream gives back is told to the device (`Device.released`), which notes
        upstream's line that freed it: where a `slot-not-in-flight` finding's row was freed."""
        free, device = table.free, self.device

        def noted(table_idx: int) -> None:
            free(table_idx)
            device.released("slot", (int(table_idx),))

        table.free = noted

    # -- construction -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _block(self) -> Iterator[None]:
        kernel = __import__("minisgl.kernel", fromlist=["fast_compare_key"])
        radix = self.up["minisgl.kvcache.radix_cache"]
        rank = RANK.set(self.config.rank)  # whose requests it makes and hashes (checkout.py)
        try:
            with (
                self.cuda,
                torch.inference_mode(),
                patched(kernel, "fast_compare_key", fast_compare_key),
                patched(radix, "time", self.clock),
            ):
                yield
        finally:
            RANK.reset(rank)

    def _building(self) -> contextlib.AbstractContextManager[None]:
        cfg = self.config
        engine = make_engine_class(self.parts)
        return building(self.up, cfg.rank, cfg.num_ranks, engine, cfg.eos_token_id)

    def _make(self) -> Any:
        up = self.up
        cfg = self.config
        adapter = self
        base = up["minisgl.scheduler"].Scheduler

        class Checked(base):  # type: ignore[misc, valid-type]
            def offline_receive_msg(self, blocking: bool = False) -> list[Any]:
                return adapter._receive(self, blocking)

            def offline_send_result(self, reply: Any) -> None:
                adapter._send(reply)

            def _schedule_next_batch(self) -> Any:
                pending = len(self.prefill_manager.pending_list)
                with adapter.device.span(
                    "schedule", pending + len(self.decode_manager.running_reqs)
                ):
                    return super()._schedule_next_batch()

            # (the signatures are upstream's, whatever its version: the batch in flight too,
            # `_process_last_data(last_data, ongoing_data)`, before 1961602)
            def _forward(self, forward_input: Any, *more: Any) -> Any:
                with adapter.device.span("launch", len(forward_input.batch.reqs)):
                    return super()._forward(forward_input, *more)

            def _process_last_data(self, last_data: Any, *more: Any) -> None:
                if last_data is None:
                    super()._process_last_data(last_data, *more)
                    return
                batch = last_data[0].batch
                with adapter.device.span("process", len(batch.reqs)):
                    adapter._read_output(batch)
                    super()._process_last_data(last_data, *more)

        try:
            config = upstream_config(up, cfg, cfg.rank, cfg.num_ranks, cfg.cuda_graph_bs)
            return Checked(config)
        except TypeError as err:
            raise UserError(f"mini-sglang checkout is incompatible: {err}") from None

    # -- the protocol -------------------------------------------------------------------------

    def step(self) -> bool:
        try:
            with self._block():
                if self.config.loop == "overlap":
                    self.data = self.sched.overlap_loop(self.data)
                else:
                    self._normal_step()
        except _Idle:
            self.cuda.drain()
            return False
        return True

    def _normal_step(self) -> None:
        """As upstream's `run_forever` runs the normal loop: on the engine stream, which first
        waits for the scheduler stream once."""
        sched = self.sched
        with sched.engine_stream_ctx:
            if not self.normal_started:
                sched.engine.stream.wait_stream(sched.stream)
                self.normal_started = True
            sched.normal_loop()

    def _read_output(self, batch: Any) -> None:
        """Mark the host's read of a batch's results (the harness's lifecycle anchors and the
        timeline read it); the reads themselves are traced as host reads of the pinned buffer."""
        found = self.parts.batch_ids.pop(id(batch), None)
        if found is None:
            return
        batch_id, label = found
        now = self.device.now()
        uids = tuple(int(r.uid) for r in batch.reqs)
        self.device.recorder.op(
            HOST,
            "read_output",
            now,
            label=f"read {label}",
            batch=batch_id,
            uids=uids,
            start=now,
            end=now,
        )

    def vocabulary(self) -> Mapping[str, str]:
        """mini-sglang's words (`HasVocabulary`): a slot is a row of its table, `table_idx`."""
        return {"slot": "table_idx"}

    def books(self) -> Books:
        defers = self.can.defers_frees
        return read_books(self.sched, self.data, self.config, self.up, defers, self._free_list)

    # -- offline I/O --------------------------------------------------------------------------

    def _receive(self, sched: Any, blocking: bool) -> list[Any]:
        msgs = self._convert(self.source.poll(self.device.now()))
        if blocking and not msgs:
            # Idle: upstream blocks on its queue. Sleep until the next arrival and return what
            # came, maybe nothing (a message due at a later iteration comes in a later step).
            if not self.wait_for_arrival(on_idle=sched.run_when_idle):
                raise _Idle
            msgs = self._convert(self.source.poll(self.device.now()))
        return msgs

    def _convert(self, msgs: list[UserMsg | AbortMsg]) -> list[Any]:
        up = self.up
        out: list[Any] = []
        for msg in msgs:
            if isinstance(msg, AbortMsg):
                if not self.can.cancels:  # (a search draws none for it: `fit_scenario`)
                    raise UserError(
                        "this mini-sglang checkout cannot cancel a request (AbortBackendMsg came"
                        " in 578df98); the scenario aborts one"
                    )
                self.front.abort(msg.uid)
                out.append(up["minisgl.message"].AbortBackendMsg(uid=msg.uid))
                continue
            if self.front.admit(msg):
                out.append(self._request(msg))
        return out

    def _request(self, msg: UserMsg) -> Any:
        up = self.up
        sp = msg.sampling_params
        params = construct(  # (top_k and top_p since b4a817c: the toy model's logits give
            # one token whatever they are)
            up["minisgl.core"].SamplingParams,
            temperature=sp.temperature,
            top_k=sp.top_k,
            top_p=sp.top_p,
            ignore_eos=sp.ignore_eos,
            max_tokens=sp.max_tokens,
        )
        with plain():
            ids = torch.tensor(msg.input_ids, dtype=torch.int32)
        return up["minisgl.message"].UserMsg(uid=msg.uid, input_ids=ids, sampling_params=params)

    def _send(self, reply: Any) -> None:
        # a list of DetokenizeMsg, or (before ef4367f) a BatchTokenizerMsg holding them
        for msg in getattr(reply, "data", reply):
            self.front.token(int(msg.uid), int(msg.next_token), bool(msg.finished))


def make_scheduler(
    config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
) -> MiniSglScheduler:
    """`--scheduler overlapcheck.adapters.minisgl:make_scheduler` (runs on the simulator)."""
    if not isinstance(device, SimDevice):
        raise UserError("the mini-sglang adapter runs on the simulator only (--backend sim)")
    fitted = fit_config(config)
    if fitted != config:
        raise UserError(f"this mini-sglang checkout cannot run {_unlike(config, fitted)}")
    return MiniSglScheduler(config, device, source, sink)


def fit_scenario(scenario: Scenario) -> Scenario:
    """The nearest workload the checkout serves (`core.protocol.ScenarioFitting`): an older
    mini-sglang cannot cancel a request (its workloads have no aborts), pages one token at a
    time (the pool keeps its tokens), or captures CUDA graphs where the adapter cannot stand
    in for the capture (no graphs)."""
    fitted = replace(scenario, config=fit_config(scenario.config))
    if not _checkout_features().cancels:
        fitted = replace(fitted, requests=tuple(_no_abort(r) for r in fitted.requests))
    return scenario if fitted == scenario else fitted


def _no_abort(request: RequestSpec) -> RequestSpec:
    # (an anchor at a request's abort falls back to its end when it gets none: `Anchor`)
    return replace(request, abort_at=None, abort_iteration=None, abort_after=None)


def fit_config(config: SchedulerConfig) -> SchedulerConfig:
    """The nearest configuration the checkout runs (see `fit_scenario`)."""
    can = _checkout_features()
    fitted = config
    if config.page_size > 1 and not can.paged:
        fitted = replace(fitted, page_size=1, num_pages=config.num_pages * config.page_size)
    if config.cuda_graph_bs and not can.graphs:
        fitted = replace(fitted, cuda_graph_bs=())
    return fitted


def _unlike(config: SchedulerConfig, fitted: SchedulerConfig) -> str:
    why = {
        "page_size": "pages of more than one token (they came in 5e52ef3)",
        "cuda_graph_bs": "CUDA graphs (captured inside GraphRunner.__init__ before f074873)",
    }
    return "; ".join(
        f"{name}={getattr(config, name)!r}: {reason}"
        for name, reason in why.items()
        if getattr(config, name) != getattr(fitted, name)
    )


make_scheduler.fit_scenario = fit_scenario  # type: ignore[attr-defined]
