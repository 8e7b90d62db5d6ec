"""kv-provenance judges incrementally (a request's verified prefix is trusted until a logged write
of one of its cells or of its page-table row): every wrong read it found judging every position
it still finds, at the same forward, with the same message. Each case runs twice, incrementally
and with the trusts off (every forward judged in full), and the two must agree."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.core.batch import RowWrite
from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.device import Stream
from overlapcheck.core.kv_shadow import KvShadow, PrefixHash
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.core.trace import PAGE_TABLE
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.invariants.kv_provenance import KvProvenance
from overlapcheck.scenarios.named import named_scenario

Edit = Callable[[SimDevice, list[RowWrite]], list[RowWrite]]


def two_decoding(max_tokens: int = 40) -> Scenario:
    """Two requests decoding side by side, a page per position, no prefix sharing."""
    requests = (
        RequestSpec(0, (5, 6, 7, 8, 9, 10), max_tokens=max_tokens, ignore_eos=True),
        RequestSpec(1, (50, 51, 52, 53), max_tokens=max_tokens, ignore_eos=True),
    )
    config = SchedulerConfig(num_slots=2, num_pages=128, cache="naive")
    return Scenario("two", config, requests)


def edit_page_table(monkeypatch: pytest.MonkeyPatch, at_copy: int, edit: Edit) -> None:
    """The scheduler's `at_copy`-th page-table copy goes out edited (a scheduler bug), in each
    run."""
    real = SimDevice.copy_to_device
    copies: dict[int, tuple[SimDevice, int]] = {}  # (the device kept, so that ids stay unique)

    def copy(self: SimDevice, buffer: str, writes: Sequence[RowWrite], stream: Stream) -> None:
        if buffer == PAGE_TABLE:
            count = copies.get(id(self), (self, 0))[1] + 1
            copies[id(self)] = (self, count)
            if count == at_copy:
                writes = edit(self, list(writes))
        real(self, buffer, writes, stream)

    monkeypatch.setattr(SimDevice, "copy_to_device", copy)


def judged_both_ways(
    monkeypatch: pytest.MonkeyPatch, scenario: Scenario, checks: Sequence[str] = ("kv-provenance",)
) -> tuple[RunResult, int]:
    """The run judged incrementally (and how many forwards only by their new positions), after
    asserting that judging every forward in full gives the same trace and the same violations."""
    full_judged = [0]
    real = KvProvenance._judge_all

    def counted(self: KvProvenance, *args: object) -> None:
        full_judged[0] += 1
        real(self, *args)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(KvProvenance, "incremental", False)
        full = run_scenario(scenario, SimBackend(), list(checks), keep_going=True)
    with monkeypatch.context() as m:
        m.setattr(KvProvenance, "_judge_all", counted)
        result = run_scenario(scenario, SimBackend(), list(checks), keep_going=True)
    assert result.trace_hash == full.trace_hash
    assert [v.to_json() for v in result.violations] == [v.to_json() for v in full.violations]
    forwards = sum(op.kind == "forward" for op in result.trace.ops)
    return result, forwards - full_judged[0]


def test_a_clean_decode_is_judged_by_its_new_positions() -> None:
    result = run_scenario(two_decoding(), SimBackend(), ["kv-provenance"])
    assert result.ok
    kv = result.checks[0]
    assert isinstance(kv, KvProvenance)
    assert kv.generation == 0  # no write ever hit a trusted cell
    forwards = sum(op.kind == "forward" for op in result.trace.ops)
    assert forwards > 30


def test_most_forwards_of_a_clean_decode_take_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    result, fast = judged_both_ways(monkeypatch, two_decoding())
    assert result.ok
    forwards = sum(op.kind == "forward" for op in result.trace.ops)
    assert fast >= forwards - 3


def test_a_verified_prompt_cell_overwritten_late_is_reported_where_it_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Thirty iterations in, request 1's new position is given request 0's prompt cell 3 (a page
    # reused too early): request 1's forward writes it, request 0's next forward reads it.
    def steal(device: SimDevice, writes: list[RowWrite]) -> list[RowWrite]:
        victim = int(device.page_table[0, 3])
        return [RowWrite(w.row, w.start, (victim,)) if w.row == 1 else w for w in writes]

    edit_page_table(monkeypatch, 30, steal)
    result, _ = judged_both_ways(monkeypatch, two_decoding())
    v = result.violations[0]
    assert v.invariant == "kv-provenance" and v.uids == (0,)
    assert v.details["position"] == 3
    assert "reads position 3 of request 0" in v.message
    assert "computed for position" in v.message  # request 1's later position
    writer = result.trace.ops[v.details["forward"]]
    assert writer.step > 25  # long after position 3 was verified


def test_a_stale_page_table_entry_in_a_verified_prefix_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Twenty iterations in, request 0's row entry 2 is rewritten to request 1's cell 2: the
    # same position of another context.
    def stale(device: SimDevice, writes: list[RowWrite]) -> list[RowWrite]:
        return [*writes, RowWrite(0, 2, (int(device.page_table[1, 2]),))]

    edit_page_table(monkeypatch, 20, stale)
    result, _ = judged_both_ways(monkeypatch, two_decoding())
    v = result.violations[0]
    assert v.invariant == "kv-provenance" and v.uids == (0,)
    assert v.details["position"] == 2
    assert "holds token 52" in v.message and "the request's token there is 7" in v.message


def test_a_read_is_judged_as_it_was_before_its_own_forward_overwrote_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Request 0's new position is given its own prompt cell 3: the forward reads position 3
    # right, then overwrites it; only the next forward reads it wrong.
    def clobber(device: SimDevice, writes: list[RowWrite]) -> list[RowWrite]:
        own = int(device.page_table[0, 3])
        return [RowWrite(0, w.start, (own,)) if w.row == 0 else w for w in writes]

    edit_page_table(monkeypatch, 25, clobber)
    result, _ = judged_both_ways(monkeypatch, two_decoding())
    v = result.violations[0]
    assert v.invariant == "kv-provenance" and v.details["position"] == 3
    reader = result.trace.ops[v.details["forward"]]
    written = re.search(r"\(step (\d+), requests \[0, 1\]\) computed for position", v.message)
    assert written is not None and int(written.group(1)) < reader.step, v.message


def test_a_cell_two_sequences_write_at_once_holds_the_later_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Request 0's new position is given the cell of request 1's new position: both write it in
    # one forward, request 1 (the later sequence) wins, and request 0 reads it next.
    def share(device: SimDevice, writes: list[RowWrite]) -> list[RowWrite]:
        ours = {w.row: w for w in writes}
        return [RowWrite(0, ours[0].start, ours[1].values), *writes[1:]]

    edit_page_table(monkeypatch, 25, share)
    result, _ = judged_both_ways(monkeypatch, two_decoding())
    v = result.violations[0]
    assert v.invariant == "kv-provenance" and v.uids == (0,)
    assert "computed for position" in v.message or "holds token" in v.message


@pytest.mark.parametrize(
    ("name", "faults"),
    [
        ("chunked-long", ["chunk-sample-overwrite"]),
        ("basic", []),
        ("shared-prefix", []),
        ("preemption", []),
    ],
)
def test_named_scenarios_judge_the_same_both_ways(
    monkeypatch: pytest.MonkeyPatch, name: str, faults: list[str]
) -> None:
    scenario = named_scenario(name).with_config(faults=frozenset(faults))
    result, _ = judged_both_ways(monkeypatch, scenario)
    assert result.ok is not bool(faults)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.data())
def test_a_decode_batchs_keys_are_the_general_paths(data: st.DataObject) -> None:
    # The shadow computes a decode batch's keys (one new position per sequence) in a few whole-
    # batch ops; they must be what the general path (any number of new positions) computes, and
    # what extending the last cached cell's key by the id gives.
    num_cells = data.draw(st.integers(1, 40))
    n = data.draw(st.integers(1, 9))
    starts = np.array(data.draw(st.lists(st.integers(0, 12), min_size=n, max_size=n)))
    width = int(starts.max()) + 1
    cells = np.array(
        data.draw(st.lists(st.integers(0, num_cells - 1), min_size=n * width, max_size=n * width))
    ).reshape(n, width)
    ids = np.array(
        data.draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n)),
        dtype=np.int32,
    )
    shadow = KvShadow(num_cells, 16)
    shadow.key[:] = data.draw(
        st.lists(st.integers(0, 2**64 - 1), min_size=num_cells, max_size=num_cells)
    )
    rows = np.arange(n)
    written = cells[rows, starts]
    shadow.read(0, rows, cells, starts, starts + 1, cells, cells, written, ids)
    rec = shadow.reads[0]
    assert rec.one_each
    general = shadow._new_keys(cells, starts, starts + 1, ids, width)
    assert general[0].tolist() == rows.tolist() and general[1].tolist() == starts.tolist()
    assert rec.new_keys.tolist() == general[2].tolist()
    before = [int(shadow.key[cells[i, s - 1]]) if s else 0 for i, s in enumerate(starts.tolist())]
    extended = [PrefixHash.extend(k, t) for k, t in zip(before, ids.tolist(), strict=True)]
    assert rec.new_keys.view(np.uint64).tolist() == extended
