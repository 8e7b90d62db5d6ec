"""Preemption: what the reference does when pages are allocated on demand and run out.

`config.page_alloc == "on-demand"`: admission takes the pages of what a request's prefill computes,
and each decode takes its next page as it goes; a decode batch that needs more than is available
makes room by preempting (`config.preemption`):

* `recompute`: the victim gives its slot and pages back (its computed prefix goes to the prefix
  cache, like any release) and is queued at the front; admitted again, it is prefilled from its
  prompt + the outputs it was sent (its `fill`), and decodes on.
* `swap`: its KV is copied to the host on the transfer stream, its pages and slot go back once the
  engine stream is ordered after that copy; brought back, pages are allocated, the KV copied back,
  and it decodes on without a prefill (`reference/swap.py`). Its in-flight result is kept under
  either policy: there is nothing to recompute.

When (`config.preempt_policy`):

* `allocation-failure` (vLLM): the decode batch's requests take their pages in admission order;
  one that cannot get its page preempts the last-admitted running request (itself, when it is the
  last). A victim's in-flight result is kept: it is processed, sent, and the recompute starts after
  it.
* `retract-decode` (SGLang): before the decode batch, while its pages do not fit, the
  last-admitted request is retracted; its in-flight results are dropped (`Req.drop`) and those
  positions sampled again after the recompute. Nothing dropped was sent, so nothing is sent twice.

The release rule holds throughout: a victim still in the in-flight batch keeps its slot and pages
until that batch is processed (`settle`). Pages that come back then are counted before preempting
anyone else: a victim whose pages are pinned frees nothing now, and preempting more for them would
cascade. Requests that cannot get a page now sit this decode out and get it after processing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.reference import faults as F
from overlapcheck.reference.managers import Managers
from overlapcheck.reference.req import Req, ReqState
from overlapcheck.reference.swap import Swapper


def resume_if_ready(req: Req, config: SchedulerConfig) -> bool:
    """Whether a preempted request may be admitted again (no launched batch holds it, its slot is
    back, so the outputs its recompute folds in are known); if so, fold them in."""
    if req.inflight == 0 and req.slot < 0:
        resume(req, config)
        return True
    return False


def resume(req: Req, config: SchedulerConfig) -> None:
    """Fold the outputs received into the recompute's prefill."""
    if F.PREEMPT_RESET_EARLY in config.faults:
        # upstream: the counters were reset when it was preempted, before its in-flight output
        # was drained: that output is sent, then sampled (and sent) again
        req.resumed = req.resume_at
    else:
        req.resumed = len(req.outputs)


class Preemption:
    def __init__(
        self, managers: Managers, requeue: Callable[[Req], None], held: Sequence[Req]
    ) -> None:
        self.config, self.device, self.cache, self.table, self.decode = managers
        self.requeue = requeue  # back to the front of the pending list
        self.held = held
        self.on_demand = self.config.page_alloc == "on-demand"
        self.retract = self.config.preempt_policy == "retract-decode"
        self.swapper = Swapper(managers) if self.config.preemption == "swap" else None
        self.count = 0  # preemptions so far
        # Set by the speculative steps (reference/speculative.py): how far a victim's KV will be
        # computed once its launched batches ran (a verify step's accepted count is not known
        # yet), and what they do when a request is preempted.
        self.kv_end: Callable[[Req], int] = lambda req: req.kv_len
        self._ends: Mapping[Req, int] = {}
        self.on_preempt: Callable[[Req], None] = lambda req: None

    @property
    def swapped(self) -> list[Req]:
        """Requests whose KV is on the host, waiting to come back."""
        return self.swapper.queue if self.swapper is not None else []

    def swap_in(self, reserved: int) -> None:
        if self.swapper is not None and self.swapper.queue:
            self.swapper.swap_in(reserved)

    def forget(self, req: Req) -> None:
        """A preempted request ended (its kept result finished it, or an abort)."""
        if self.swapper is not None:
            self.swapper.forget(req)

    # -- making room --------------------------------------------------------------------------

    def decode_batch(
        self, candidates: list[Req], ends: Mapping[Req, int] | None = None
    ) -> list[Req]:
        """The requests of the next decode batch that get their pages; preempts to make room.
        `ends`: the positions each one's step covers (default: its `device_len`, one decode)."""
        if not self.on_demand or not candidates:
            return candidates
        self._ends = ends or {}
        if self.retract:
            return self._retract(candidates)
        return self._on_failure(candidates)

    def _need(self, req: Req) -> int:
        """Pages `req`'s next step (context `device_len`, or its planned end) allocates."""
        end = self._ends.get(req, req.device_len)
        return max(0, self.config.pages_for(end) - len(req.cells) // self.config.page_size)

    def _coming_back(self) -> int:
        """Pages of preempted or finished requests that the in-flight batch still pins."""
        return sum(
            len(r.own_pages)
            for r in self.held
            if (r.preempted or r.done) and r.inflight > 0 and r.slot >= 0
        )

    def _on_failure(self, candidates: list[Req]) -> list[Req]:
        chosen: list[Req] = []
        claimed = 0
        for req in candidates:
            if req.state is not ReqState.RUNNING:
                continue  # preempted for an earlier one in this pass
            need = self._need(req)
            while need > self.cache.available_pages - claimed:
                if need <= self.cache.available_pages - claimed + self._coming_back():
                    break  # enough comes back once the in-flight batch is processed
                victim = self.decode.running[-1]
                self.preempt(victim)
                if victim is req:
                    break
            else:
                chosen.append(req)
                claimed += need
        return chosen

    def _retract(self, candidates: list[Req]) -> list[Req]:
        chosen = list(candidates)
        while chosen and sum(map(self._need, chosen)) > self.cache.available_pages:
            if sum(map(self._need, chosen)) <= self.cache.available_pages + self._coming_back():
                return self._fitting(chosen)
            victim = chosen.pop()
            self.preempt(victim)
        return chosen

    def _fitting(self, chosen: list[Req]) -> list[Req]:
        """The first requests whose pages fit now (the rest get theirs after processing)."""
        out, left = [], self.cache.available_pages
        for req in chosen:
            need = self._need(req)
            if need <= left:
                out.append(req)
                left -= need
        return out

    def preempt(self, victim: Req) -> None:
        self.count += 1
        victim.preemptions += 1
        victim.state = ReqState.PENDING
        victim.preempted = True
        victim.resume_at = len(victim.outputs)
        self.decode.remove(victim)
        self.on_preempt(victim)
        if self.swapper is not None:  # its in-flight result is kept: nothing to recompute
            self.swapper.swap_out(victim, self.kv_end(victim))
        else:
            if self.retract:
                victim.drop = victim.inflight  # SGLang: `if req.is_retracted: continue`
            self.requeue(victim)
        self.settle(victim)

    def settle(self, req: Req) -> None:
        """Give a preempted request's slot and pages back once no launched batch holds it."""
        if req.slot < 0 or req.inflight > 0:
            return
        if self.swapper is not None:
            self.swapper.before_free(req)
        self.cache.release(req)
        self.table.free(req.slot)
        self.device.released("slot", (req.slot,))
        req.slot = -1
        req.kv_len = req.table_len = req.cached_len = 0
