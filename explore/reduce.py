"""Shrinking a failure as a workload: requests, their fields, the configuration and the delays
cut directly, each candidate one run with the same delays by site.

Hypothesis shrinks the choices an example was drawn from. Where a failure needs several requests
in a pool under pressure, its shrinker walks hundreds of choices (prompt tokens, the delay of
every timed operation, draws of the workload kinds not taken) and took a thousand runs and more
for one failure. Here a candidate deletes a request, drops an abort or an anchor, halves a prompt
or an output, takes the delays away or turns a switch of the configuration off: a few runs per
request and field, a few passes in all. A candidate is kept when the same invariant still breaks
and the failure is smaller in `size`'s order, so the passes end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import NamedTuple

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile, ReplayDelay, Timing
from overlapcheck.core.config import ConfigError, SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import RunResult
from overlapcheck.scenarios.strategies import kept

FIRST_TOKEN = 3  # the smallest token id the generator draws (`scenarios.draws.tokens`)
# One run of a candidate: (scenario, delays by site) -> the run and the delays it drew.
Run = Callable[[Scenario, dict[int, float]], tuple[RunResult, dict[int, float]]]


class Reduced(NamedTuple):
    """The smallest failure the passes reached, its delays, how many candidates ran, and
    whether `stop` ended the passes early."""

    result: RunResult
    draws: dict[int, float]
    runs: int
    stopped: bool = False


def size(scenario: Scenario, draws: dict[int, float]) -> tuple[int, int, int, int, int]:
    """How big a failure is, for a person reading it: requests, then the features they use
    (aborts, anchors, scripted stops, late arrivals; switches of the configuration), then
    tokens, then delayed operations, then the token ids and pages (small ones read best)."""
    reqs = scenario.requests
    features = sum(_features(r) for r in reqs) + _config_features(scenario.config)
    features += scenario.eos_probability > 0
    tokens = sum(len(r.prompt) + r.max_tokens + len(r.continuation) for r in reqs)
    ids = sum(sum(r.prompt) + sum(r.continuation) + r.uid + _iterations(r) for r in reqs)
    return (len(reqs), features, tokens, len(draws), ids + scenario.config.num_pages)


def _iterations(r: RequestSpec) -> int:
    return (r.arrival_iteration or 0) + (r.abort_iteration or 0)


def _features(r: RequestSpec) -> int:
    return (
        (r.abort_at is not None or r.abort_iteration is not None)
        + (r.abort_after is not None)
        + (r.arrival_after is not None)
        + bool(r.continuation)
        + (r.arrival > 0 or r.arrival_iteration is not None)
        + r.ignore_eos
        + (r.after is not None and r.think > 0)
    )


def _config_features(c: SchedulerConfig) -> int:
    return (
        c.num_slots
        + (c.preemption != "none")
        + (c.page_alloc != "reserve")
        + (c.draft_tokens > 0)
        + (c.cache == "radix")
        + (c.policy != "fcfs")
    )


def _request_cuts(r: RequestSpec) -> Iterator[RequestSpec]:
    """Simpler versions of one request, most of a cut first."""
    if r.abort_at is not None or r.abort_iteration is not None or r.abort_after is not None:
        yield replace(r, abort_at=None, abort_iteration=None, abort_after=None)
    if r.arrival_after is not None and r.after is None:
        yield replace(r, arrival_after=None)
    if r.arrival > 0 or r.arrival_iteration is not None:
        yield replace(r, arrival=0.0, arrival_iteration=None)
    if r.think > 0:
        yield replace(r, think=0.0)
    if r.abort_iteration:  # an iteration earlier (deleting a request moves the others up)
        yield replace(r, abort_iteration=r.abort_iteration - 1)
    if r.arrival_iteration:
        yield replace(r, arrival_iteration=r.arrival_iteration - 1)
    if r.continuation:
        yield replace(r, continuation=())
    if r.ignore_eos:
        yield replace(r, ignore_eos=False)
    if r.max_tokens > 1:
        yield replace(r, max_tokens=1)
        yield replace(r, max_tokens=(r.max_tokens + 1) // 2)
    if len(r.prompt) > 1:
        yield replace(r, prompt=r.prompt[: (len(r.prompt) + 1) // 2])
        yield replace(r, prompt=r.prompt[len(r.prompt) // 2 :])
        yield replace(r, prompt=r.prompt[:-1])
        yield replace(r, prompt=r.prompt[1:])
    if len(r.continuation) > 1:
        yield replace(r, continuation=r.continuation[len(r.continuation) // 2 :])
        yield replace(r, continuation=r.continuation[1:])


def _config_cuts(c: SchedulerConfig) -> Iterator[Callable[[], SchedulerConfig]]:
    """Switches of the configuration to turn off (each made when asked: some combinations are
    not allowed, and making one raises)."""
    if c.draft_tokens:
        yield lambda: replace(c, draft_tokens=0)
    if c.preemption != "none" or c.page_alloc != "reserve":
        yield lambda: replace(c, preemption="none", page_alloc="reserve")
    if c.policy != "fcfs":
        yield lambda: replace(c, policy="fcfs")
    if c.cache == "radix":
        yield lambda: replace(c, cache="naive")
    if c.num_slots > 1:
        yield lambda: replace(c, num_slots=c.num_slots - 1)
    if c.num_pages > 1:  # a smaller pool (it may now reject a request: then it fails to cut)
        yield lambda: replace(c, num_pages=c.num_pages * 3 // 4 or 1)
        yield lambda: replace(c, num_pages=c.num_pages - 1)


def _renamed(scenario: Scenario) -> Scenario:
    """The workload with its token ids renamed to the smallest ones in order of first use
    (3, 4, ...; EOS stays): equal tokens stay equal, so every shared prefix stays shared; and
    its uids to 0, 1, ... in order of first use (a reused uid stays reused)."""
    eos = scenario.config.eos_token_id
    free = (t for t in range(FIRST_TOKEN, scenario.config.vocab_size) if t != eos)
    names: dict[int, int] = {eos: eos}

    def name(t: int) -> int:
        if t not in names:
            names[t] = next(free)
        return names[t]

    uids: dict[int, int] = {}
    reqs = tuple(
        replace(
            r,
            uid=uids.setdefault(r.uid, len(uids)),
            prompt=tuple(map(name, r.prompt)),
            continuation=tuple(map(name, r.continuation)),
        )
        for r in scenario.requests
    )
    return replace(scenario, requests=reqs)


def _candidates(
    scenario: Scenario, draws: dict[int, float]
) -> Iterator[tuple[Scenario, dict[int, float]]]:
    reqs = scenario.requests
    for i in reversed(range(len(reqs))):  # whole requests first, the last one first
        fewer = kept(reqs, [j != i for j in range(len(reqs))])
        if len(fewer) < len(reqs):
            yield replace(scenario, requests=fewer), draws
        # An abort anchored to the deleted request's point, anchored to its own instead: the
        # same window, one request fewer.
        own = tuple(_own_abort(r, j) if _aborts_at(r, i) else r for j, r in enumerate(reqs))
        if own != reqs:
            fewer = kept(own, [j != i for j in range(len(reqs))])
            yield replace(scenario, requests=fewer), draws
    if draws:
        yield scenario, {}
        yield scenario, {site: v / 2 for site, v in draws.items()}
    if scenario.eos_probability > 0:
        yield replace(scenario, eos_probability=0.0), draws
    renamed = _renamed(scenario)
    if renamed != scenario:
        yield renamed, draws
    for make in _config_cuts(scenario.config):
        try:
            config = make()
        except ConfigError:  # a combination the configuration does not allow
            continue
        yield replace(scenario, config=config), draws
    for i, r in enumerate(reqs):
        for simpler in _request_cuts(r):
            yield replace(scenario, requests=(*reqs[:i], simpler, *reqs[i + 1 :])), draws


def _aborts_at(r: RequestSpec, i: int) -> bool:
    return r.abort_after is not None and r.abort_after.request == i


def _own_abort(r: RequestSpec, j: int) -> RequestSpec:
    """Request `j` with its anchored abort moved to its own lifecycle point."""
    assert r.abort_after is not None
    at = "last-launch" if r.abort_after.at == "abort" else r.abort_after.at
    return replace(r, abort_after=replace(r.abort_after, request=j, at=at))


def _valid(scenario: Scenario) -> bool:
    return all(r.problem(i) is None for i, r in enumerate(scenario.requests))


def reduce_failure(
    result: RunResult,
    draws: dict[int, float],
    run: Run,
    max_runs: int,
    on_smaller: Callable[[RunResult, dict[int, float]], None] | None = None,
    stop: Callable[[], bool] = lambda: False,
    admissible: Callable[[Scenario], bool] = lambda _: True,
) -> Reduced:
    """Cut the failing `result` (run with `draws`) down while its first invariant still breaks:
    pass after pass over every candidate of the smallest failure so far, until a pass keeps
    none or `max_runs` candidates have run, or `stop` says so (polled before each run).
    `on_smaller` sees each smaller failure; a candidate that is not `admissible` (a pool below
    what the scheduler declares it serves on) is never run."""
    invariant = result.violations[0].invariant
    best, best_draws = result, draws
    best_size = size(result.scenario, draws)
    tried: set[tuple[Scenario, tuple[tuple[int, float], ...]]] = set()
    runs = 0
    improved = True
    while improved and runs < max_runs:
        improved = False
        # NOTE: after a cut is kept, the candidates of the new best are taken up at the same
        # position, not from the top: the cuts before it were just tried and would fail again.
        candidates = list(_candidates(best.scenario, best_draws))
        k = 0
        while k < len(candidates) and runs < max_runs:
            scenario, delays = candidates[k]
            k += 1
            key = (scenario, tuple(sorted(delays.items())))
            if key in tried or size(scenario, delays) >= best_size or not _valid(scenario):
                continue
            if not admissible(scenario):
                continue
            if stop():
                return Reduced(best, best_draws, runs, stopped=True)
            tried.add(key)
            runs += 1
            candidate, drawn = run(scenario, delays)
            if not candidate.violations or candidate.violations[0].invariant != invariant:
                continue
            best, best_draws = candidate, drawn
            best_size = size(candidate.scenario, drawn)
            improved = True
            if on_smaller is not None:
                on_smaller(best, best_draws)
            candidates = list(_candidates(best.scenario, best_draws))
            k -= 1
    return Reduced(best, best_draws, runs)


def replay_runner(
    profile: Profile, run_example: Callable[[Scenario, SimBackend], RunResult]
) -> Run:
    """Candidates run with the recorded delays by site (`ReplayDelay`)."""

    def run(scenario: Scenario, draws: dict[int, float]) -> tuple[RunResult, dict[int, float]]:
        timing = Timing(profile, ReplayDelay(draws))
        return run_example(scenario, SimBackend(timing)), dict(timing.draws)

    return run
