"""The scheduler-under-test protocol: plug-ins, black-box checks without books, crashes as
findings, overlapcheck's own crashes, requests as instances, keep-going runs."""

from __future__ import annotations

import json
import operator
import textwrap
from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.cli import main
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.errors import UserError
from overlapcheck.core.protocol import HasBooks, MessageSink, MessageSource, SchedulerUnderTest
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.crash import CheckerBug
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import parse_spec
from overlapcheck.invariants.oracle import Oracle
from overlapcheck.reference.scheduler import Scheduler
from overlapcheck.scenarios.named import named_scenario


class WithoutBooks:
    """The reference scheduler seen from outside: only `step()`."""

    def __init__(
        self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> None:
        self._inner = Scheduler(config, device, source, sink)

    def step(self) -> bool:
        return self._inner.step()


CRASHY = textwrap.dedent(
    """
    from overlapcheck.reference.scheduler import Scheduler


    class Crashy(Scheduler):
        def _append(self, req, token):
            if len(req.outputs) == 2:
                pages = []
                pages[3]  # an IndexError in the scheduler's own code
            super()._append(req, token)


    def make(config, device, source, sink):
        return Crashy(config, device, source, sink)


    def not_a_scheduler(config, device, source, sink):
        return object()
    """
)


def test_the_reference_scheduler_satisfies_the_protocol_with_books() -> None:
    sched = Scheduler(
        SchedulerConfig(), SimBackend().make_device(named_scenario("basic")), _Empty()
    )
    assert isinstance(sched, SchedulerUnderTest) and isinstance(sched, HasBooks)
    assert not isinstance(WithoutBooks.__new__(WithoutBooks), HasBooks)


class _Empty:
    def poll(self, now: float) -> list[object]:
        return []

    def next_arrival(self) -> float | None:
        return None


def test_a_scheduler_without_books_gets_the_black_box_checks_and_one_notice() -> None:
    scenario = named_scenario("memory-pressure")
    plain = run_scenario(scenario, SimBackend())
    boxed = run_scenario(scenario, SimBackend(), scheduler=WithoutBooks)
    assert boxed.ok and plain.ok
    assert boxed.trace_hash == plain.trace_hash  # same scheduler, same run
    assert plain.notices == []
    assert len(boxed.notices) == 1 and "pages-conserved" in boxed.notices[0]
    assert "no-race" not in boxed.notices[0]


def test_black_box_checks_still_catch_a_fault_without_books() -> None:
    scenario = named_scenario("basic").with_config(faults=frozenset({"finish-by-can-decode"}))
    result = run_scenario(scenario, SimBackend(), scheduler=WithoutBooks)
    assert [v.invariant for v in result.violations] in (["exact-length"], ["no-post-eos"])


def test_a_crash_in_the_scheduler_is_a_no_crash_finding(tmp_path: Path) -> None:
    plugin = tmp_path / "crashy.py"
    plugin.write_text(CRASHY)
    factory = parse_spec(f"{plugin}:make").factory()
    result = run_scenario(named_scenario("basic"), SimBackend(), scheduler=factory)
    [violation] = result.violations
    assert violation.invariant == "no-crash"
    assert violation.details["type"] == "IndexError"
    assert violation.details["file"].endswith("crashy.py")
    assert violation.details["function"] == "_append"
    # deterministic: the same finding again
    again = run_scenario(named_scenario("basic"), SimBackend(), scheduler=factory)
    assert again.trace_hash == result.trace_hash


def test_a_crashing_scheduler_exits_1_from_the_cli(tmp_path: Path) -> None:
    plugin = tmp_path / "crashy.py"
    plugin.write_text(CRASHY)
    assert main(["run", "--scheduler", f"{plugin}:make"]) == 1


def test_a_crash_inside_overlapcheck_exits_3_with_the_input_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A builtin, so that the innermost Python frame is overlapcheck's own wherever it is
    # installed (a function defined here would be this test file's, which is the package's own
    # only in a checkout): the harness calls `getitem(msg, req)`, a TypeError.
    monkeypatch.setattr(Oracle, "on_message", operator.getitem)
    with pytest.raises(CheckerBug):
        run_scenario(named_scenario("basic"), SimBackend())
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--scenario", "basic"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("overlapcheck bug:") and "TypeError" in err
    [saved] = tmp_path.glob("overlapcheck-bug-*.json")
    assert json.loads(saved.read_text())["name"] == "basic"
    assert "not subscriptable" in saved.with_suffix(".txt").read_text()


def test_the_reference_failing_to_start_is_ours_under_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reference's constructor raising is overlapcheck's bug (exit 3), never the user's
    factory failing (exit 2): `run` once passed the reference's class on as if it were a
    user's factory. A user's factory that raises stays the user's (exit 2)."""

    def broken(self: Scheduler, *args: object) -> None:
        raise RuntimeError("the reference cannot start")

    monkeypatch.chdir(tmp_path)
    plugin = tmp_path / "mine.py"
    plugin.write_text("def make(config, device, source, sink):\n    raise ValueError('mine')\n")
    assert main(["run", "--scheduler", f"{plugin}:make"]) == 2
    assert "the scheduler factory failed: ValueError: mine" in capsys.readouterr().err
    monkeypatch.setattr(Scheduler, "__init__", broken)
    for argv in (["run"], ["run", "--scheduler", "reference"]):
        assert main(argv) == 3, argv
        err = capsys.readouterr().err
        assert err.startswith("overlapcheck bug: RuntimeError: the reference cannot start"), err
    with pytest.raises(CheckerBug):
        run_scenario(named_scenario("basic"), SimBackend(), scheduler=Scheduler)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("missing.py:make", "no such file"),
        ("{plugin}:nope", "has no nope"),
        ("{plugin}:not_a_scheduler", "has no step()"),
        ("no_such_module_x:make", "cannot import"),
        ("justtext", "expected PATH.py:FACTORY"),
    ],
)
def test_bad_scheduler_specs_are_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], spec: str, needle: str
) -> None:
    plugin = tmp_path / "crashy.py"
    plugin.write_text(CRASHY)
    assert main(["run", "--scheduler", spec.format(plugin=plugin)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_a_factory_that_builds_no_scheduler_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="has no step"):
        run_scenario(named_scenario("basic"), SimBackend(), scheduler=lambda *args: 42)  # type: ignore[arg-type, return-value]


def test_requests_are_instances_a_uid_may_come_back() -> None:
    cfg = SchedulerConfig(num_slots=2, max_seq_len=32)
    requests = (
        RequestSpec(7, (5, 6, 7), max_tokens=3),
        RequestSpec(7, (9, 9, 4, 3), max_tokens=2, arrival=0.000_05),  # while live: rejected
        RequestSpec(7, (8, 4), max_tokens=4, arrival=0.01),  # after it finished: served
    )
    result = run_scenario(Scenario("reuse", cfg, requests), SimBackend())
    assert result.ok, [v.line() for v in result.violations]
    reasons = [(o.uid, o.finish_reason, len(o.tokens)) for o in result.outcomes]
    assert reasons == [(7, "length", 3), (7, "rejected", 0), (7, "length", 4)]
    first, duplicate, third = result.requests
    assert duplicate.rejected and duplicate.expected is None
    assert first.expected is not None and third.expected is not None
    assert first.tokens == first.expected.tokens[:3]
    assert third.tokens == third.expected.tokens[:4]


def test_keep_going_records_every_violation_once_per_request() -> None:
    scenario = named_scenario("basic").with_config(faults=frozenset({"finish-by-can-decode"}))
    first = run_scenario(scenario, SimBackend())
    every = run_scenario(scenario, SimBackend(), keep_going=True)
    assert len(first.violations) == 1
    assert len(every.violations) > 1
    assert every.violations[0] == first.violations[0]
    keys = [(v.invariant, v.uids) for v in every.violations]
    assert len(keys) == len(set(keys))
    # the run went on to the end: every request got its whole message stream
    assert every.iterations > first.iterations


def test_keep_going_on_a_clean_run_changes_nothing() -> None:
    scenario = named_scenario("shared-prefix")
    assert (
        run_scenario(scenario, SimBackend(), keep_going=True).trace_hash
        == run_scenario(scenario, SimBackend()).trace_hash
    )


class SamplesPastTheRow(Scheduler):
    """Writes every sample one cell past the token pool's row: a malformed batch."""

    def _sample_cell(self, req: object, end: int) -> tuple[int, int]:
        return 0, self.config.max_seq_len


def test_a_malformed_batch_is_the_schedulers_bug_not_ours() -> None:
    result = run_scenario(named_scenario("basic"), SimBackend(), scheduler=SamplesPastTheRow)
    [violation] = result.violations
    assert violation.invariant == "device-contract"
    assert "outside the token pool" in violation.message


class NeverUnlocks(Scheduler):
    """Forgets to unlock a request's prefix match when it is released."""

    def __init__(
        self, config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> None:
        super().__init__(config, device, source, sink)
        self.cache.prefix.unlock = lambda handle: None  # type: ignore[method-assign]


def test_a_lock_never_released_is_caught_at_idle() -> None:
    scenario = named_scenario("shared-prefix")
    assert scenario.config.cache == "radix"
    assert run_scenario(scenario, SimBackend()).ok
    [violation] = run_scenario(scenario, SimBackend(), scheduler=NeverUnlocks).violations
    assert violation.invariant == "liveness" and "still locks cached pages" in violation.message


def test_timeline_compare_draws_a_plugged_in_scheduler(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parent.parent / "examples" / "minimal_scheduler.py"
    out = tmp_path / "compare.png"
    assert (
        main(
            [
                "timeline",
                "--compare",
                "--scenario",
                "basic",
                "--scheduler",
                f"{examples}:make_scheduler",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    assert out.stat().st_size > 0


@pytest.mark.parametrize("fault", [None, "free-slot-early", "abort-inflight-prefill"])
@pytest.mark.parametrize("name", ["basic", "abort", "chunked-long"])
def test_checks_deferred_to_after_the_run_judge_as_online_ones(
    name: str, fault: str | None
) -> None:
    faults = frozenset([fault]) if fault else frozenset()
    scenario = named_scenario(name).with_config(faults=faults)
    online = run_scenario(scenario, SimBackend(), keep_going=True)
    later = run_scenario(scenario, SimBackend(), keep_going=True, defer_checks=True)
    assert later.trace_hash == online.trace_hash
    assert [(v.invariant, v.uids, v.step) for v in sorted(later.violations, key=str)] == [
        (v.invariant, v.uids, v.step) for v in sorted(online.violations, key=str)
    ]


def test_a_search_can_look_past_a_crash_a_run_cannot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`explore` says "next: add --skip no-crash"; that command then runs and looks past the
    crash (here every example crashes: nothing else is found, exit 0). A single run, or a
    replay, always reports a crash: `run --skip no-crash` is one line, exit 2."""
    plugin = tmp_path / "crashy.py"
    plugin.write_text(CRASHY)
    explore = ["explore", "--scheduler", f"{plugin}:make", "--out", str(tmp_path / "cex")]
    explore += ["--max-examples", "5", "--budget", "30", "--no-timeline", "--workers", "1"]
    assert main(explore) == 1
    assert "next: add --skip no-crash to this command" in capsys.readouterr().out
    assert main([*explore, "--skip", "no-crash"]) == 0
    assert "no violation found" in capsys.readouterr().out
    assert main(["run", "--scheduler", f"{plugin}:make", "--skip", "no-crash"]) == 2
    assert "unknown invariant no-crash" in capsys.readouterr().err
