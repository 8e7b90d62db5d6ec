"""A request as the scheduler tracks it."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from overlapcheck.core.messages import SamplingParams
from overlapcheck.reference.cache.base import CacheHandle
from overlapcheck.reference.cache.snapshots import PageSnapshots


class ReqState(Enum):
    PENDING = "pending"  # waiting for admission
    PREFILLING = "prefilling"  # admitted, prompt not fully launched
    RUNNING = "running"  # prompt launched, decoding
    FINISHED = "finished"  # last message sent; resources may still wait for an in-flight batch
    ABORTED = "aborted"


DONE_STATES = (ReqState.FINISHED, ReqState.ABORTED)  # `Req.done`


@dataclass(eq=False, slots=True)
class Req:
    """One request. Lengths count token positions in the request's `token_pool` row.

    `kv_len`: positions whose KV a launched forward computes. `device_len`: tokens that will sit in
    the row once every launched forward ran (prompt plus launched samples); the host learns those
    samples one round later, into `outputs`.
    """

    uid: int
    prompt: tuple[int, ...]
    params: SamplingParams
    max_output: int  # max_tokens, clamped to what max_seq_len allows
    arrival_step: int
    state: ReqState = ReqState.PENDING
    slot: int = -1
    cells: list[int] = field(default_factory=list)  # host copy of page_table[slot, :]
    own_pages: list[int] = field(default_factory=list)  # pages allocated for this request
    # The books' snapshots of `own_pages`, kept between iterations: the last is always a
    # prefix of `own_pages`, which only grows at its end (`CacheManager.grow`) until it is
    # replaced (then these are reset; all of that in cache/manager.py).
    books_pages: PageSnapshots = field(default_factory=PageSnapshots)
    handle: CacheHandle | None = None  # locked prefix-cache match
    cached_len: int = 0
    table_len: int = 0  # page_table entries already copied to the device
    kv_len: int = 0
    device_len: int = 0
    outputs: list[int] = field(default_factory=list)
    inflight: int = 0  # launched batches holding this request whose results are unprocessed
    released: bool = False
    # Preemption (reference/preemption.py). `resumed`: outputs folded into the prefill of a
    # recompute (its "fill": prompt + those outputs). `drop`: in-flight results to drop (a request
    # retracted SGLang-style).
    preempted: bool = False
    resumed: int = 0
    resume_at: int = 0  # outputs received when it was preempted
    drop: int = 0
    preemptions: int = 0

    @property
    def prompt_len(self) -> int:
        return len(self.prompt)

    @property
    def fill(self) -> tuple[int, ...]:
        """What a prefill of this request computes: the prompt, plus the outputs a recompute
        after preemption folds in."""
        return self.prompt + tuple(self.outputs[: self.resumed]) if self.resumed else self.prompt

    @property
    def fill_len(self) -> int:
        return len(self.prompt) + self.resumed

    @property
    def launched_outputs(self) -> int:
        return max(0, self.device_len - self.prompt_len)

    @property
    def can_decode(self) -> bool:
        """Another decode round may be launched: counts rounds launched, not results received."""
        return self.state is ReqState.RUNNING and self.launched_outputs < self.max_output

    @property
    def done(self) -> bool:
        return self.state in DONE_STATES

    def known_tokens(self) -> list[int]:
        """Prompt plus received outputs, cut to the positions whose KV was computed."""
        return (list(self.prompt) + self.outputs)[: self.kv_len]
