"""Requests at the end of their row: prompts that leave a few tokens of `max_seq_len`, outputs
that run into those last tokens, and requests sent again once their prompt is cached.

Plain prompts are at most 28 tokens of a 48-token row, so what happens at a length boundary
(the last position a row holds, a page or a lookahead of drafts that would pass it, a request
admitted one token from its end because all but its last token is cached, a request preempted
near its end and resumed) is rarely reached. `at_row_end` takes a drawn workload of any kind and
stretches most of its prompts to a few tokens short of the row, their outputs up to its end, and
sends some of those requests again (a client's retry: the same prompt, arriving at a lifecycle
point of the first, on the prefix cache), in a pool raised to hold the longest: a tight one
where the workload's was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import strategies as st

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.scenario import Anchor, RequestSpec, Scenario
from overlapcheck.scenarios.speculative import periodic

# A stretched prompt leaves 1..ROW_ROOM tokens of its row (more than 1 + the most drafts drawn,
# so a lookahead that passes the row's end is reachable from either side), its output up to them.
ROW_ROOM = 8
# Up to RESENDS_MAX requests sent again, each at a lifecycle point of its first (weighted to
# `finished`: its prompt's pages cached and unreferenced) plus up to 2 iterations.
RESENDS_MAX = 2
RESEND_POINTS = ("finished", "finished", "last-launch", "first-chunk", "extra-round")

# (stretched unless 0, room): each shrinks to its first value (not stretched, 1 token of room).
_stretch = st.tuples(st.integers(0, 3), st.integers(1, ROW_ROOM))
# (the request as a raw draw, point, iterations, whether under the first's uid)
_resend = st.tuples(
    st.integers(0, 7), st.sampled_from(RESEND_POINTS), st.integers(0, 2), st.booleans()
)


@st.composite
def at_row_end(
    draw: st.DrawFn, config: SchedulerConfig, reqs: tuple[RequestSpec, ...]
) -> tuple[SchedulerConfig, tuple[RequestSpec, ...]]:
    """`reqs` with most prompts stretched to leave 1..ROW_ROOM tokens of the row (their own
    tokens repeated), each such output running up to the row's end, and up to RESENDS_MAX of
    those requests sent again on the prefix cache; the pool raised to what the longest needs
    alone (never lowered). Follow-ups, and the turns they follow, stay as they are (a follow-up's
    prompt grows out of what its turn got). Shrinks to `reqs` as they were."""
    row = config.max_seq_len
    followed = {spec.after for spec in reqs}
    stretches = draw(st.lists(_stretch, min_size=len(reqs), max_size=len(reqs)))
    out, ends = list(reqs), []
    for i, (spec, (on, room)) in enumerate(zip(reqs, stretches, strict=True)):
        if on and spec.after is None and i not in followed and spec.prompt:
            out[i] = stretched(spec, row, room)
            ends.append(i)
    resends = draw(st.lists(_resend, max_size=RESENDS_MAX)) if ends else []
    for raw, point, iterations, same_uid in resends:
        out.append(sent_again(out, ends[raw % len(ends)], point, iterations, same_uid))
    if resends:  # a retry is sent to meet its prompt's cached pages
        config = replace(config, cache="radix")
    return replace(config, num_pages=max(config.num_pages, longest(config, out))), tuple(out)


def longest(config: SchedulerConfig, reqs: Sequence[RequestSpec]) -> int:
    """The pages the longest request needs alone (its longest prompt and its output, in the
    row): the smallest pool that rejects none of `reqs`."""
    scenario = Scenario("row-end", config, tuple(reqs))
    return max(
        config.pages_for(min(scenario.prompt_bound(i) + r.max_tokens, config.max_seq_len))
        for i, r in enumerate(reqs)
    )


def stretched(spec: RequestSpec, row: int, room: int) -> RequestSpec:
    """`spec` with its prompt (its own tokens repeated, or cut) leaving `room` tokens of a row of
    `row`, and its output clamped to them; a scripted continuation stays (past max_tokens the
    model's script is never read)."""
    prompt = periodic(spec.prompt, max(1, row - room))
    return replace(spec, prompt=prompt, max_tokens=min(spec.max_tokens, row - len(prompt)))


def sent_again(
    reqs: Sequence[RequestSpec], first: int, point: str, iterations: int, same_uid: bool
) -> RequestSpec:
    """Request `first` sent again: the same prompt, output and script, arriving at `point` of
    the first plus `iterations`, under its uid or a fresh one, never aborted."""
    spec = reqs[first]
    uid = spec.uid if same_uid else max(r.uid for r in reqs) + 1
    return RequestSpec(
        uid,
        spec.prompt,
        max_tokens=spec.max_tokens,
        ignore_eos=spec.ignore_eos,
        continuation=spec.continuation,
        arrival_after=Anchor(first, point, iterations),
    )
