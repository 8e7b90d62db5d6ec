"""`no-hidden-sync`: in the overlap loop the host never blocks on the forward it just launched
before it launches the next one.

Judged structurally, from happens-before (`invariants/races.py`), so it holds under any timing: a
host wait whose event's vector clock covers forward N's clock on its stream (the event can fire only
after forward N finished), issued after forward N's launch and before forward N+1's, serialises the
overlap: the host cannot prepare N+1 while N runs. Only waits in an iteration that launches N or
N+1 count; an iteration that launches nothing has nothing to overlap (the host drains the last
batch, or waits for its results to free memory). The normal loop blocks by design: not checked.
"""

from __future__ import annotations

from overlapcheck.core.trace import Op, op_kind
from overlapcheck.invariants.base import TraceScanner
from overlapcheck.invariants.context import RunContext

_JUDGED = ("forward", "host_wait")


class NoHiddenSync(TraceScanner):
    """Under overlap, the host never blocks between launching forward N and N+1 on an event
    that fires only after N finished."""

    id = "no-hidden-sync"

    def __init__(self) -> None:
        self.seen = 0
        self.active = True
        self.last: tuple[Op, int, int] | None = None  # the latest forward, its agent and clock
        self.suspects: list[Op] = []  # host waits covering the latest forward
        self.covered = False  # a host wait since the latest forward covered it

    def bind(self, run: RunContext) -> None:
        super().bind(run)
        self.active = run.config.loop != "normal"

    def _scan(self) -> None:
        ops = self.run.trace.ops
        clocks = self.run.clocks
        hb = clocks.hb
        n = clocks.advance()
        start = self.seen
        # Only forwards and host waits matter, a few of a step's ops: found in C first.
        kinds = list(map(op_kind, ops[start:n]))
        for seq in [start + i for i, kind in enumerate(kinds) if kind in _JUDGED]:
            op = ops[seq]
            if op.kind == "forward":
                self.seen = seq + 1  # a finding here leaves the next scan to go on after it
                if self.last is not None:
                    for wait in self.suspects:
                        if op.step == wait.step or self.last[0].step == wait.step:
                            self._report(wait, self.last[0], op, seq)
                self.suspects.clear()
                agent, vc = clocks.agent[seq], clocks.vc[seq]
                assert vc is not None  # kept for every forward
                self.last = (op, agent, int(vc[agent]))
                self.covered = False
            elif self.last is not None and op.waits is not None:  # a host wait
                event = hb.events.get(op.waits)
                # Only the first wait that covers the forward can block on it: after that the
                # host knows it finished, and a later wait (an idle-time check, say) covers it
                # through the host's own past without waiting for it.
                if event is not None and event[self.last[1]] >= self.last[2] and not self.covered:
                    self.suspects.append(op)
                    self.covered = True
        self.seen = n

    def _report(self, wait: Op, forward: Op, following: Op, at: int) -> None:
        """`following` (at `at` in the trace) comes after `wait`, which covers `forward`."""
        assert wait.waits is not None
        ops = self.run.trace.ops
        # the event's latest record issued by then
        seq = next((i for i in range(at, -1, -1) if ops[i].records == wait.waits), None)
        record = ops[seq] if seq is not None else None
        where = (
            f"recorded on the {record.agent} stream at step {record.step} ({record.phase})"
            if record is not None
            else "never recorded"
        )
        self.fail(
            f"hidden sync: in step {wait.step} ({wait.phase}) the host blocks on event "
            f"e{wait.waits} ({where}), which fires only after {forward.label} (step "
            f"{forward.step}) finishes, and only then launches {following.label}: the overlap "
            "of the next batch with the running one is lost",
            forward.uids,
            wait=wait.seq,
            event=wait.waits,
            record=seq,
            forward=forward.seq,
        )
