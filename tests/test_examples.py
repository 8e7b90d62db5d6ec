"""The example schedulers in `examples/`: the minimal one is correct (named scenarios, both loops,
the reference's tokens, the skipped-capability notice); the upstream-style one has each of its four
bugs found on a hand-picked scenario, and its fixed variant is clean there; bad `--scheduler` specs
give one line and exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.cli import main
from overlapcheck.core.config import LoopKind, SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.messages import TokenMsg
from overlapcheck.core.protocol import MessageSink, MessageSource, SchedulerFactory
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.invariants.registry import INVARIANTS
from overlapcheck.scenarios.named import NAMED

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
MINIMAL = f"{EXAMPLES / 'minimal_scheduler.py'}:make_scheduler"
UPSTREAM = f"{EXAMPLES / 'upstream_overlap.py'}:make_scheduler"
FIXED = f"{EXAMPLES / 'upstream_overlap.py'}:make_fixed_scheduler"
US = 1e-6
EOS = 2


def factory(spec: str) -> SchedulerFactory:
    return SchedulerSpec(spec).factory()


def run(spec: str, scenario: Scenario, skip: tuple[str, ...] = ()) -> RunResult:
    checks = [i for i in INVARIANTS if i not in skip] if skip else None
    return run_scenario(scenario, SimBackend(), checks, scheduler=factory(spec))


def first(result: RunResult) -> str:
    return result.violations[0].invariant if result.violations else "ok"


# -- the minimal scheduler ----------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["overlap", "normal"])
@pytest.mark.parametrize("name", sorted(NAMED))
def test_minimal_passes_named_scenarios_with_the_reference_tokens(name: str, loop: str) -> None:
    scenario = NAMED[name]().with_config(loop=loop)
    mine = run(MINIMAL, scenario)
    assert mine.ok, mine.violations[0].line()
    reference = run_scenario(scenario, SimBackend())
    assert reference.ok
    assert [o.uid for o in mine.outcomes] == [o.uid for o in reference.outcomes]
    for a, b in zip(mine.outcomes, reference.outcomes, strict=True):
        if "abort" in (a.finish_reason, b.finish_reason):
            # the minimal scheduler does not chunk prompts, so an abort may land a token later
            # or earlier than in the reference; what was sent agrees
            short, long = sorted((a.tokens, b.tokens), key=len)
            assert long[: len(short)] == short, (a, b)
        else:
            assert (a.tokens, a.finish_reason) == (b.tokens, b.finish_reason)


def test_a_scheduler_without_books_gets_one_notice_and_the_black_box_checks() -> None:
    result = run(MINIMAL, NAMED["basic"]())
    assert len(result.notices) == 1
    assert "pages-conserved" in result.notices[0] and "books()" in result.notices[0]
    checked = {inv.id for inv in result.checks}
    assert "pages-conserved" not in checked
    assert {"no-race", "oracle", "no-post-eos", "exact-length", "abort-silent"} <= checked
    assert {"slot-not-in-flight", "liveness"} <= checked  # their black-box halves


def test_a_scheduler_with_books_gets_no_notice() -> None:
    result = run(FIXED, NAMED["basic"]())
    assert result.ok and result.notices == []
    assert "pages-conserved" in {inv.id for inv in result.checks}


# -- the upstream-style scheduler: one hand-picked scenario per bug -----------------------------


def hand_picked(*requests: RequestSpec, slots: int = 1, loop: LoopKind = "overlap") -> Scenario:
    config = SchedulerConfig(num_slots=slots, num_pages=64, cache="naive", loop=loop)
    return Scenario("hand-picked", config, requests)


# 1. finished by `can_decode`: token 3 of 4 is marked finished, then token 4 is sent anyway
FINISH_EARLY = hand_picked(RequestSpec(0, (5, 6, 7), max_tokens=4))
# 2. EOS at token 2 while round 3 is launched: round 3's token is replied (`finished=False`)
STALE_TOKEN = hand_picked(RequestSpec(0, (5, 6, 7), max_tokens=4, continuation=(41, EOS)))
# 3. request 0 stops at EOS while its round 2 is in flight; request 1 takes slot 0 meanwhile
FREE_EARLY = hand_picked(
    RequestSpec(0, (5, 6, 7), max_tokens=4, continuation=(EOS,)),
    RequestSpec(1, (8, 9), max_tokens=2),
)
# 4. the abort arrives while the prefill is in flight; with max_tokens 1 the prefill's result
# finishes the request, and its slot and pages are released a second time
ABORT_PREFILL = hand_picked(RequestSpec(0, (3,), max_tokens=1, abort_at=1 * US))
ABORT_PREFILL_LONGER = hand_picked(RequestSpec(0, (3, 4, 5), max_tokens=4, abort_at=1 * US))

CASES = [
    ("finish-by-can-decode", FINISH_EARLY, (), "exact-length", "finished after 3 of 4 tokens"),
    ("stale token", STALE_TOKEN, (), "no-post-eos", "after the finished message"),
    ("free early: slot", FREE_EARLY, (), "slot-not-in-flight", "flight"),
    ("free early: race", FREE_EARLY, ("slot-not-in-flight",), "no-race", "page_table"),
    ("abort in prefill", ABORT_PREFILL, (), "abort-silent", "after the abort"),
    ("abort in prefill", ABORT_PREFILL_LONGER, (), "abort-silent", "after the abort"),
    ("abort: twice", ABORT_PREFILL, ("abort-silent",), "pages-conserved", "free twice"),
]


@pytest.mark.parametrize(
    ("scenario", "skip", "invariant", "words"),
    [case[1:] for case in CASES],
    ids=[f"{c[0]}-{c[3]}" for c in CASES],
)
def test_each_upstream_bug_is_found(
    scenario: Scenario, skip: tuple[str, ...], invariant: str, words: str
) -> None:
    result = run(UPSTREAM, scenario, skip)
    assert first(result) == invariant, [v.line() for v in result.violations]
    assert words in result.violations[0].line()


def test_the_rest_of_an_output_after_an_early_finish_is_exact_lengths_finding_only() -> None:
    # one defect, one finding: `finished` on token 3 of 4, then token 4; skipping exact-length
    # does not make it a no-post-eos (the message after the flag is the output's own last token)
    assert run(UPSTREAM, FINISH_EARLY, ("exact-length",)).ok


class Scripted:
    """Sends `script` ((token, finished) per iteration) for the first request it receives."""

    script: tuple[tuple[int, bool], ...] = ()

    def __init__(
        self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> None:
        self.device, self.source, self.sink = device, source, sink
        self.uid: int | None = None
        self.sent = 0

    def step(self) -> bool:
        for msg in self.source.poll(self.device.now()):
            self.uid = msg.uid if self.uid is None else self.uid
        if self.uid is None or self.sent == len(self.script):
            return self.uid is None and self.source.next_arrival() is not None
        token, finished = self.script[self.sent]
        self.sent += 1
        self.sink(TokenMsg(self.uid, token, finished))
        return True


@pytest.mark.parametrize(
    ("script", "fires"),
    [  # max_tokens 4
        (((40, False), (41, False), (42, True), (43, True)), False),  # early, then the last
        (((40, False), (41, True), (42, False), (43, True)), False),  # the rest, in two
        (((40, False), (41, False), (42, True), (43, True), (44, False)), True),  # past max
        (((40, False), (41, True), (EOS, False), (45, False)), True),  # after an EOS in the rest
        (((40, False), (EOS, True), (46, False)), True),  # a stale round after EOS
        (((40, False), (41, False), (42, False), (43, True), (47, False)), True),  # after the last
    ],
    ids=["last", "rest", "past-max", "after-eos-in-rest", "after-eos", "after-last"],
)
def test_no_post_eos_judges_tokens_past_the_end_of_the_output(
    script: tuple[tuple[int, bool], ...], fires: bool
) -> None:
    scheduler = type("Script", (Scripted,), {"script": script})
    scenario = hand_picked(RequestSpec(0, (5, 6, 7), max_tokens=4))
    result = run_scenario(scenario, SimBackend(), ["no-post-eos"], scheduler=scheduler)
    assert first(result) == ("no-post-eos" if fires else "ok")
    if fires:
        assert "past the end of its output" in result.violations[0].message


HAND_PICKED = [FINISH_EARLY, STALE_TOKEN, FREE_EARLY, ABORT_PREFILL, ABORT_PREFILL_LONGER]


@pytest.mark.parametrize("loop", ["overlap", "normal"])
@pytest.mark.parametrize("index", range(len(HAND_PICKED)))
def test_the_fixed_variant_is_clean_on_the_same_scenarios(index: int, loop: str) -> None:
    sc = HAND_PICKED[index].with_config(loop=loop)
    result = run(FIXED, sc)
    assert result.ok, result.violations[0].line()
    assert run(MINIMAL, sc).ok
    if loop == "normal":  # upstream's bugs all need a round in flight
        assert run(UPSTREAM, sc).ok


def test_the_fixed_variant_gives_the_reference_tokens() -> None:
    for name in ("basic", "early-eos", "chunked-long", "memory-pressure"):
        sc = NAMED[name]()
        fixed = run(FIXED, sc)
        reference = run_scenario(sc, SimBackend())
        assert [o.tokens for o in fixed.outcomes] == [o.tokens for o in reference.outcomes]


# -- plug-in errors -----------------------------------------------------------------------------


def no_step_file(tmp_path: Path) -> str:
    path = tmp_path / "no_step.py"
    path.write_text("def make_scheduler(config, device, source, sink):\n    return object()\n")
    return f"{path}:make_scheduler"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("missing/nowhere.py:make_scheduler", "no such file"),
        (f"{EXAMPLES / 'minimal_scheduler.py'}:no_such_factory", "has no no_such_factory"),
        ("NO_STEP", "has no step()"),
    ],
    ids=["missing-file", "no-such-factory", "no-step"],
)
@pytest.mark.parametrize("command", ["run", "explore"])
def test_a_bad_scheduler_spec_is_one_line_and_exit_2(
    spec: str, words: str, command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if spec == "NO_STEP":
        spec = no_step_file(tmp_path)
    argv = [command, "--scheduler", spec, "--scenario", "basic"]
    if command == "explore":
        argv += ["--max-examples", "1", "--budget", "5", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err
