"""The prefill manager: the pending list, admission, and chunked prefill under a token budget."""

from __future__ import annotations

from typing import NamedTuple

from overlapcheck.core.cache.manager import CacheManager
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.req import Req, ReqState
from overlapcheck.core.table import TableManager


class Chunk(NamedTuple):
    req: Req
    start: int
    end: int


class PrefillManager:
    """Owns `pending` (not admitted) and `prefilling` (admitted, prompt not fully launched)."""

    def __init__(self, config: SchedulerConfig, cache: CacheManager, table: TableManager) -> None:
        self.config = config
        self.cache = cache
        self.table = table
        self.pending: list[Req] = []
        self.prefilling: list[Req] = []

    def add(self, req: Req) -> None:
        self.pending.append(req)

    def remove(self, req: Req) -> None:
        if req in self.pending:
            self.pending.remove(req)
        if req in self.prefilling:
            self.prefilling.remove(req)

    @property
    def has_work(self) -> bool:
        return bool(self.pending or self.prefilling)

    def pages_needed(self, req: Req) -> int:
        """Pages `req` may still allocate before it finishes (what admission must keep free)."""
        held = len(req.cells) // self.config.page_size
        return max(0, self.config.pages_for(req.prompt_len + req.max_output) - held)

    def schedule(self, reserved_pages: int) -> tuple[list[Chunk], list[Req]]:
        """The chunks of the next prefill batch, and the requests admitted for it.

        `reserved_pages`: what admitted requests may still allocate. A request is admitted only
        if its own worst case fits beside that, so a running decode can never run out of pages.
        """
        budget = self.config.max_extend_tokens
        chunks: list[Chunk] = []
        for req in self.prefilling:
            if budget == 0:
                break
            size = min(budget, req.prompt_len - req.kv_len)
            if size > 0:
                chunks.append(Chunk(req, req.kv_len, req.kv_len + size))
                budget -= size
        admitted: list[Req] = []
        while budget > 0 and self.pending and self.table.num_free > 0:
            req = self.pending[0]
            self.cache.attach_prefix(req)
            need = self.pages_needed(req)
            if need + reserved_pages > self.cache.available_pages:
                self.cache.detach_prefix(req)
                break  # first come, first served: nobody overtakes the head of the queue
            self.pending.pop(0)
            reserved_pages += need
            req.slot = self.table.allocate()
            req.state = ReqState.PREFILLING
            req.kv_len = req.cached_len
            self.prefilling.append(req)
            admitted.append(req)
            size = min(budget, req.prompt_len - req.kv_len)
            chunks.append(Chunk(req, req.kv_len, req.kv_len + size))
            budget -= size
        return chunks, admitted
