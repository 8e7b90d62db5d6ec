"""vLLM's own v1 `AsyncScheduler` (or `Scheduler`) as a scheduler under test.

The adapter stands in for `EngineCore` and its executor: one `step()` is one iteration of
`EngineCore.step_with_batch_queue` (async scheduling: a batch queue of two, so step N+1 is
scheduled and launched before step N's output is applied) or of `EngineCore.step` followed by
`post_step` (synchronous). vLLM's scheduler classes run as they ship; the worker is stood in for
(worker.py), under the simulated CUDA. Messages: a `UserMsg` becomes a `Request` (its prompt,
`SamplingParams` with `max_tokens` and `ignore_eos`, EOS from our config), an `AbortMsg`
becomes `finish_requests(..., FINISHED_ABORTED)`, and each `EngineCoreOutput`'s new token ids
become `TokenMsg`s. A request id is `uid-n` (the n-th request under that uid), as vLLM's front end
makes ids unique.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from overlapcheck.adapters.base import Loaded, UpstreamScheduler
from overlapcheck.adapters.vllm.books import read_books
from overlapcheck.adapters.vllm.configs import Built, Variant, build
from overlapcheck.adapters.vllm.connector import PlannedLoad
from overlapcheck.adapters.vllm.upstream import ASYNC_SCHEDULER, SCHEDULER
from overlapcheck.adapters.vllm.worker import Launched, Load, StandInWorker
from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.backends.torchsim.session import SimulatedCuda
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.errors import InvariantError
from overlapcheck.core.messages import AbortMsg, UserMsg
from overlapcheck.core.protocol import Books, MessageSink, MessageSource
from overlapcheck.core.rules import max_output
from overlapcheck.core.trace import HOST

# Host time an engine-core iteration with nothing to do takes (a poll of its input queue).
IDLE_ITERATION = 5e-6


class VllmScheduler(UpstreamScheduler):
    """Drives vLLM's scheduler one engine-core iteration per `step()`."""

    def __init__(
        self,
        config: SchedulerConfig,
        device: SimDevice,
        source: MessageSource,
        sink: MessageSink,
        loaded: Loaded,
        variant: Variant,
    ) -> None:
        super().__init__(config, device, source, sink, loaded)
        self.sim = device
        self.variant = variant
        self.built: Built = build(loaded, config, variant)
        self.uid_of: dict[str, int] = {}  # vLLM request id -> uid
        self.current: dict[int, str] = {}  # uid -> its latest request id
        self.made: dict[int, int] = {}  # uid -> requests made under it
        self.queue: deque[tuple[Any, Launched | None]] = deque()  # step_with_batch_queue's
        self.cuda = SimulatedCuda(device, ("engine", "copy", "transfer"))
        b = self.built
        kv_utils = loaded["vllm.v1.core.kv_cache_utils"]
        sha256 = loaded["vllm.utils.hashing"].sha256
        kv_utils.init_none_hash(sha256)
        self.hasher = kv_utils.get_request_block_hasher(b.block_size, sha256)
        self.request_cls = loaded["vllm.v1.request"].Request
        self.aborted = loaded["vllm.v1.request"].RequestStatus.FINISHED_ABORTED
        self.params_cls = loaded["vllm.sampling_params"].SamplingParams
        outputs = loaded["vllm.v1.outputs"]
        self.output_cls = outputs.ModelRunnerOutput
        self.drafts_cls = outputs.DraftTokenIds
        self.connector_output_cls = outputs.KVConnectorOutput
        cls = (
            loaded[ASYNC_SCHEDULER].AsyncScheduler
            if variant.asynchronous
            else loaded[SCHEDULER].Scheduler
        )
        with self._block():
            self.worker = StandInWorker(
                self.cuda,
                device.model,
                config.num_slots,
                b.max_model_len,  # vLLM's, not ours: the pool may cap it (configs.build)
                b.block_size,
                b.num_blocks,
                b.drafts,
                self.uid_of,
            )
            self.sched = cls(
                vllm_config=b.vllm_config,
                kv_cache_config=b.kv_cache_config,
                structured_output_manager=loaded[
                    "vllm.v1.structured_output"
                ].StructuredOutputManager(b.vllm_config),
                block_size=b.block_size,
                log_stats=False,
            )

    @contextlib.contextmanager
    def _block(self) -> Iterator[None]:
        with self.cuda, torch.inference_mode():
            yield

    # -- the protocol -------------------------------------------------------------------------

    def step(self) -> bool:
        with self._block():
            holding = bool(self.sched.has_requests() or self.queue or self.worker.loads)
            msgs = self.receive(holding)
            if msgs is None:
                self.cuda.drain()
                return False
            if not holding and not msgs:
                # Idle, and what comes next is due after some iterations, not at a time: an
                # idle engine-core iteration (its input-queue poll) takes a little host time.
                self.sim.sleep_until(self.sim.now() + IDLE_ITERATION)
            self._take(msgs)
            if self.variant.asynchronous:
                self._step_with_batch_queue()
            else:
                self._step()
            self._check_placeholders()
        return True

    def _check_placeholders(self) -> None:
        """vLLM's placeholder books (`num_output_placeholders`: tokens scheduled, not yet
        applied): never negative, and none left once no step is in flight."""
        idle = not self.queue
        for req_id, request in self.sched.requests.items():
            held = request.num_output_placeholders
            if held < 0 or (idle and held and not request.is_finished()):
                state = "negative" if held < 0 else "left with no step in flight"
                raise InvariantError(
                    "placeholder", f"request {req_id}: num_output_placeholders {held} ({state})"
                )

    def books(self) -> Books:
        return read_books(self.sched, self.uid_of, self.worker.index, self.config.num_slots)

    # -- EngineCore's loop ----------------------------------------------------------------------

    def _step(self) -> None:
        """`EngineCore.step`, then `post_step` (drafts handed to the scheduler)."""
        sched = self.sched
        if not sched.has_requests():
            return
        out = self._schedule()
        launched = self._execute(out)
        self._process(out, launched, idle=launched is None)
        if self.built.drafts and launched is not None:
            drafts = self.worker.last_drafts
            req_ids = sorted(drafts)
            sched.update_draft_token_ids(
                self.drafts_cls(req_ids=req_ids, draft_token_ids=[drafts[r] for r in req_ids])
            )

    def _step_with_batch_queue(self) -> None:
        """`EngineCore.step_with_batch_queue`: a queue of `max_concurrent_batches` steps (two
        under async scheduling, one more per extra pipeline stage)."""
        sched, queue = self.sched, self.queue
        if sched.has_requests():
            out = self._schedule()
            launched = self._execute(out)
            queue.appendleft((out, launched))
            if len(queue) < self.built.batch_queue and (
                launched is not None or sched.has_requests()
            ):
                return
        elif not queue:
            return
        out, launched = queue.pop()
        idle = launched is None and all(entry is None for _, entry in queue)
        self._process(out, launched, idle)

    def _schedule(self) -> Any:
        sched = self.sched
        with self.sim.span("schedule", len(sched.requests)):
            return sched.schedule()

    def _execute(self, out: Any) -> Launched | None:
        """The executor's `execute_model` + `sample_tokens`, non-blocking."""
        with self.sim.span("launch", len(out.num_scheduled_tokens)):
            meta = out.kv_connector_metadata
            planned: list[PlannedLoad] = list(getattr(meta, "loads", ()) or ())
            bs = self.built.block_size
            loads = [Load(p.req_id, p.cells(bs), _array(p.tokens)) for p in planned]
            return self.worker.execute(out, loads)

    def _process(self, out: Any, launched: Launched | None, idle: bool) -> None:
        """Wait for a step's output, then `update_from_output` and the tokens out."""
        worker = self.worker
        if launched is None:
            req_ids: list[str] = []
            sampled: list[list[int]] = []
        else:
            req_ids, sampled = worker.output(launched)
            self._read_output(launched)
        connector = None
        if self.variant.connector:
            done = worker.finished_loads(wait=idle)
            connector = self.connector_output_cls(finished_recving=done or None)
        result = self.output_cls(
            req_ids=req_ids, sampled_token_ids=sampled, kv_connector_output=connector
        )
        with self.sim.span("process", len(req_ids)):
            outputs = self.sched.update_from_output(out, result)
            for client in sorted(outputs):
                for item in outputs[client].outputs:
                    self._send(item)

    def _send(self, item: Any) -> None:
        uid = self.uid_of[item.request_id]
        tokens = list(item.new_token_ids)
        finished = item.finish_reason is not None
        for i, token in enumerate(tokens):
            self.front.token(uid, int(token), finished and i == len(tokens) - 1)

    def _read_output(self, launched: Launched) -> None:
        """Mark the host's read of a batch's results (the timeline and lifecycle anchors)."""
        now = self.sim.now()
        self.sim.recorder.op(
            HOST,
            "read_output",
            now,
            label=f"read {launched.label}",
            batch=launched.batch,
            uids=tuple(s.uid for s in launched.seqs),
            start=now,
            end=now,
        )

    # -- requests in --------------------------------------------------------------------------

    def _take(self, msgs: list[UserMsg | AbortMsg]) -> None:
        for msg in msgs:
            if isinstance(msg, AbortMsg):
                if self.front.abort(msg.uid) and msg.uid in self.current:
                    self.sched.finish_requests(self.current[msg.uid], self.aborted)
                continue
            if not self.front.admit(msg):
                continue
            n = self.made.get(msg.uid, 0)
            self.made[msg.uid] = n + 1
            req_id = f"{msg.uid}-{n}"
            self.uid_of[req_id] = msg.uid
            self.current[msg.uid] = req_id
            params = self.params_cls(
                max_tokens=max_output(self.config, msg),
                ignore_eos=msg.sampling_params.ignore_eos,
                temperature=0.0,
            )
            params.update_from_generation_config({}, self.config.eos_token_id)
            request = self.request_cls(
                request_id=req_id,
                prompt_token_ids=list(msg.input_ids),
                sampling_params=params,
                pooling_params=None,
                arrival_time=self.sim.now(),
                block_hasher=self.hasher,
            )
            self.sched.add_request(request)


def _array(tokens: tuple[int, ...]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int64)
