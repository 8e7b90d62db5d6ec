"""A hang is a finding: a step() past the watchdog's timeout is `no-hang` with the scheduler's
frame, shrunk, saved and replayed like any other; a spin on `Event.query()` makes progress; the
search's budget ends a run whatever the scheduler does."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile
from overlapcheck.cli import main
from overlapcheck.explore.search import SearchSpec, search
from overlapcheck.formats import counterexample
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.harness.watchdog import DeadlineReached
from overlapcheck.scenarios.named import named_scenario

# Each hangs in its first step that has work: a loop, a sleep (a blocking call a signal must
# interrupt), and a loop that swallows the watchdog's exception and returns.
HANGS = """
import time

from overlapcheck.examples.minimal_scheduler import MinimalScheduler


class Hangs(MinimalScheduler):
    how = "loop"

    def step(self):
        if self.source.next_arrival() is None and not self.live:
            return super().step()
        if self.how == "sleep":
            time.sleep(3600)
        if self.how == "convert":  # as a Rust extension turns an exception in a callback
            try:
                time.sleep(3600)
            except BaseException as err:
                raise RuntimeError(f"panicked: {err!r}") from None
        while self.how == "loop":
            pass
        try:
            while True:
                pass
        except BaseException:  # the watchdog's exception too
            return True


class Sleeps(Hangs):
    how = "sleep"


class InFinalizer(Hangs):
    # Hangs in a finalizer first (past the timeout: the watchdog's first shot lands in it and
    # is lost there), then in the step's own loop.
    how = "finalizer"

    def step(self):
        if self.source.next_arrival() is None and not self.live:
            return super().step()
        import weakref

        class Held:
            pass

        def spin(began):
            while time.monotonic() - began < 0.5:
                pass

        held = Held()
        weakref.finalize(held, spin, time.monotonic())
        del held  # the finalizer runs here, inside the step
        while True:
            pass


class Swallows(Hangs):
    how = "swallow"


class Converts(Hangs):
    how = "convert"
"""

# The minimal scheduler, polling copy-done instead of blocking on it.
POLLS = """
from overlapcheck.examples.minimal_scheduler import MinimalScheduler


class Polls(MinimalScheduler):
    def _process(self, launched):
        while not launched.copy_done.query():
            pass
        super()._process(launched)
"""


@pytest.fixture
def plugins(tmp_path: Path) -> Path:
    (tmp_path / "hangs.py").write_text(HANGS)
    (tmp_path / "polls.py").write_text(POLLS)
    return tmp_path


@pytest.mark.parametrize(
    ("factory", "line"), [("Hangs", "`while self.how"), ("Sleeps", "`time.sleep(3600)`")]
)
def test_a_step_that_never_returns_is_no_hang_with_its_frame(
    plugins: Path, factory: str, line: str
) -> None:
    spec = SchedulerSpec(f"{plugins / 'hangs.py'}:{factory}")
    result = run_scenario(
        named_scenario("basic"), SimBackend(), scheduler=spec.factory(), hang_timeout=0.3
    )
    [violation] = result.violations
    assert violation.invariant == "no-hang" and violation.step == 0
    assert violation.details["file"].endswith("hangs.py") and violation.details["timeout"] == 0.3
    assert line in violation.message  # the line it was stuck on
    # The trace is cut back to where the hung step began: the same in every run.
    again = run_scenario(
        named_scenario("basic"), SimBackend(), scheduler=spec.factory(), hang_timeout=0.3
    )
    assert again.trace_hash == result.trace_hash


def test_the_watchdogs_shot_lost_in_a_finalizer_prints_nothing(plugins: Path) -> None:
    """Python prints an exception a finalizer raises ("Exception ignored in ...", a traceback):
    the watchdog's, lost there, is said again into the step, and nothing is printed. (In a
    process of its own: pytest takes such exceptions over.)"""
    code = (
        "from overlapcheck.backends.sim.backend import SimBackend\n"
        "from overlapcheck.harness.runner import run_scenario\n"
        "from overlapcheck.harness.scheduler_spec import SchedulerSpec\n"
        "from overlapcheck.scenarios.named import named_scenario\n"
        f"spec = SchedulerSpec({str(plugins / 'hangs.py') + ':InFinalizer'!r})\n"
        "result = run_scenario(named_scenario('basic'), SimBackend(), scheduler=spec.factory(),"
        " hang_timeout=0.3)\n"
        "print([v.invariant for v in result.violations], result.violations[0].message)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("['no-hang']") and "in spin" in done.stdout  # the first shot's
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_scheduler_that_swallows_the_watchdog_and_returns_is_still_no_hang(plugins: Path) -> None:
    spec = SchedulerSpec(f"{plugins / 'hangs.py'}:Swallows")
    result = run_scenario(
        named_scenario("basic"), SimBackend(), scheduler=spec.factory(), hang_timeout=0.3
    )
    assert [v.invariant for v in result.violations] == ["no-hang"]


def test_a_spin_on_event_query_makes_progress_and_is_clean(plugins: Path) -> None:
    """Simulated time moves only through the device: each query costs host time, and a query
    that sees the event fired orders the host after it (no false race)."""
    spec = SchedulerSpec(f"{plugins / 'polls.py'}:Polls")
    for name in ("basic", "abort", "early-eos"):
        result = run_scenario(named_scenario(name), SimBackend(), scheduler=spec.factory())
        assert result.ok, [v.line() for v in result.violations]
        assert any(op.kind == "host_query" for op in result.trace.ops)


def test_a_hang_is_searched_shrunk_saved_and_replayed(
    plugins: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = SchedulerSpec(f"{plugins / 'hangs.py'}:Hangs")
    found = search(SearchSpec(scheduler=spec, hang_timeout=0.2, max_examples=20, budget=600)).found
    assert found is not None and found.result.violations[0].invariant == "no-hang"
    path = counterexample.save(found.result, Profile(), found.draws, plugins, scheduler=spec)
    assert json.loads(path.read_text())["hang_timeout"] == 0.2
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("reproduced: [no-hang]") and "(identical)" in out


def test_the_deadline_stops_a_step_and_the_search_ends_at_its_budget(plugins: Path) -> None:
    spec = SchedulerSpec(f"{plugins / 'hangs.py'}:Sleeps")
    with pytest.raises(DeadlineReached):
        run_scenario(
            named_scenario("basic"),
            SimBackend(),
            scheduler=spec.factory(),
            hang_timeout=0,
            deadline=time.monotonic() + 0.2,
        )
    # A scheduler that turns the deadline's exception into one of its own: still the deadline,
    # not a crash of the scheduler (SGLang's Rust tree core panics on it).
    with pytest.raises(DeadlineReached):
        run_scenario(
            named_scenario("basic"),
            SimBackend(),
            scheduler=SchedulerSpec(f"{plugins / 'hangs.py'}:Converts").factory(),
            hang_timeout=0,
            deadline=time.monotonic() + 0.2,
        )
    # No hang timeout at all: only the budget ends the sleeping step, and nothing is found.
    result = search(SearchSpec(scheduler=spec, hang_timeout=0, budget=1.0, max_examples=10))
    assert result.found is None and result.stats.examples == 0
