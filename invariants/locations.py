"""Findings' locations from the trace: the scheduler's lines behind an operation, and the story of
a caching allocator's reuse between two accesses (`core/sites.py` has the structured form)."""

from __future__ import annotations

from overlapcheck.core.sites import Location
from overlapcheck.core.trace import Op, Release, Reuse, TraceView


def op_location(role: str, op: Op) -> Location | None:
    """Where the scheduler issued `op` (None: not from the scheduler's code)."""
    if op.site is None:
        return None
    return Location.of(role, op.site, op.agent, op.step, op.label or op.kind)


def release_location(release: Release | None) -> Location | None:
    """Where the scheduler said it gave the resource back (`Device.released`)."""
    if release is None or release.site is None:
        return None
    return Location.of("freed", release.site, "host", release.step, f"free {release.resource}")


def locations(*found: Location | None) -> tuple[Location, ...]:
    return tuple(loc for loc in found if loc is not None)


def reuse_between(trace: TraceView, buffer: str, first: Op, second: Op) -> Reuse | None:
    """The allocator's reuse of `buffer`'s memory after `first` was issued and by `second`: then
    the two accesses are two tensors' (the one freed, the one that got its memory). Of several
    (memory of several freed tensors), the one of a buffer `first` accessed."""
    found = None
    for reuse in reversed(trace.reuses):
        if reuse.buffer == buffer and first.seq < reuse.at <= second.seq:
            if reuse.source is None or any(a.buffer == reuse.source for a in first.accesses):
                return reuse
            found = found or reuse
    return found


def reuse_locations(reuse: Reuse) -> tuple[Location, ...]:
    found: list[Location | None] = []
    if reuse.freed is not None:
        found.append(Location.of("freed", reuse.freed, "host", reuse.freed_step, "free"))
    if reuse.reused is not None:
        found.append(
            Location.of("reused", reuse.reused, reuse.stream, reuse.reused_step, "allocation")
        )
    return locations(*found)


def where(locs: tuple[Location, ...]) -> str:
    """The locations as one clause of prose: `role at file:line in function (agent, step n)`."""
    parts = []
    for loc in locs:
        who = ", ".join(p for p in (loc.agent, "" if loc.step is None else f"step {loc.step}") if p)
        parts.append(f"{loc.role} at {loc.text()}" + (f" ({who})" if who else ""))
    return "; ".join(parts)
