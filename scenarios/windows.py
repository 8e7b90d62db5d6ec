"""Lifecycle windows in generated workloads: a request's arrival or abort anchored to a lifecycle
point of a request plus a few iterations (`core.scenario.Anchor`), and reused uids, drawn for
any workload kind (plain requests, conversation trees, requests that outgrow the pool together).

An anchor is drawn with its request, last: deleting the request while shrinking deletes its
anchor, and switching the anchor off keeps every other choice. `linked` maps the raw draws onto
earlier requests once the list is drawn, so no deletion leaves a dangling reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from hypothesis import strategies as st

from overlapcheck.core.scenario import Anchor, RequestSpec
from overlapcheck.scenarios.draws import EOS, rarely

# One request in ANCHOR_ONE_IN arrives, or is aborted, at a lifecycle point of a request plus up
# to ANCHOR_ITERATIONS iterations; one workload in REUSE_ONE_IN reuses uids.
ANCHOR_ONE_IN = 4
ANCHOR_ITERATIONS = 2
REUSE_ONE_IN = 4

# (kind: 1 arrival / 2 abort, the anchor's request as a raw draw, point, iterations,
# whether an anchored arrival takes its anchor's uid, whether the anchor's request stops at a
# scripted EOS): mapped by `anchored` and `ends_early`. Weighted toward what opens a window (an
# arrival, at a finish or an abort, no offset); each shrinks to its first value.
AnchorDraw = tuple[int, int, str, int, bool, bool]
anchor_draws = st.tuples(
    st.sampled_from((1, 1, 2)),
    st.integers(0, 7),
    st.sampled_from(
        ("finished", "abort", "extra-round", "last-launch", "first-chunk", "finished", "abort")
    ),
    st.integers(0, 2 * ANCHOR_ITERATIONS + 1).map(lambda k: max(0, k - ANCHOR_ITERATIONS - 1)),
    st.booleans(),
    st.booleans(),
)


def maybe_anchor(draw: st.DrawFn) -> AnchorDraw | None:
    """Now and then (one request in ANCHOR_ONE_IN) the raw draw of an anchor; shrinks to None."""
    return draw(anchor_draws) if rarely(draw, ANCHOR_ONE_IN) else None


def linked(
    draw: st.DrawFn,
    drawn: Sequence[tuple[RequestSpec, AnchorDraw | None]],
    max_seq_len: int,
) -> tuple[RequestSpec, ...]:
    """The drawn requests with their raw `after` mapped onto an earlier request, uids reused now
    and then (one workload in REUSE_ONE_IN), and each anchor mapped onto its request."""
    specs = [spec for spec, _ in drawn]
    reuse: list[int] = []  # i-th entry: request i + 1 takes the uid of an earlier one (0: fresh)
    if rarely(draw, REUSE_ONE_IN):
        reuse = draw(st.lists(st.integers(0, 7), max_size=len(specs)))
    out: list[RequestSpec] = []
    for i, spec in enumerate(specs):
        after = None if spec.after is None or i == 0 else spec.after % i
        uid = i
        if 0 < i <= len(reuse) and reuse[i - 1]:  # 0 (the shrink target): a fresh uid
            uid = out[reuse[i - 1] % i].uid
        if after is None and spec.after is not None:  # the first request cannot follow one
            spec = replace(spec, think=0.0)
        out.append(replace(spec, uid=uid, after=after))
    for i, (_, raw) in enumerate(drawn):
        if raw is None:
            continue
        out[i] = anchored(out, i, raw)
        anchor = out[i].arrival_after or out[i].abort_after
        if raw[5] and anchor is not None:
            out[anchor.request] = ends_early(out[anchor.request], max_seq_len)
    return tuple(out)


def ends_early(spec: RequestSpec, max_seq_len: int) -> RequestSpec:
    """`spec` stopping at a scripted EOS within its output: under overlap its extra round is
    then in flight after its finish, the window an anchored message aims at. A follow-up's
    prompt is not known in advance, so it cannot be scripted: it stays as it is."""
    if spec.after is not None:
        return spec
    room = max(1, min(spec.max_tokens, max_seq_len - len(spec.prompt)))
    kept = tuple(t for t in spec.continuation if t != EOS)[: room - 1]
    return replace(spec, continuation=(*kept, EOS), ignore_eos=False)


def anchored(out: Sequence[RequestSpec], i: int, draw: AnchorDraw) -> RequestSpec:
    """Request `i` of `out` with its arrival or its abort anchored to a lifecycle point of an
    earlier request (an abort: of itself too). An anchored arrival that takes its anchor's uid
    is a reused uid inside the window (a duplicate while that one is live, which must be
    rejected); a follow-up's arrival is anchored to the turn it follows."""
    kind, raw, point, iterations, same_uid, _ = draw
    spec = out[i]
    if kind == 1 and i > 0:
        target = spec.after if spec.after is not None else raw % i
        uid = out[target].uid if same_uid else spec.uid
        return replace(
            spec,
            uid=uid,
            arrival=0.0,
            arrival_iteration=None,
            think=0.0,
            arrival_after=Anchor(target, point, iterations),
        )
    if kind == 2:
        target = raw % (i + 1)
        if target == i and point == "abort":  # its own abort cannot anchor its abort
            point = "last-launch"
        return replace(
            spec, abort_at=None, abort_iteration=None, abort_after=Anchor(target, point, iterations)
        )
    return spec
