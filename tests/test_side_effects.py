"""Library calls leave the process as they found it: the garbage collector's settings and frozen
objects, and no module-level state that one run leaves for the next."""

from __future__ import annotations

import ast
import gc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.backends.sim.timing import SeededDelay, Timing
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Device
from overlapcheck.core.protocol import MessageSink, MessageSource, SchedulerUnderTest
from overlapcheck.harness import runner
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.scenarios.named import named_scenario

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def collector() -> Iterator[None]:
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    yield
    gc.set_threshold(*threshold)
    if enabled:
        gc.enable()


def test_a_run_restores_the_collector_threshold_and_freezes_nothing(collector: None) -> None:
    gc.set_threshold(700, 11, 12)
    before = gc.get_freeze_count()
    run_scenario(named_scenario("basic"), SimBackend())
    assert gc.get_threshold() == (700, 11, 12)
    # (the interpreter's own frozen tuples, Python 3.12's, are thawed by the first run)
    if before <= runner._FROZEN_AT_START:
        assert gc.get_freeze_count() == 0
    else:
        assert 0 < gc.get_freeze_count() <= before  # (frozen objects that die leave the count)
    assert gc.isenabled()


def test_the_interpreters_own_frozen_objects_do_not_stop_the_run_moving_its_objects_out(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Python 3.12 starts with objects frozen: taken for a caller's, they made every run's end
    # set off a collection over all its objects (a tenth of a run on the GPU guest).
    doomed = [[index] for index in range(100)]
    gc.freeze()
    try:
        monkeypatch.setattr(runner, "_FROZEN_AT_START", gc.get_freeze_count())
        del doomed  # frozen objects that die leave the count: fewer than at the start now
        run_scenario(named_scenario("basic"), SimBackend())
        assert gc.get_freeze_count() == 0  # frozen and thawed: moved to the oldest generation
        assert gc.get_count()[0] < 1_000  # not left young for the next collection to rescan
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(
    ("name", "fault", "invariants"),
    [
        ("shared-prefix", None, []),
        ("shared-prefix", None, None),
        ("abort", "free-slot-early", None),  # stopped at a violation, kernels still in flight
    ],
    ids=["footprints only", "every check", "a run stopped at its violation"],
)
def test_a_dropped_result_frees_its_run_without_a_collection(
    collector: None, name: str, fault: str | None, invariants: list[str] | None
) -> None:
    # Cycles through the run (scheduler -> harness -> context -> scheduler; the simulator's
    # stream loops, suspended with the device in their frames) kept every run's trace and checks
    # until a full collection: a search touched fresh memory at every example.
    scenario = named_scenario(name)
    if fault is not None:
        scenario = replace(scenario, config=replace(scenario.config, faults=frozenset([fault])))
    run_scenario(scenario, SimBackend(), invariants)
    gc.collect()
    result = run_scenario(scenario, SimBackend(), invariants)
    assert result.ok == (fault is None) and result.trace.ops
    del result
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        kinds = {type(obj).__name__ for obj in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    # (the reference's radix tree links each node to its parent: a few nodes, no trace)
    assert not kinds & {"Op", "Access", "Message", "Trace", "RunContext", "SimDevice", "Checks"}


def test_a_real_engines_run_leaves_its_objects_young(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its objects hold device memory in reference cycles: the next collections must see them.
    class AnotherEngine(SimBackend):
        name = "another-engine"
        small_run_objects = False  # as a real engine's backend says

    gc.freeze()
    try:
        monkeypatch.setattr(runner, "_FROZEN_AT_START", gc.get_freeze_count())
        frozen = gc.get_freeze_count()
        run_scenario(named_scenario("basic"), AnotherEngine())
        # nothing frozen and thawed, nothing moved out (frozen objects that die leave the count)
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_run_on_the_simulated_cuda_leaves_its_objects_young(
    collector: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The program's tensors live in its objects' reference cycles (mini-sglang's): moved to the
    # oldest generation, a search's process grew by ~1.4 MB an example until a full collection.
    pytest.importorskip("torch")
    from overlapcheck.backends.torchsim.session import SimulatedCuda

    reference = SchedulerSpec().factory()

    def on_the_simulated_cuda(
        config: SchedulerConfig, device: Device, source: MessageSource, sink: MessageSink
    ) -> SchedulerUnderTest:
        assert isinstance(device, SimDevice)
        SimulatedCuda(device)  # as an adapter's scheduler does: its torch code runs on it
        return reference(config, device, source, sink)

    gc.freeze()
    try:
        monkeypatch.setattr(runner, "_FROZEN_AT_START", gc.get_freeze_count())
        frozen = gc.get_freeze_count()
        run_scenario(named_scenario("basic"), SimBackend(), scheduler=on_the_simulated_cuda)
        # nothing frozen and thawed, nothing moved out (frozen objects that die leave the count)
        assert 0 < gc.get_freeze_count() <= frozen
    finally:
        gc.unfreeze()


def test_a_run_leaves_the_callers_frozen_objects_frozen(collector: None) -> None:
    # Checked by identity: a count moves when frozen objects an earlier test left behind die.
    callers = [[index] for index in range(1_000)]
    gc.freeze()  # what a server does before forking its workers
    try:
        run_scenario(named_scenario("basic"), SimBackend())
        collected = {id(obj) for obj in gc.get_objects()}  # the three generations, not the frozen
        assert not any(id(obj) in collected for obj in callers)
        assert gc.get_freeze_count() >= len(callers)
    finally:
        gc.unfreeze()
    collected = {id(obj) for obj in gc.get_objects()}
    assert all(id(obj) in collected for obj in callers)  # the check above can see a thaw


def test_a_run_gives_the_same_result_whatever_ran_before_it_in_the_process() -> None:
    def run(name: str, seed: int) -> tuple[str, list[str]]:
        result = run_scenario(
            named_scenario(name),
            SimBackend(Timing(source=SeededDelay(seed))),
            keep_going=True,
        )
        return result.trace_hash, [v.line() for v in result.violations]

    first = run("shared-prefix", 1)
    run("memory-pressure", 2)
    run("page-size-4", 3)
    assert run("shared-prefix", 1) == first


def test_no_package_module_rebinds_module_state() -> None:
    """`global` in a function is module-level state that outlives a run (a cache one run fills
    for the next): state belongs to an object a run owns."""
    from test_layers import package_files

    found = []
    for path in package_files(ROOT):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Global):
                rel = path.relative_to(ROOT)
                found.append(f"{rel}:{node.lineno}: global {', '.join(node.names)}")
    assert found == []


def test_the_hypothesis_internals_a_search_patches_exist_and_are_restored() -> None:
    """The installed Hypothesis has what `explore/search.py` patches and reads (pyproject pins the
    range this was tested with), and a search puts its patch back."""
    from hypothesis.database import choices_to_bytes  # noqa: F401
    from hypothesis.internal.conjecture import providers
    from hypothesis.internal.conjecture.shrinker import sort_key  # noqa: F401
    from hypothesis.internal.constants_ast import Constants

    from overlapcheck.explore.search import _examples_from_the_seed_alone

    found, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
    with _examples_from_the_seed_alone():
        assert providers._get_local_constants is Constants
        assert providers.CONSTANTS_CACHE is not cache
    assert providers._get_local_constants is found
    assert providers.CONSTANTS_CACHE is cache
