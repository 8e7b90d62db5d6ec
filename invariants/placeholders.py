"""`placeholder`: a placeholder is resolved from the step that produces it, and never reaches a
forward's input or a message (speculation, `core/speculative.py`).

* From the trace, for any scheduler and backend: every `spec_out` cell a `resolve` reads was last
  written (in issue order) by the latest forward that ran the request the placeholder is for, as
  that request's sequence at the index read. A cell no forward wrote, or one another batch or
  another request wrote, resolves the placeholder from someone else's result: a stale
  placeholder. (That the read is *ordered* after that write is `no-race`'s.)
* From the device, where it keeps the log (the simulator does): no forward found a placeholder
  still in its metadata when it ran.
* From the messages: no token message carries the sentinel (or any negative id).
"""

from __future__ import annotations

from typing import Protocol, cast, runtime_checkable

from overlapcheck.core.batch import PLACEHOLDER, SPEC_FIELDS
from overlapcheck.core.capability import provides
from overlapcheck.core.messages import InMsg, OutMsg, TokenMsg
from overlapcheck.core.speculative import SHIFT_FIELD
from overlapcheck.core.trace import METADATA, SPEC_OUT, Op
from overlapcheck.invariants.base import TraceScanner
from overlapcheck.invariants.context import Request, RunContext
from overlapcheck.invariants.forwards import ForwardFeed


@runtime_checkable
class PlaceholderLog(Protocol):
    """A device that logs the placeholders its forwards found unresolved: (forward op seq,
    sequence index, the value read)."""

    placeholder_inputs: list[tuple[int, int, int]]


class Placeholders(TraceScanner):
    """A placeholder is resolved from the forward of the step that produced it for that request,
    and never reaches a forward's input or a message."""

    id = "placeholder"

    def __init__(self) -> None:
        self.feed = ForwardFeed()
        self.seen = 0  # ops scanned
        self.logged = 0  # device log entries judged
        self.writer: dict[int, Op] = {}  # spec_out cell -> the forward that last wrote it
        self.latest: dict[int, Op] = {}  # request index -> its latest forward
        self.log: PlaceholderLog | None = None
        self.active = False

    def bind(self, run: RunContext) -> None:
        super().bind(run)
        # Without speculation there are no placeholders (a negative token is then just a wrong
        # one, for `oracle`), and nothing here to pay for.
        self.active = run.config.draft_tokens > 0
        if provides(run.device, PlaceholderLog):  # (not isinstance: see core/capability.py)
            self.log = cast(PlaceholderLog, run.device)

    def on_receive(self, msg: InMsg, req: Request | None) -> None:
        self._scan()

    def on_message(self, msg: OutMsg, req: Request | None) -> None:
        if isinstance(msg, TokenMsg) and msg.token < 0:
            what = "the placeholder" if msg.token == PLACEHOLDER else f"token id {msg.token}"
            self.fail(f"{what} reached a token message for request {msg.uid}", (msg.uid,))
        self._scan()

    def _scan(self) -> None:
        ops = self.run.trace.ops
        attributed = {op.seq: reqs for op, reqs in self.feed.pull(self.run)}
        for i in range(self.seen, len(ops)):
            op = ops[i]
            if op.kind == "resolve":
                self._judge(op)
            elif op.kind == "forward":
                reqs = attributed.get(op.seq, ())
                for req in reqs:
                    if req is not None:
                        self.latest[req.index] = op
                for acc in op.accesses:
                    if acc.buffer == SPEC_OUT and acc.mode == "w":
                        for cell in acc.cells.tolist():
                            self.writer[cell] = op
        self.seen = len(ops)
        self._check_log()

    def _judge(self, op: Op) -> None:
        reads = next((a for a in op.accesses if a.buffer == SPEC_OUT and a.mode == "r"), None)
        shifts = next((a for a in op.accesses if a.buffer == METADATA and a.mode == "w"), None)
        if reads is None or shifts is None or len(reads.cells) != len(shifts.cells):
            return
        width = SPEC_FIELDS * (self.run.config.num_slots + 1)
        for cell, meta in zip(reads.cells.tolist(), shifts.cells.tolist(), strict=True):
            index = (meta % width - SHIFT_FIELD) // SPEC_FIELDS  # the sequence in op's batch
            source = cell % (self.run.config.num_slots + 1)
            if not 0 <= index < len(op.uids):
                continue
            uid = op.uids[index]
            req = self.run.attribution.current.get(uid)
            if req is None:
                continue
            writer, latest = self.writer.get(cell), self.latest.get(req.index)
            where = f"{op.label} (step {op.step}) resolves request {uid}'s placeholder"
            if writer is None:
                self.fail(
                    f"{where} from spec_out cell {cell}, which no forward has written: the "
                    "placeholder reaches the forward's input",
                    (uid,),
                )
            elif writer is not latest or not (
                source < len(writer.uids) and writer.uids[source] == uid
            ):
                mine = "none" if latest is None else f"{latest.label} (step {latest.step})"
                who = writer.uids[source] if source < len(writer.uids) else "nobody"
                self.fail(
                    f"{where} from {writer.label} (step {writer.step}), sequence {source} "
                    f"(request {who}); the request's latest step is {mine}: a stale placeholder",
                    (uid,),
                    writer=writer.seq,
                )

    def _check_log(self) -> None:
        log = self.log
        if log is None or self.logged == len(log.placeholder_inputs):
            return
        seq, index, value = log.placeholder_inputs[self.logged]
        self.logged += 1
        op = self.run.trace.ops[seq]
        uid = op.uids[index] if index < len(op.uids) else -1
        self.fail(
            f"{op.label} (step {op.step}) ran with request {uid}'s shift still {value} in its "
            "metadata: a placeholder reached the forward's input",
            (uid,),
            forward=seq,
        )
