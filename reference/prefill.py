"""The prefill manager: the pending list, admission, and chunked prefill under a token budget."""

from __future__ import annotations

from typing import NamedTuple

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.reference import faults as F
from overlapcheck.reference.cache.manager import CacheManager
from overlapcheck.reference.policy import QueuePolicy, make_policy
from overlapcheck.reference.preemption import resume_if_ready
from overlapcheck.reference.req import Req, ReqState
from overlapcheck.reference.table import TableManager


class Chunk(NamedTuple):
    req: Req
    start: int
    end: int


class PrefillManager:
    """Owns `pending` (not admitted, arrival order), `prefilling` (admitted, prompt not fully
    launched) and the queue policy that orders `pending` for each batch."""

    def __init__(self, config: SchedulerConfig, cache: CacheManager, table: TableManager) -> None:
        self.config = config
        self.cache = cache
        self.table = table
        self.policy: QueuePolicy = make_policy(config, cache.prefix)
        self.pending: list[Req] = []
        self.prefilling: list[Req] = []
        # Admitted prompt tokens, and how many of them the prefix cache held (for hit rates).
        self.prompt_tokens = 0
        self.cached_tokens = 0

    def add(self, req: Req) -> None:
        self.pending.append(req)

    def requeue(self, req: Req) -> None:
        """A preempted request waits again, ahead of every other."""
        self.pending.insert(0, req)

    def remove(self, req: Req) -> None:
        if req in self.pending:
            self.pending.remove(req)
        if req in self.prefilling:
            self.prefilling.remove(req)

    @property
    def has_work(self) -> bool:
        return bool(self.pending or self.prefilling)

    def pages_needed(self, req: Req) -> int:
        """Pages `req` may still allocate before it finishes (what admission must keep free).

        On demand, only those of its next forward and one position more: what its prefill
        computes, or its next decode. Admission keeps that much free for every admitted request,
        so a newcomer never takes the page a running decode needs next (it would be preempted by
        that decode at once, its prefill's result dropped, and admitted again: a cascade)."""
        held = len(req.cells) // self.config.page_size
        if self.config.page_alloc == "on-demand":
            if F.PREEMPT_CASCADE in self.config.faults:  # upstream: the prefill's pages only
                return max(0, self.config.pages_for(req.fill_len) - held)
            # speculating, the next step also covers the positions a step in flight may add (never
            # past the request's last position: a short request must still fit the pool alone)
            nxt = max(req.fill_len, req.device_len) + 1
            ahead = max(nxt, min(nxt + self.config.draft_tokens, req.prompt_len + req.max_output))
            return max(0, self.config.pages_for(ahead) - held)
        return max(0, self.config.pages_for(req.prompt_len + req.max_output) - held)

    def schedule(self, reserved_pages: int, step: int) -> tuple[list[Chunk], list[Req]]:
        """The chunks of the next prefill batch, and the requests admitted for it at pass `step`.

        `reserved_pages`: what admitted requests may still allocate. A request is admitted only
        if its own worst case fits beside that, so a running decode can never run out of pages.
        Requests are offered in the policy's order; when the one at the head of that order does
        not fit, nobody behind it is admitted in this pass.
        """
        budget = self.config.max_extend_tokens
        chunks: list[Chunk] = []
        for req in self.prefilling:
            if budget == 0:
                break
            size = min(budget, req.fill_len - req.kv_len)
            if size > 0:
                chunks.append(Chunk(req, req.kv_len, req.kv_len + size))
                budget -= size
        admitted: list[Req] = []
        if budget == 0 or not self.pending or self.table.num_free == 0:
            return chunks, admitted  # nobody can be admitted: skip the policy's work
        for req in self.policy.order(self.pending, step):
            if budget == 0 or self.table.num_free == 0:
                break
            if req.preempted and not resume_if_ready(req, self.config):
                break  # its in-flight round or its KV is still out: nobody overtakes it
            self.cache.attach_prefix(req)
            need = self.pages_needed(req)
            if need + reserved_pages > self.cache.available_pages:
                self.cache.detach_prefix(req)
                break  # nobody overtakes the head of the policy's order
            self.pending.remove(req)
            req.preempted = False
            reserved_pages += need
            req.slot = self.table.allocate()
            req.state = ReqState.PREFILLING
            req.kv_len = req.cached_len
            self.prefilling.append(req)
            admitted.append(req)
            self.prompt_tokens += req.prompt_len
            self.cached_tokens += req.cached_len
            size = min(budget, req.fill_len - req.kv_len)
            chunks.append(Chunk(req, req.kv_len, req.kv_len + size))
            budget -= size
        return chunks, admitted
