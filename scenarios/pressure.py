"""Draws that make on-demand schedulers preempt: preemption modes, and pools sized against what
requests running at once need.

A pool sized for reservation at admission (`strategies.tight_pool`: a share of what all requests
need in all) runs out for a scheduler that reserves, which then only waits. A scheduler that takes
pages on demand admits on the prompt alone, so it runs out later, while decoding, and only when
the requests it runs *at once* outgrow the pool: `concurrent_pool` holds their prompts and only a
share of the outputs they grow into.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import strategies as st

from overlapcheck.core.config import PREEMPT_POLICIES, PreemptionKind, SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.reference.faults import PREEMPTION_FAULT_CONFIG
from overlapcheck.scenarios.draws import EOS, US, rarely, tokens
from overlapcheck.scenarios.windows import AnchorDraw, linked, maybe_anchor

# CONCURRENT_IN_EIGHTHS eighths of the generated scenarios not already under memory pressure get
# a workload of requests that run at once, in a pool that holds their prompts and CONCURRENT_EIGHTHS
# (low, high) eighths of their outputs (and two slots or more).
CONCURRENT_IN_EIGHTHS = 7
CONCURRENT_EIGHTHS = (0, 2)
DRAWN_MODES: tuple[PreemptionKind, ...] = ("none", "recompute", "swap")
# One request in ABORT_ONE_IN of a concurrent workload is aborted (by time or iteration), one in
# EOS_ONE_IN stops at a scripted EOS: both end requests before they outgrow the pool.
ABORT_ONE_IN = 6
EOS_ONE_IN = 4
# One request in IGNORE_EOS_ONE_IN of a concurrent workload ignores EOS: the others may stop at a
# model EOS (`pressure_eos`), an end no scheduler can see coming.
IGNORE_EOS_ONE_IN = 4
# A concurrent workload with no model EOS drawn otherwise gets one of these (shrinks to none).
PRESSURE_EOS = (0.0, 0.05, 0.1, 0.2)


def preempts(faults: frozenset[str]) -> bool:
    """Whether a fault in `faults` needs preemption (then every generated scenario is one whose
    requests outgrow the pool together)."""
    return not faults.isdisjoint(PREEMPTION_FAULT_CONFIG)


@st.composite
def preemption_modes(
    draw: st.DrawFn, config: SchedulerConfig, faults: frozenset[str] = frozenset()
) -> SchedulerConfig:
    """How the reference makes room, drawn (shrinks to no preemption, pages reserved); pinned to
    what a preemption fault in `faults` needs."""
    pinned = [PREEMPTION_FAULT_CONFIG[f] for f in sorted(faults & PREEMPTION_FAULT_CONFIG.keys())]
    if pinned:
        mode, policy = pinned[0]
    else:
        mode = draw(st.sampled_from(DRAWN_MODES))
        if mode == "none":
            return config
        policy = draw(st.sampled_from(PREEMPT_POLICIES))
    return replace(config, preemption=mode, page_alloc="on-demand", preempt_policy=policy)


def concurrent_pool(config: SchedulerConfig, reqs: Sequence[RequestSpec], eighths: int) -> int:
    """A KV pool (in pages) that holds the prompts of the first `num_slots` requests to arrive
    (those that run at once) and `eighths` eighths of the outputs they grow into, never less than
    the largest request needs alone (so every request can still be served: the rejection rule).
    A scheduler that admits on the prompt then runs out while those requests decode."""
    scenario = Scenario("pressure", config, tuple(reqs))
    sizes = [
        (scenario.prompt_bound(i), min(r.max_tokens, config.max_seq_len - 1))
        for i, r in enumerate(reqs)
    ]
    order = sorted(range(len(reqs)), key=lambda i: (_arrival(reqs[i]), i))
    first = [sizes[i] for i in order[: config.num_slots]]
    prompts = sum(config.pages_for(p) for p, _ in first)
    outputs = sum(config.pages_for(p + m) - config.pages_for(p) for p, m in first)
    largest = max(config.pages_for(min(p + m, config.max_seq_len)) for p, m in sizes)
    return max(largest, prompts + outputs * eighths // 8)


def _arrival(spec: RequestSpec) -> float:
    """When a request arrives, as far as the workload says up front (follow-ups and anchored
    arrivals: last)."""
    if spec.after is not None or spec.arrival_after is not None:
        return float("inf")
    return spec.arrival if spec.arrival_iteration is None else spec.arrival_iteration * 1e-5


@st.composite
def _concurrent_request(
    draw: st.DrawFn, width: int, shared: tuple[int, ...], share: int
) -> tuple[RequestSpec, AnchorDraw | None]:
    own = tuple(draw(st.lists(tokens, min_size=1, max_size=12)))
    prompt = ((shared if draw(st.booleans()) else ()) + own)[: width - 1]
    room = width - len(prompt)
    max_tokens = max(1, room * (share + draw(st.integers(0, 2))) // 16)
    continuation: tuple[int, ...] = ()
    if rarely(draw, EOS_ONE_IN):  # stop at a scripted EOS after k tokens
        k = draw(st.integers(0, min(max_tokens, 8) - 1))
        continuation = tuple(draw(st.lists(tokens, min_size=k, max_size=k))) + (EOS,)
    abort_at, abort_iteration = None, None
    if rarely(draw, ABORT_ONE_IN):  # by time or by iteration, as in a plain workload
        if draw(st.booleans()):
            abort_iteration = draw(st.integers(0, 40))
        else:
            abort_at = draw(st.integers(0, 800)) * US
    spec = RequestSpec(
        0,
        prompt,
        max_tokens=max_tokens,
        arrival=draw(st.integers(0, 20)) * US,
        ignore_eos=rarely(draw, IGNORE_EOS_ONE_IN),
        continuation=continuation,
        abort_at=abort_at,
        abort_iteration=abort_iteration,
    )
    return spec, maybe_anchor(draw)


@st.composite
def concurrent_workloads(draw: st.DrawFn, config: SchedulerConfig) -> tuple[RequestSpec, ...]:
    """Requests that arrive close together and decode long enough to outgrow what their prompts
    took (a similar share of the row each), now and then sharing a prefix, stopping at a scripted
    EOS (or ignoring it) or aborted, with lifecycle windows and reused uids as in a plain
    workload (`windows.linked`). Two or more: a lone request fits a pool sized for it alone and
    never preempts (a failure that needs one request shrinks to it by deleting the others)."""
    width = config.max_seq_len
    shared = tuple(draw(st.lists(tokens, max_size=8)))
    # One output share for all (so no single request outgrows the rest), jittered per request.
    share = draw(st.integers(3, 8))
    request = _concurrent_request(width, shared, share)
    drawn = draw(st.lists(request, min_size=2, max_size=config.num_slots + 2))
    if draw(st.booleans()):  # one more up front: fewer pairs (shrinks away)
        drawn = [draw(request), *drawn]
    return linked(draw, drawn, width)


@st.composite
def under_concurrent_pressure(
    draw: st.DrawFn, config: SchedulerConfig
) -> tuple[SchedulerConfig, tuple[RequestSpec, ...]]:
    """Two slots or more, a workload of requests that run at once (`concurrent_workloads`), and a
    pool drawn against their concurrent demand (a page count: shrinking a request away keeps the
    pool while it stays in bounds)."""
    config = replace(config, num_slots=max(2, config.num_slots))
    reqs = draw(concurrent_workloads(config))
    low, high = (concurrent_pool(config, reqs, k) for k in CONCURRENT_EIGHTHS)
    return replace(config, num_pages=draw(st.integers(low, high))), reqs


def pressure_eos() -> st.SearchStrategy[float]:
    """A model EOS probability for a workload under concurrent pressure (shrinks to 0). A
    scheduler preempts with a step in flight: a request it preempts may be one whose in-flight
    token ends it. A finish by length it can see coming (and may leave out of the preemption);
    one at an EOS it cannot, so the preempted request's in-flight result must be dropped or
    finished once (SGLang #1860). Scripted EOS positions (`EOS_ONE_IN`) land early, before the
    pool is outgrown; a per-token EOS meets every preemption with that chance."""
    return st.sampled_from(PRESSURE_EOS)
