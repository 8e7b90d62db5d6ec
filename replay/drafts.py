"""Drafts that make a speculative replay take the recorded steps on any engine.

A speculative run's schedule follows acceptance: how many of each step's drafts the model agreed
with decides where the next step starts, how long it is, when a request finishes and so which
batches, copies and waits follow. The simulator's toy model and a real model agree with different
drafts, so a real engine drafting by prompt lookup leaves the recorded schedule at the first
step that accepts differently: other batches, other op ids, no gate finds its op.

In a replay the scheduler drafts with `ReplayDrafts` instead (`core/speculative.py`,
`TakesDrafter`). For the recorded step of a request in a batch it proposes as many drafts as that
step had: the engine's own continuation at the step's positions for exactly as many as the step
accepted, then a token that is certainly not the engine's there, then the same kind of filler.
Acceptance, batch composition and op ids then follow the recorded run, so the gates hold the same
ops. Outputs stay the engine's greedy tokens whatever the drafts (a wrong draft changes only how
much a step emits), so the oracle judges them as in any run.

The engine's continuation is the sequential reference's greedy output (what the CPU engine emits,
exactly); where a bf16 engine's own tokens differ from it at a near-tie, `Rows.learn` takes them
from a run in which the oracle found them right. A step the record does not have (the run left the
recorded schedule: a forced race corrupted something; or a request planned but not launched, as
when preemption took it) gets prompt lookup's drafts. `compare` tells, after a run, which verify
steps took the recorded acceptance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.scenario import Scenario, user_msg
from overlapcheck.core.speculative import Drafter, DraftQuery
from overlapcheck.core.trace import Verified
from overlapcheck.harness.runner import RunResult
from overlapcheck.reference.drafter import PromptLookup

Greedy = Callable[[tuple[int, ...], int], list[int]]


@dataclass(frozen=True, slots=True)
class Step:
    """A recorded verify step of one request: where its drafts went, how many, how many agreed."""

    first: int  # the row position of its first draft
    drafts: int
    accepted: int


def recorded_steps(verified: Iterable[Verified]) -> dict[tuple[int, int], Step]:
    """The steps of a run by (batch, uid), from its trace (`Trace.verified`, the simulator's)."""
    steps = {}
    for v in verified:
        if v.first < 0:
            raise ValueError(f"batch {v.batch}: the run did not record where its drafts went")
        steps[(v.batch, v.uid)] = Step(v.first, v.drafts, v.accepted)
    return steps


@dataclass
class Rows:
    """Each request's row as the engine fills it: its prompt, then the engine's own tokens."""

    by_uid: dict[int, list[tuple[tuple[int, ...], list[int]]]] = field(default_factory=dict)

    @classmethod
    def of(cls, scenario: Scenario, greedy: Greedy) -> Rows:
        """The rows of a prepared scenario's requests (its prompts in the engine's vocabulary),
        continued by `greedy` (the reference's greedy tokens, EOS not cut) as far as each may
        run."""
        rows = cls()
        cfg = scenario.config
        for spec in scenario.requests:
            msg = user_msg(spec)
            if rejection(cfg, msg, live=False) is None:
                rows.put(spec.uid, spec.prompt, greedy(spec.prompt, max_output(cfg, msg)))
        return rows

    def put(self, uid: int, prompt: tuple[int, ...], tokens: list[int]) -> None:
        rows = self.by_uid.setdefault(uid, [])
        for i, (known, old) in enumerate(rows):
            if known == prompt:
                # the learned tokens first, the older continuation past them
                rows[i] = (prompt, list(tokens) + old[len(tokens) :])
                return
        rows.append((prompt, list(tokens)))

    def learn(self, result: RunResult) -> None:
        """Take the engine's own tokens from `result` for each request the oracle found right
        (a bf16 engine's near-ties), so that later runs draft what this engine emits."""
        wrong = {u for v in result.violations if v.invariant == "oracle" for u in v.uids}
        for req in result.requests:
            if req.uid not in wrong and req.tokens:
                self.put(req.uid, tuple(req.msg.input_ids), list(req.tokens))

    def row(self, uid: int, known: tuple[int, ...]) -> tuple[int, ...] | None:
        """The row of the request `uid` whose context is `known` (its prompt a prefix of it; the
        longest such prompt: a uid comes back with another prompt)."""
        best: tuple[tuple[int, ...], list[int]] | None = None
        for prompt, tokens in self.by_uid.get(uid, []):
            if known[: len(prompt)] == prompt and (best is None or len(prompt) > len(best[0])):
                best = (prompt, tokens)
        return None if best is None else best[0] + tuple(best[1])


class DraftLog:
    """A drafter that notes how many drafts `inner` proposed for each (batch, request): also
    for steps planned and then not launched (preemption took the request), whose drafts still
    decided how many pages the step would have needed."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.drafted: dict[tuple[int, int], int] = {}

    def draft(self, query: DraftQuery) -> list[int]:
        out = self.inner.draft(query)
        self.drafted[(query.batch_id, query.uid)] = min(len(out), query.wanted)
        return out


class ReplayDrafts:
    """A `Drafter` that reproduces recorded acceptance (see the module docstring). `planned`:
    how many drafts each query of the recorded run got (`DraftLog`), for the steps that were
    planned but not launched."""

    def __init__(
        self,
        steps: dict[tuple[int, int], Step],
        rows: Rows,
        vocab_size: int,
        planned: dict[tuple[int, int], int] | None = None,
    ) -> None:
        self.steps, self.rows, self.vocab = steps, rows, vocab_size
        self.planned = planned or {}
        self.fallback = PromptLookup()

    def draft(self, query: DraftQuery) -> list[int]:
        key = (query.batch_id, query.uid)
        step = self.steps.get(key)
        row = self.rows.row(query.uid, query.known)
        if step is None and key in self.planned:
            # planned, not launched: as many drafts, so that the step needs as many pages
            return [self._wrong(query.known[-1])] * min(self.planned[key], query.wanted)
        if step is None or row is None or step.drafts > query.wanted:
            return self.fallback.draft(query)
        out = []
        for t in range(step.drafts):
            at = step.first + t
            right = row[at] if at < len(row) else None
            if t < step.accepted and right is not None:
                out.append(right)
            else:
                out.append(self._wrong(right))
        return out

    def _wrong(self, right: int | None) -> int:
        """A token that is not `right` (the engine's token there)."""
        return 0 if right is None else (right + 1) % self.vocab


@dataclass(frozen=True, slots=True)
class StepMatch:
    """How a run's verify steps compare with the record: as many drafts, as many accepted."""

    same: int
    differ: int
    first: str  # the first step that differs ("" when none)

    def line(self) -> str:
        line = f"{self.same} verify steps as recorded, {self.differ} not"
        return line + (f" (first: {self.first})" if self.first else "")


def compare(steps: dict[tuple[int, int], Step], verified: Iterable[Verified]) -> StepMatch:
    """The run's verify steps (`Trace.verified`, any backend) against the recorded ones; a
    recorded step the run did not take counts as one that differs."""
    same, differ, firsts = 0, 0, []
    ran = set()
    for v in verified:
        ran.add((v.batch, v.uid))
        step = steps.get((v.batch, v.uid))
        if step is not None and (step.drafts, step.accepted) == (v.drafts, v.accepted):
            same += 1
            continue
        differ += 1
        was = "not recorded" if step is None else f"recorded {step.drafts}/{step.accepted}"
        firsts.append(
            (
                v.batch,
                f"batch {v.batch} request {v.uid}: drafts/accepted {v.drafts}/{v.accepted}, {was}",
            )
        )
    for batch, uid in steps.keys() - ran:
        differ += 1
        firsts.append((batch, f"batch {batch} request {uid}: recorded, not run"))
    return StepMatch(same, differ, min(firsts)[1] if firsts else "")
