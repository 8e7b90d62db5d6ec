"""kv-provenance, work-bound and no-hidden-sync: each fires on a bug of its kind and stays silent
on the reference scheduler (prefix sharing, follow-up turns, uid reuse, the dummy row, the extra
overlap round, draining the last batch, the normal loop)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.kv_shadow import PrefixHash
from overlapcheck.core.protocol import MessageSink, MessageSource
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.reference import scheduler as reference
from overlapcheck.reference.cache.manager import CacheManager
from overlapcheck.reference.cache.radix import RadixCache
from overlapcheck.reference.req import Req
from overlapcheck.reference.scheduler import Scheduler
from overlapcheck.scenarios.named import NAMED, named_scenario

NEW = ["kv-provenance", "work-bound", "no-hidden-sync"]
US = 1e-6


def run(scenario: Scenario, checks: Sequence[str] = NEW, **kwargs: object) -> RunResult:
    return run_scenario(scenario, SimBackend(), list(checks), **kwargs)  # type: ignore[arg-type]


def fired(result: RunResult) -> list[str]:
    return [v.invariant for v in result.violations]


# -- silent on the reference -------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["overlap", "normal"])
@pytest.mark.parametrize("name", sorted(NAMED))
def test_the_reference_breaks_none_of_them(name: str, loop: str) -> None:
    result = run(named_scenario(name).with_config(loop=loop))
    assert result.ok, [v.line() for v in result.violations]
    assert not result.notices


def test_prefix_sharing_follow_ups_and_uid_reuse_are_legitimate() -> None:
    system = (5, 6, 7, 8, 9, 10, 11, 12)
    requests = (
        RequestSpec(0, system + (20, 21), max_tokens=3),
        RequestSpec(1, system + (30,), max_tokens=4, arrival=40 * US),
        RequestSpec(0, (40,), max_tokens=3, after=0),  # the same uid, a follow-up turn
        RequestSpec(2, (41, 42), max_tokens=2, after=1),
    )
    for page_size in (1, 4):
        scenario = Scenario(
            "chat", SchedulerConfig(num_slots=2, num_pages=64, page_size=page_size), requests
        )
        result = run(scenario, [*NEW, "oracle"])
        assert result.ok, [v.line() for v in result.violations]
        kv = result.checks[0]
        # cells computed by one request were read by another: the sharing really happened
        assert len(kv.contexts) == 4  # type: ignore[attr-defined]
        reused = [
            op for op in result.trace.ops if op.kind == "forward" and op.label.startswith("P")
        ]
        assert any(len(op.accesses[3].cells) > len(op.accesses[1].cells) for op in reused)


def test_the_real_engine_skips_kv_provenance_with_a_notice() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from overlapcheck.backends.gpu.backend import make_torch_backend

    scenario = Scenario("one", SchedulerConfig(), (RequestSpec(0, (5, 6, 7), max_tokens=3),))
    result = run_scenario(scenario, make_torch_backend("cpu", preset="tiny"), NEW)
    assert result.ok, [v.line() for v in result.violations]
    assert len(result.notices) == 1
    assert "skipped kv-provenance" in result.notices[0] and "no KV shadow" in result.notices[0]


def test_prefix_keys_match_one_token_at_a_time() -> None:
    hashing = PrefixHash(8)
    import numpy as np

    tokens = np.array([5, 0, 1023, 7, 7], dtype=np.int64)
    keys = hashing.keys(tokens)
    key = 0
    for p, t in enumerate(tokens.tolist()):
        key = PrefixHash.extend(key, t)
        assert int(keys[p]) == key
    assert int(hashing.keys(np.array([6, 0]))[1]) != int(keys[1])  # the prefix counts


# -- kv-provenance fires ---------------------------------------------------------------------


def test_kv_provenance_fires_on_a_wrong_prefix_cache_match(monkeypatch: pytest.MonkeyPatch) -> None:
    # The radix cache compares only the first token of each further page of an edge: a prompt
    # that differs later inside a page matches another prompt's page.
    def first_token_only(
        self: RadixCache, key: tuple[int, ...], tokens: Sequence[int], pos: int, usable: int
    ) -> int:
        n = 0
        while n < len(key) and pos + n < usable and key[n] == tokens[pos + n]:
            n += self.page_size
        return n

    monkeypatch.setattr(RadixCache, "_common_pages", first_token_only)
    requests = (
        RequestSpec(0, (5, 6, 7, 8, 9, 10, 11, 12, 13), max_tokens=2),
        RequestSpec(1, (5, 6, 7, 8, 9, 10, 11, 99, 14), max_tokens=2, arrival=2000 * US),
    )
    scenario = Scenario("wrong-cache", SchedulerConfig(num_pages=32, page_size=4), requests)
    result = run(scenario, ["kv-provenance", "oracle"])
    assert fired(result) == ["kv-provenance"]  # at the read, before the wrong token is seen
    v = result.violations[0]
    assert v.uids == (1,) and v.details["position"] == 7
    assert "holds token 12" in v.message and "the request's token there is 99" in v.message


def test_kv_provenance_fires_on_a_stale_page_table_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    # Growing a request re-lists its first cell instead of the new page's (a stale row entry):
    # position 1 reads the KV computed for position 0.
    real_grow = CacheManager.grow

    def stale_grow(self: CacheManager, req: Req, num_positions: int) -> None:
        real_grow(self, req, num_positions)
        if len(req.cells) > 1 and req.cells[1] != req.cells[0] and req.uid == 1:
            req.cells[1] = req.cells[0]

    monkeypatch.setattr(CacheManager, "grow", stale_grow)
    scenario = named_scenario("basic").with_config(cache="naive")
    result = run(scenario, ["kv-provenance"])
    assert fired(result) == ["kv-provenance"]
    assert "computed for position 1" in result.violations[0].message


def test_kv_provenance_fires_when_a_prompt_cell_is_overwritten() -> None:
    scenario = named_scenario("chunked-long").with_config(
        faults=frozenset(["chunk-sample-overwrite"])
    )
    result = run(scenario, ["kv-provenance"])
    assert fired(result) == ["kv-provenance"]
    assert "gathers from token_pool" in result.violations[0].message


# -- work-bound ------------------------------------------------------------------------------


def test_work_bound_fires_on_rounds_past_max_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    real = reference.max_output
    monkeypatch.setattr(reference, "max_output", lambda cfg, msg: real(cfg, msg) + 1)
    scenario = named_scenario("basic").with_config(page_size=8)  # the pages stay within
    result = run(scenario, ["work-bound"])
    assert fired(result) == ["work-bound"]
    assert "needs only" in result.violations[0].message  # one round too many is caught


def test_work_bound_fires_on_rounds_after_the_finished_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Finished requests stay in the decode batch until max_tokens (results dropped): the GPU
    # keeps working for a request whose end the host already announced.
    from overlapcheck.reference.decode import DecodeManager
    from overlapcheck.reference.req import ReqState

    monkeypatch.setattr(
        DecodeManager, "remove", lambda self, r: r.state is ReqState.ABORTED and None
    )
    monkeypatch.setattr(
        Req,
        "can_decode",
        property(lambda r: not r.released and r.launched_outputs < r.max_output),
    )
    scenario = Scenario(
        "eos",
        SchedulerConfig(),
        (RequestSpec(0, (5, 6, 7), max_tokens=6, continuation=(40, 2)),),
    )
    result = run(scenario, ["work-bound"])
    assert fired(result) == ["work-bound"]
    assert "after its finished message" in result.violations[0].message


def test_work_bound_fires_on_more_pages_than_reserved(monkeypatch: pytest.MonkeyPatch) -> None:
    # A page per position instead of per page_size positions.
    def grow_page_per_token(self: CacheManager, req: Req, num_positions: int) -> None:
        while len(req.cells) < num_positions:
            page = self.allocator.allocate()
            req.own_pages.append(page)
            req.cells.append(page * self.page_size)

    monkeypatch.setattr(CacheManager, "grow", grow_page_per_token)
    scenario = named_scenario("page-size-4").with_config(cache="naive")
    result = run(scenario, ["work-bound"])
    assert fired(result) == ["work-bound"]
    assert "KV pages; admission reserved" in result.violations[0].message


# -- no-hidden-sync --------------------------------------------------------------------------


class SyncAfterLaunch(Scheduler):
    """Blocks on the batch it just launched (as a `.item()` on its output would)."""

    def overlap_step(self) -> None:
        launched = self._schedule_and_launch()
        if launched is not None:
            launched.copy_done.synchronize()
        if self.inflight is not None:
            self._process(self.inflight)
        self.inflight = launched


class SyncBeforeSchedule(Scheduler):
    """Orders the scheduler stream after the engine and syncs it before planning (the shape of
    FlashInfer's pageable `plan` input)."""

    def _schedule(self):  # type: ignore[no-untyped-def]
        dev = self.device
        if self.inflight is not None:
            dev.wait_stream(dev.scheduler_stream, dev.engine_stream)
            dev.record(dev.scheduler_stream).synchronize()
        return super()._schedule()


def factory(cls: type[Scheduler]):  # type: ignore[no-untyped-def]
    def make(
        config: SchedulerConfig, device: object, source: MessageSource, sink: MessageSink
    ) -> Scheduler:
        return cls(config, device, source, sink)  # type: ignore[arg-type]

    return make


@pytest.mark.parametrize(
    ("cls", "stream"), [(SyncAfterLaunch, "engine"), (SyncBeforeSchedule, "scheduler")]
)
def test_no_hidden_sync_fires_on_a_host_blocked_on_the_running_forward(
    cls: type[Scheduler], stream: str
) -> None:
    result = run(named_scenario("basic"), NEW, scheduler=factory(cls))
    assert fired(result) == ["no-hidden-sync"]
    v = result.violations[0]
    assert f"recorded on the {stream} stream" in v.message and "hidden sync" in v.message
    assert {"wait", "event", "record", "forward"} <= set(v.details)


class SyncWhenScheduling(Scheduler):
    """Syncs the scheduler stream before every schedule (an idle-time integrity check that reads
    a device value does that): after an idle gap it covers the last forward only through what the
    host already waited for, which is no hidden sync."""

    def _schedule(self):  # type: ignore[no-untyped-def]
        self.device.record(self.device.scheduler_stream).synchronize()
        return super()._schedule()


def test_no_hidden_sync_is_silent_on_a_wait_covering_a_forward_the_host_already_waited_for() -> (
    None
):
    requests = (
        RequestSpec(0, (5, 6, 7), max_tokens=1),
        RequestSpec(1, (8, 9), max_tokens=2, arrival=0.01),  # after an idle gap
    )
    scenario = Scenario("gap", SchedulerConfig(), requests, "two requests apart")
    result = run(scenario, NEW, scheduler=factory(SyncWhenScheduling))
    assert result.ok, result.violations


def test_no_hidden_sync_is_not_checked_in_the_normal_loop() -> None:
    scenario = named_scenario("basic").with_config(loop="normal")
    result = run(scenario, NEW, scheduler=factory(SyncAfterLaunch))
    assert result.ok


def test_no_hidden_sync_can_be_skipped() -> None:
    from overlapcheck.invariants.registry import INVARIANTS

    assert set(NEW) <= set(INVARIANTS)  # on by default
    others = [i for i in INVARIANTS if i != "no-hidden-sync"]
    result = run(named_scenario("basic"), others, scheduler=factory(SyncAfterLaunch))
    assert result.ok
