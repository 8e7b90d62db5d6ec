"""Hypothesis strategies for configurations, workloads and timings. Public: write your own `@given`
tests with them (see docs/scenarios.md).

Everything shrinks toward a small, quiet case: one request, no sharing, no conversation tree, no
memory pressure, no abort, arrival at 0, no follow-up, no reused uid, no anchored message, short
output, no model EOS, the small shape, no request at its row's end, nominal timing.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from overlapcheck.core.config import POLICIES, PolicyKind, SchedulerConfig
from overlapcheck.core.protocol import PoolFloor
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.reference.faults import FAULTS
from overlapcheck.scenarios.draws import EOS, US, often, rarely, tokens
from overlapcheck.scenarios.named import NAMED
from overlapcheck.scenarios.pressure import (
    CONCURRENT_IN_EIGHTHS,
    preemption_modes,
    preempts,
    pressure_eos,
    under_concurrent_pressure,
)
from overlapcheck.scenarios.rows import at_row_end
from overlapcheck.scenarios.speculative import speculating
from overlapcheck.scenarios.windows import AnchorDraw, linked, maybe_anchor

TIMED_KINDS = ("schedule", "launch", "process", "h2d", "forward", "d2h")
# A conversation tree (see `workloads`): one workload in BRANCHING_ONE_IN, up to TREE_REQUESTS
# requests (a root, its turns, branches off its shared prefixes at other depths).
BRANCHING_ONE_IN = 4
TREE_REQUESTS = 8
LONG_SHARES = 64  # a long output is drawn in 64ths of the room its row leaves
# Memory pressure on a cache in use (see `under_pressure`): one generated scenario in
# PRESSURE_ONE_IN; its pool holds PRESSURE_EIGHTHS (low, high) eighths of its workload's demand.
PRESSURE_ONE_IN = 4
PRESSURE_EIGHTHS = (2, 5)
SPECULATION_ONE_IN = 4  # speculative decoding on (draft_tokens > 0) in one generated scenario in 4
# CUDA graphs (`cuda_graph_bs`) in one generated scenario in 3: decode batches padded to the
# first captured size that fits. Sizes as upstream's default list starts ([1, 2, 4, 8, ...]) and
# sparse ones, so that a batch is padded by several dummy rows.
GRAPHS_ONE_IN = 3
GRAPH_SIZES = ((1, 2, 4, 8), (4,), (2, 8), (1, 2, 4))
# Requests at the end of their row, some sent again (`rows.at_row_end`), in one generated
# scenario in ROW_END_ONE_IN, of whichever kind it drew.
ROW_END_ONE_IN = 4


def speculative(faults: frozenset[str]) -> bool:
    """Whether a named fault in `faults` needs speculation on to be reachable."""
    return any(f in FAULTS and FAULTS[f].speculative for f in faults)


@st.composite
def configs(
    draw: st.DrawFn, faults: frozenset[str] = frozenset(), policy: PolicyKind | None = None
) -> SchedulerConfig:
    """Small pools, so that slots are reused, pages run out and chunks are cut. The queue policy
    is drawn too (shrinking toward `fcfs`) unless `policy` pins it. Occasionally a bigger shape
    (up to 8 slots, rows of 256) so that size-dependent bugs are reachable; it shrinks away."""
    page_size = draw(st.sampled_from((1, 2, 4)))
    big = rarely(draw, 8)
    kv_tokens = draw(st.sampled_from((1024, 512, 128) if big else (256, 96, 48, 32)))
    return SchedulerConfig(
        num_slots=draw(st.integers(1, 8 if big else 4)),
        num_pages=kv_tokens // page_size,
        page_size=page_size,
        max_extend_tokens=draw(st.sampled_from((64, 16, 8, 4))),
        max_seq_len=256 if big else 48,
        cache=draw(st.sampled_from(("radix", "naive"))),
        loop=draw(st.sampled_from(("overlap", "normal"))),
        policy=policy if policy is not None else draw(st.sampled_from(POLICIES)),
        faults=faults,
    )


@st.composite
def requests(
    draw: st.DrawFn,
    prefixes: Sequence[tuple[int, ...]],
    uid: int = 0,
    max_seq_len: int = 48,
    branching: bool = False,
) -> RequestSpec:
    """One request (see `_request`)."""
    return _request(draw, prefixes, uid, max_seq_len, branching)


@st.composite
def _anchorable_requests(
    draw: st.DrawFn, prefixes: Sequence[tuple[int, ...]], max_seq_len: int, branching: bool
) -> tuple[RequestSpec, AnchorDraw | None]:
    """A request and, now and then, the raw draw of an anchor for its arrival or its abort,
    drawn with it (deleting the request while shrinking deletes its anchor too), last (the
    shrinker's first move on the gate keeps the request as it was)."""
    spec = _request(draw, prefixes, 0, max_seq_len, branching)
    return spec, maybe_anchor(draw)


def _request(
    draw: st.DrawFn,
    prefixes: Sequence[tuple[int, ...]],
    uid: int,
    max_seq_len: int,
    branching: bool,
) -> RequestSpec:
    """One request. Its `after` and `uid` are raw draws that `workloads` maps onto earlier
    requests (so deleting a request while shrinking never leaves a dangling reference).

    `branching` (a conversation tree): the prompt takes a shared prefix cut at a drawn depth, so
    it matches part of what an earlier request left in the cache, follow-ups are common, and
    arrivals spread over the time the earlier ones decode."""
    prefix: tuple[int, ...] = ()
    if prefixes and (branching or draw(st.booleans())):
        prefix = prefixes[draw(st.integers(0, len(prefixes) - 1))]
        if branching:  # tokens cut off the end; 0 (the shrink target) keeps the whole prefix
            prefix = prefix[: len(prefix) - draw(st.integers(0, len(prefix) - 1))]
    suffix = tuple(draw(st.lists(tokens, min_size=0 if prefix else 1, max_size=12)))
    prompt = prefix + suffix
    if rarely(draw, 4):  # long-running: up to what the row holds
        # A share of the row, not a count: the same draw stays long (and valid) when shrinking
        # takes the big shape or prompt tokens away, so a failure that needs a long output
        # shrinks to the small row in one step instead of being stuck at hundreds of iterations.
        room = max(1, max_seq_len - len(prompt))
        max_tokens = max(1, room * draw(st.integers(1, LONG_SHARES)) // LONG_SHARES)
    else:
        max_tokens = draw(st.integers(1, 8))
    continuation: tuple[int, ...] = ()
    if draw(st.booleans()):  # stop at a scripted EOS after k tokens
        k = draw(st.integers(0, min(max_tokens, 8) - 1))
        continuation = tuple(draw(st.lists(tokens, min_size=k, max_size=k))) + (EOS,)
    abort_at, abort_iteration = None, None
    abort = "none"
    if not branching or rarely(draw, 4):  # a conversation's turns mostly run to their end
        abort = draw(st.sampled_from(("none", "time", "iteration")))
    if abort == "time":
        abort_at = draw(st.integers(0, 800)) * US
    elif abort == "iteration":
        abort_iteration = draw(st.integers(0, 40))
    arrival, arrival_iteration = 0.0, None
    if rarely(draw, 2 if branching else 4):  # a branch: sent while earlier requests decode
        arrival_iteration = draw(st.integers(0, 20))
    else:
        arrival = draw(st.integers(0, 1200 if branching else 400)) * US
    after, think = None, 0.0
    if rarely(draw, 2 if branching else 4):  # a follow-up turn (of the request `after` maps to)
        after = draw(st.integers(0, 7))
        think = draw(st.integers(0, 300)) * US
        prompt, continuation = suffix or (draw(tokens),), ()
        arrival, arrival_iteration = 0.0, None
    return RequestSpec(
        uid=uid,
        prompt=prompt,
        max_tokens=max_tokens,
        arrival=arrival,
        ignore_eos=draw(st.booleans()),
        continuation=continuation,
        abort_at=abort_at,
        arrival_iteration=arrival_iteration,
        abort_iteration=abort_iteration,
        after=after,
        think=think,
    )


@st.composite
def workloads(
    draw: st.DrawFn,
    max_requests: int = 5,
    max_seq_len: int = 48,
    tree_requests: int = TREE_REQUESTS,
) -> tuple[RequestSpec, ...]:
    """Requests with shared prefixes, EOS positions, aborts (by time or iteration), arrivals (by
    time or iteration), long outputs, follow-up turns and reused uids; now and then (one in
    `BRANCHING_ONE_IN`) a conversation tree instead. Shrinks to plain requests."""
    tree = rarely(draw, BRANCHING_ONE_IN)
    # NOTE: the plain requests are drawn even for a tree, before it: the shrinker's first move on
    # the gate (to 0) then lands on an example it already has, instead of reading the tree's
    # choices as plain ones, so a failure that does not need the tree drops it in one step.
    plain = draw(_workloads(max_requests, max_seq_len, branching=False))
    return draw(conversation_trees(tree_requests, max_seq_len)) if tree else plain


def conversation_trees(
    max_requests: int = TREE_REQUESTS, max_seq_len: int = 48
) -> st.SearchStrategy[tuple[RequestSpec, ...]]:
    """Workloads of shared conversations: every prompt starts with one of a few shared prefixes
    cut at a drawn depth, half the requests are turns that extend an earlier request, and the
    others arrive while earlier ones decode (half of them keyed to iterations). A radix cache
    then meets what plain prompts rarely give it: a request matching part of a cached prefix
    that a live turn holds locked (the node is split under the lock), and eviction around it."""
    return _workloads(max_requests, max_seq_len, branching=True)


@st.composite
def _workloads(
    draw: st.DrawFn, max_requests: int, max_seq_len: int, branching: bool
) -> tuple[RequestSpec, ...]:
    prefixes = draw(
        st.lists(
            st.lists(tokens, min_size=1, max_size=16).map(tuple),
            min_size=1 if branching else 0,
            max_size=2,
        )
    )
    # A list (not a count, then draws) so that the shrinker can delete any one request.
    drawn = draw(
        st.lists(
            _anchorable_requests(prefixes, max_seq_len, branching),
            min_size=1,
            max_size=max_requests,
        )
    )
    return linked(draw, drawn, max_seq_len)


@st.composite
def generated_scenarios(
    draw: st.DrawFn, faults: frozenset[str] = frozenset(), policy: PolicyKind | None = None
) -> Scenario:
    config = draw(configs(faults, policy))
    reqs = draw(workloads(max_seq_len=config.max_seq_len))
    concurrent = False
    if rarely(draw, PRESSURE_ONE_IN):
        # NOTE: drawn after the plain workload, as a tree is: shrinking the gate to 0 lands on
        # the example that workload already is.
        config, reqs = draw(under_pressure(config))
    elif preempts(faults) or often(draw, CONCURRENT_IN_EIGHTHS):
        config, reqs = draw(under_concurrent_pressure(config))
        concurrent = True
    config = draw(preemption_modes(config, faults))
    eos_probability = draw(st.sampled_from((0.0, 0.02, 0.1, 0.3))) if rarely(draw, 3) else 0.0
    if concurrent and not eos_probability:  # (a draw only there: see `pressure_eos`)
        eos_probability = draw(pressure_eos())
    # NOTE: drawn last, as the other kinds: shrinking the gate to 0 keeps the rest of the example.
    if rarely(draw, SPECULATION_ONE_IN) or speculative(faults):
        config, reqs = draw(speculating(config, reqs))
        config = spec_fault_pool(config, faults)
    # NOTE: drawn after everything else, for the same reason; schedulers without graphs ignore it
    if rarely(draw, GRAPHS_ONE_IN):
        config = replace(config, cuda_graph_bs=draw(st.sampled_from(GRAPH_SIZES)))
    # NOTE: drawn last of all: shrinking the gate to 0 lands on the example drawn before it.
    if rarely(draw, ROW_END_ONE_IN):
        config, reqs = draw(at_row_end(config, reqs))
    return Scenario("generated", config, reqs, eos_probability=eos_probability)


def spec_fault_pool(config: SchedulerConfig, faults: frozenset[str]) -> SchedulerConfig:
    """Speculation goes with any preemption mode, except in a search for a speculative fault
    that needs none: there pages are reserved, as preemption only dilutes that search."""
    if speculative(faults) and not preempts(faults):
        return replace(config, preemption="none", page_alloc="reserve")
    return config


@st.composite
def under_pressure(
    draw: st.DrawFn, config: SchedulerConfig
) -> tuple[SchedulerConfig, tuple[RequestSpec, ...]]:
    """Memory pressure on a cache in use: a conversation tree (prompts sharing prefixes with
    requests that finished, turns, arrivals while others decode) on a radix cache with two slots
    or more, in a pool drawn *after* the workload, as a share of what it needs.

    A pool drawn before the workload (`configs`) rarely runs out, and when it does, the cached
    prefix that a live request matched was touched by that match and is the newest in LRU order:
    eviction takes the older leaves first. What needs eviction to reach a prefix in use (a lock
    ignored, a freed page handed out while a request still reads it) needs several requests
    finishing while one holds its prefix, in a pool that keeps evicting: demand well above the
    pool, and concurrency."""
    reqs = draw(conversation_trees(TREE_REQUESTS, config.max_seq_len))
    config = replace(config, cache="radix", num_slots=max(2, config.num_slots))
    low, high = (tight_pool(config, reqs, k) for k in PRESSURE_EIGHTHS)
    # A number of pages, not a share: deleting a request while shrinking keeps the pool as it
    # was (while it stays in bounds), so the rest of the run does not change under the shrinker.
    return replace(config, num_pages=draw(st.integers(low, high))), reqs


def floored(scenario: Scenario, floor: PoolFloor) -> Scenario:
    """The scenario with its pool raised to what `floor` says the scheduler serves on (the
    scenario itself where it holds that already)."""
    pages = scenario.config.pages_for(floor(scenario.config))
    if scenario.config.num_pages >= pages:
        return scenario
    return scenario.with_config(num_pages=pages)


def tight_pool(config: SchedulerConfig, reqs: Sequence[RequestSpec], eighths: int) -> int:
    """A KV pool (in pages) of `eighths` eighths of the pages the requests need in all (each its
    longest prompt plus its output), never less than the largest one needs: every request can
    still be served, but not all at once, and not with every prefix kept."""
    scenario = Scenario("pressure", config, tuple(reqs))
    needs = [
        config.pages_for(min(scenario.prompt_bound(i) + r.max_tokens, config.max_seq_len))
        for i, r in enumerate(reqs)
    ]
    return max(*needs, -(-sum(needs) * eighths // 8))


@st.composite
def variations(draw: st.DrawFn, base: Scenario, faults: frozenset[str] = frozenset()) -> Scenario:
    """A named scenario under another loop / cache / page size / chunk size, arrivals jittered."""
    cfg = base.config
    page_size = draw(st.sampled_from(sorted({cfg.page_size, 1, 2, 4})))
    config = replace(
        cfg,
        loop=draw(st.sampled_from((cfg.loop, "normal" if cfg.loop == "overlap" else "overlap"))),
        cache=draw(st.sampled_from((cfg.cache, "naive" if cfg.cache == "radix" else "radix"))),
        page_size=page_size,
        num_pages=max(1, cfg.num_pages * cfg.page_size // page_size),
        max_extend_tokens=draw(st.sampled_from((cfg.max_extend_tokens, 16, 4))),
        faults=faults,
    )
    config = draw(preemption_modes(config, faults))
    if speculative(faults) and not cfg.draft_tokens:  # (a draw only where a fault needs it)
        config = replace(config, draft_tokens=draw(st.integers(1, 4)))
    if config.draft_tokens:
        config = spec_fault_pool(config, faults)
    jitter = draw(
        st.lists(st.integers(0, 200), min_size=len(base.requests), max_size=len(base.requests))
    )
    reqs = tuple(  # only timed arrivals move: iteration-keyed ones and follow-ups stay exact
        replace(r, arrival=r.arrival + j * US) if r.timed else r
        for r, j in zip(base.requests, jitter, strict=True)
    )
    return Scenario(base.name, config, reqs, base.description, eos_probability=base.eos_probability)


@st.composite
def mixed_scenarios(
    draw: st.DrawFn, faults: frozenset[str] = frozenset(), policy: PolicyKind | None = None
) -> Scenario:
    """Generated workloads, and now and then a variation of a named scenario: those carry shapes
    the generator rarely reaches at once (eight requests on two shared prefixes in a pool that
    must evict them, long chunked prompts). Shrinks to a generated one, or to the few requests
    of a variation that its failure needs."""
    if not rarely(draw, 8):
        return draw(generated_scenarios(faults, policy))
    if speculative(faults) and draw(st.booleans()):  # (a draw only where a fault needs it)
        base = NAMED["speculative"]()  # its shapes at once: acceptance, EOS, a skipped round
    else:
        base = NAMED[draw(st.sampled_from(sorted(NAMED)))]()
    if policy is not None:
        base = base.with_config(policy=policy)
    varied = draw(variations(base, faults))
    # Each request stays unless its draw is 0, the shrink target: the shrinker can take a
    # variation down to the requests its failure needs (`scenarios(name)` keeps them all).
    keep = draw(
        st.lists(st.integers(0, 63), min_size=len(varied.requests), max_size=len(varied.requests))
    )
    return replace(varied, requests=kept(varied.requests, [k > 0 for k in keep]))


def kept(reqs: Sequence[RequestSpec], keep: Sequence[bool]) -> tuple[RequestSpec, ...]:
    """The kept requests, with `after` and anchors renumbered; a follow-up of a dropped request
    is dropped too (its prompt grows out of that one's), so is an arrival anchored to one; an
    abort anchored to one is dropped. With none kept, the first stays."""
    index: dict[int, int] = {}
    out: list[RequestSpec] = []
    for i, (spec, k) in enumerate(zip(reqs, keep, strict=True)):
        arrival, abort = spec.arrival_after, spec.abort_after
        if not k or (spec.after is not None and spec.after not in index):
            continue
        if arrival is not None and arrival.request not in index:
            continue
        index[i] = len(out)
        if spec.after is not None:
            spec = replace(spec, after=index[spec.after])
        if arrival is not None:
            spec = replace(spec, arrival_after=replace(arrival, request=index[arrival.request]))
        if abort is not None:
            moved = index.get(abort.request)
            spec = replace(
                spec, abort_after=None if moved is None else replace(abort, request=moved)
            )
        out.append(spec)
    return tuple(out) or tuple(reqs[:1])


def scenarios(
    name: str = "all", faults: frozenset[str] = frozenset(), policy: PolicyKind | None = None
) -> st.SearchStrategy[Scenario]:
    """`all`: generated workloads (they shrink to the smallest counterexamples); a name: variations
    of that named scenario (its requests stay, so its counterexamples stay that size)."""
    if name == "all":
        return mixed_scenarios(faults, policy)
    base = NAMED[name]()
    if policy is not None:
        base = base.with_config(policy=policy)
    return variations(base, faults)


class HypothesisDelay:
    """Operation delays drawn lazily from Hypothesis while the simulation runs.

    Swarm testing: each example turns delays on for a subset of operation kinds only; a site of an
    enabled kind gets up to 3x its nominal duration extra. PCT-style: a few sites get one large
    delay, in units of the profile's forward time (so a calibrated, slower profile gets
    proportionally larger spikes). Draws shrink toward 0, i.e. toward the nominal profile.
    """

    def __init__(self, data: st.DataObject, forward: float = 60 * US) -> None:
        self.data = data
        self.unit = forward / 60  # one "µs" of a spike at the default profile's scale
        self.enabled = tuple(k for k in TIMED_KINDS if data.draw(st.booleans(), label=f"delay {k}"))
        self.spikes = data.draw(
            st.dictionaries(st.integers(0, 400), st.integers(50, 2000), max_size=3), label="spikes"
        )

    def delay(self, site: int, kind: str, nominal: float) -> float:
        extra = 0.0
        if kind in self.enabled:
            extra = self.data.draw(st.integers(0, 300)) * nominal / 100
        return extra + self.spikes.get(site, 0) * self.unit

    def rank_source(self) -> RankJitter:
        """Another rank's iteration (`SplitsForRanks`): the same kinds and spikes, its jitter
        from one seed drawn here (it shrinks to 0: no jitter), so that a rank in a process of
        its own draws its delays there, not one round trip here per operation."""
        seed = self.data.draw(st.integers(0, 2**32 - 1), label="rank jitter")
        return RankJitter(self.enabled, self.spikes, self.unit, seed)


class RankJitter:
    """`HypothesisDelay` for one iteration of a rank besides rank 0: its draws from a generator
    seeded by one Hypothesis draw (0: nominal but for the spikes)."""

    def __init__(
        self, enabled: tuple[str, ...], spikes: dict[int, int], unit: float, seed: int
    ) -> None:
        self.args = (enabled, spikes, unit, seed)
        self.enabled = enabled if seed else ()
        self.spikes = spikes
        self.unit = unit
        self.rng = random.Random(seed)

    def __reduce__(self) -> tuple[type[RankJitter], tuple[Any, ...]]:
        return RankJitter, self.args  # the seed, not the generator's 2.5 KB of state

    def delay(self, site: int, kind: str, nominal: float) -> float:
        extra = 0.0
        if kind in self.enabled:
            extra = self.rng.randint(0, 300) * nominal / 100
        return extra + self.spikes.get(site, 0) * self.unit
