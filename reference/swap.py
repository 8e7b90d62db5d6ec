"""Preemption by swap: a victim's KV goes to the host on the transfer stream and comes back.

Out: the transfer stream waits for the engine stream (the in-flight forward still writes the
victim's last KV cell), the computed cells `[0, kv_len)` are offloaded, and an event is recorded
after the copy. The victim keeps its in-flight result (there is nothing to recompute). Its slot and
pages go back by the release rule, once the in-flight batch is processed, and only after the engine
stream has been made to wait for the offload: the next forward that writes those pages must not
overtake the copy still reading them (the transfer stream is ordered with compute only by such a
wait).

In: when a slot and the pages of its context (one position more, as admission keeps) are free,
pages are allocated, the KV loaded into them on the transfer stream, the engine stream waits for
the load, the `token_pool` row is rewritten (prompt + outputs) and the request decodes on.
"""

from __future__ import annotations

from typing import NamedTuple

from overlapcheck.core.batch import RowWrite
from overlapcheck.core.device import Event, KvCopy
from overlapcheck.core.trace import TOKEN_POOL
from overlapcheck.reference import faults as F
from overlapcheck.reference.managers import Managers
from overlapcheck.reference.req import Req, ReqState


class SwappedOut(NamedTuple):
    saved: KvCopy
    done: Event  # recorded on the transfer stream after the offload


class Swapper:
    def __init__(self, managers: Managers) -> None:
        self.config, self.device, self.cache, self.table, self.decode = managers
        self.queue: list[Req] = []  # swapped out, in preemption order
        self.out: dict[int, SwappedOut] = {}  # by uid, while its KV is on the host

    def swap_out(self, victim: Req, length: int) -> None:
        """Offload the KV of `victim`'s first `length` positions (what its launched batches
        compute: a verify step's rejected positions too; they are recomputed before read)."""
        dev = self.device
        dev.wait_stream(dev.transfer_stream, dev.engine_stream)
        saved = dev.offload_kv(victim.uid, victim.cells[:length], dev.transfer_stream)
        self.out[victim.uid] = SwappedOut(saved, dev.record(dev.transfer_stream))
        self.queue.append(victim)

    def before_free(self, req: Req) -> None:
        """Order the engine stream after the offload before `req`'s pages go to anyone."""
        out = self.out.get(req.uid)
        if out is not None and not self.config.faults & {F.SWAP_FREE_BEFORE_OFFLOAD}:
            self.device.wait_event(self.device.engine_stream, out.done)

    def forget(self, req: Req) -> None:
        """`req` ended (finished by its kept result, or aborted) while swapped out."""
        if req in self.queue:
            self.queue.remove(req)
            self.before_free(req)
            del self.out[req.uid]

    def swap_in(self, reserved: int) -> None:
        """Bring swapped requests back, oldest first, while slots and pages last."""
        dev = self.device
        while self.queue:
            req = self.queue[0]
            if req.slot >= 0 or req.inflight or self.table.num_free == 0:
                return  # its in-flight round is still out, or no slot
            saved = self.out[req.uid].saved
            # a verify step's offload covers its rejected positions too: they come back as well
            need = self.config.pages_for(max(req.device_len + 1, saved.length))
            if need + reserved > self.cache.available_pages:
                return
            self.queue.pop(0)
            del self.out[req.uid]
            req.slot = self.table.allocate()
            self.cache.grow(req, saved.length)
            dev.load_kv(saved, req.cells[: saved.length], dev.transfer_stream)
            dev.wait_event(dev.engine_stream, dev.record(dev.transfer_stream))
            known = (*req.prompt, *req.outputs)
            dev.copy_to_device(TOKEN_POOL, [RowWrite(req.slot, 0, known)], dev.scheduler_stream)
            # computed: every position but the last token's (its KV comes with the next step)
            req.kv_len = min(saved.length, len(known) - 1)
            req.table_len = 0  # the decode copies the whole page-table row
            req.state = ReqState.RUNNING
            req.preempted = False
            self.decode.add(req)
            reserved += need
