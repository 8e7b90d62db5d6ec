"""Timelines: Chrome JSON structure, pictures, overlap vs normal, trace files, the CLI."""

from __future__ import annotations

import argparse
import json
import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.colors import to_rgb, to_rgba
from matplotlib.patches import Rectangle

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile, SeededDelay, Timing
from overlapcheck.cli import build_parser
from overlapcheck.cli import main as cli
from overlapcheck.core.trace import Access, Op, Trace
from overlapcheck.formats.trace_file import load_trace, save_trace, trace_from_json, trace_to_json
from overlapcheck.harness.runner import RunResult, run_scenario
from overlapcheck.reference.faults import parse_faults
from overlapcheck.scenarios.named import named_scenario
from overlapcheck.timeline.compare import render_compare, run_both
from overlapcheck.timeline.model import Panel, highlighted_ops, interval, violation_ops
from overlapcheck.timeline.plot import VIOLATION, build_figure
from overlapcheck.timeline.render import render_result, render_trace

LANES = ["host", "scheduler stream", "engine stream"]
Pair = tuple[RunResult, RunResult]


@pytest.fixture(scope="module")
def pair() -> Pair:
    return run_both(named_scenario("early-eos"), SimBackend)


@pytest.fixture(scope="module")
def race() -> RunResult:
    scenario = named_scenario("single-slot").with_config(
        faults=parse_faults(["copy-done-wrong-stream"])
    )
    result = run_scenario(scenario, SimBackend())
    assert [v.invariant for v in result.violations] == ["no-race"]
    return result


@pytest.fixture(scope="module")
def slot() -> RunResult:
    scenario = named_scenario("abort").with_config(faults=parse_faults(["free-slot-early"]))
    result = run_scenario(scenario, SimBackend())
    assert [v.invariant for v in result.violations] == ["slot-not-in-flight"]
    return result


def panel(result: RunResult) -> Panel:
    return Panel(result.trace, "t", result.simulated_seconds, next(iter(result.violations), None))


def chrome(result: RunResult, tmp_path: Path) -> list[dict[str, Any]]:
    out = tmp_path / "t.json"
    render_result(result, out)
    events: list[dict[str, Any]] = json.loads(out.read_text())["traceEvents"]
    return events


def edges(trace: Trace) -> set[tuple[int, int]]:
    recorded = {op.records: op.seq for op in trace.ops if op.records is not None}
    return {
        (recorded[op.waits], op.seq)
        for op in trace.ops
        if op.waits is not None and op.waits in recorded
    }


def flows(events: list[dict[str, Any]], cat: str) -> set[tuple[int, int]]:
    ends: dict[int, dict[str, int]] = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf" and e["cat"] == cat:
            key = "from_seq" if e["ph"] == "s" else "to_seq"
            ends[e["id"]][key] = e["args"][key]
    return {(v["from_seq"], v["to_seq"]) for v in ends.values()}


# -- Chrome Trace Event JSON -------------------------------------------------------------------


def test_chrome_one_named_thread_per_lane(pair: Pair, tmp_path: Path) -> None:
    events = chrome(pair[0], tmp_path)
    threads = sorted((e for e in events if e["name"] == "thread_name"), key=lambda e: e["tid"])
    assert [e["args"]["name"] for e in threads] == LANES
    assert len({e["tid"] for e in threads}) == 3
    assert len([e for e in events if e["name"] == "process_name"]) == 1
    assert all(e["ph"] == "M" for e in threads)


def test_chrome_one_complete_event_per_op(pair: Pair, tmp_path: Path) -> None:
    trace = pair[0].trace
    events = chrome(pair[0], tmp_path)
    tids = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    complete = [e for e in events if e["ph"] == "X"]
    assert sorted(e["args"]["seq"] for e in complete) == [op.seq for op in trace.ops]
    for e in complete:
        op = trace.ops[e["args"]["seq"]]
        assert op.start is not None and op.end is not None
        assert e["ts"] == pytest.approx(op.start * 1e6, abs=1e-3)
        assert e["dur"] == pytest.approx((op.end - op.start) * 1e6, abs=2e-3)
        assert e["tid"] == tids[LANES[["host", "scheduler", "engine"].index(op.agent)]]
    forwards = [e for e in complete if e["cat"] == "forward"]
    assert all(e["args"]["batch"] == e["name"] for e in forwards)
    assert any("tokens" in e["args"] for e in forwards)  # what each batch sampled, where known


def test_chrome_slices_nest_on_every_thread(pair: Pair, tmp_path: Path) -> None:
    # Perfetto rejects partly overlapping slices on one thread; ours must nest or follow each other.
    by_thread: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in chrome(pair[1], tmp_path):
        if e["ph"] == "X":
            start = round(e["ts"] * 1000)
            by_thread[e["tid"]].append((start, start + round(e["dur"] * 1000)))
    for slices in by_thread.values():
        stack: list[int] = []
        for start, end in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1], (start, end, stack)
            stack.append(end)


def test_chrome_flow_for_every_sync_edge(pair: Pair, tmp_path: Path) -> None:
    trace = pair[0].trace
    expected = edges(trace)
    # Stream waits (`wait_stream` before each forward) and host waits (copy-done, staging buffer).
    assert {trace.ops[wait].agent for _, wait in expected} == {"host", "engine"}
    assert flows(chrome(pair[0], tmp_path), "sync") == expected


def test_chrome_violation_instant_and_flow(race: RunResult, tmp_path: Path) -> None:
    events = chrome(race, tmp_path)
    instants = [e for e in events if e["ph"] == "i" and e["cat"] == "violation"]
    assert [e["name"] for e in instants] == ["VIOLATION no-race"]
    assert instants[0]["ts"] == pytest.approx(race.violations[0].time * 1e6, abs=1e-3)
    details = race.violations[0].details
    assert flows(events, "violation") == {(details["first"]["seq"], details["second"]["seq"])}
    assert flows(events, "sync") == edges(race.trace)


def test_chrome_marks_ops_cut_off_by_a_violation(race: RunResult, tmp_path: Path) -> None:
    events = chrome(race, tmp_path)
    never_ran = {op.seq for op in race.trace.ops if op.start is None}
    cut = {op.seq for op in race.trace.ops if op.start is not None and op.end is None}
    assert never_ran and cut  # the run stopped with a forward and its copy still queued
    assert {e["args"]["seq"] for e in events if e["args"].get("never_ran")} == never_ran
    assert {e["args"]["seq"] for e in events if e["args"].get("unfinished")} == cut


# -- pictures ----------------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    return width, height


def test_png_and_svg_of_a_violation(race: RunResult, tmp_path: Path) -> None:
    png = render_result(race, tmp_path / "race.png")
    assert png.path.stat().st_size > 10_000
    assert png_size(png.path) == png.size_px
    assert png.size_px[0] == 1300
    svg = render_result(race, tmp_path / "race.svg")
    text = svg.path.read_text()
    assert svg.size_in is not None
    assert f'width="{svg.size_in[0] * 72:g}pt"' in text
    assert "no-race" in text  # the caption names the invariant


def test_window_limits_what_is_drawn(pair: Pair, tmp_path: Path) -> None:
    whole = render_result(pair[0], tmp_path / "whole.png")
    part = render_result(pair[0], tmp_path / "part.png", window=(100e-6, 300e-6))
    assert 0 < part.panels[0].boxes < whole.panels[0].boxes
    assert "window 100-300 µs" in part.panels[0].title


def test_render_trace_for_exploration(race: RunResult, tmp_path: Path) -> None:
    # explore names the picture after the counterexample file; the title adds its invariant.
    v = race.violations[0]
    out = render_trace(race.trace, tmp_path / "cx.png", v, title="no-race-1a2b3c4d")
    assert out.panels[0].title.startswith(f"no-race-1a2b3c4d — no-race, step {v.step}: ")
    assert out.panels[0].total == pytest.approx(race.simulated_seconds)
    assert png_size(out.path) == out.size_px


def outlines(fig: Any) -> dict[int, Rectangle]:
    """The violation outlines drawn, by the seq of the op whose box each frames."""
    found = {}
    for patch in fig.axes[0].patches:
        gid = patch.get_gid() or ""
        if gid.startswith("outline-"):
            assert not patch.get_fill() and patch.get_edgecolor() == to_rgba(VIOLATION)
            found[int(gid.removeprefix("outline-"))] = patch
    return found


def test_race_outlines_the_boxes_of_both_accesses(race: RunResult) -> None:
    v = race.violations[0]
    first, second = (race.trace.ops[v.details[key]["seq"]] for key in ("first", "second"))
    # The host's read of the output takes no time: its box is the `process` span it ran in.
    assert second.agent == "host" and second.start == second.end
    boxes = highlighted_ops(race.trace, v)
    assert boxes[0] is first
    span = boxes[1]
    assert (span.agent, span.kind, span.label) == ("host", "span", "process")
    assert span.start is not None and span.end is not None
    assert span.start <= second.issue <= span.end
    fig, summaries = build_figure([panel(race)])
    drawn = outlines(fig)
    assert set(drawn) == {first.seq, span.seq}
    assert summaries[0].outlined == (first.seq, span.seq)
    for op in boxes:  # each frame covers its box, so both show
        when = interval(op, race.simulated_seconds)
        assert when is not None and when[1] > when[0]
        frame = drawn[op.seq]
        assert frame.get_x() <= when[0] and frame.get_x() + frame.get_width() >= when[1]


def test_slot_violation_outlines_both_forwards(slot: RunResult) -> None:
    v = slot.violations[0]
    first, second = violation_ops(slot.trace, v)
    assert first is not None and second is not None
    assert first.kind == second.kind == "forward" and first.seq < second.seq
    # The report names them only in words: "slot 1 used by P3 for request 3 while P2 (step 1)".
    assert f"used by {second.label} for request {v.uids[0]} " in v.message
    assert f"while {first.label} (step {first.step}), which uses it for request {v.uids[1]}" in (
        v.message
    )
    fig, summaries = build_figure([panel(slot)])
    assert set(outlines(fig)) == {first.seq, second.seq}
    assert summaries[0].outlined == (first.seq, second.seq)


def test_violation_marker_and_label_stay_inside(race: RunResult) -> None:
    fig, _ = build_figure([panel(race)])
    fig.draw_without_rendering()  # lays the figure out, as saving it does
    ax = fig.axes[0]
    axes_box = ax.get_window_extent()
    # The race's second access is the host's read at the very end of the run...
    marker = next(line for line in ax.lines if line.get_marker() == "X")
    x = float(np.asarray(marker.get_xdata(), dtype=float)[0])
    assert x == pytest.approx(race.simulated_seconds)
    # ... and the whole marker (12 pt across) and its label are drawn inside the time axis.
    right = ax.transData.transform((x, 0))[0] + 12 / 72 * fig.dpi / 2
    assert ax.get_xlim()[0] < x and right < axes_box.x1
    label = next(t for t in ax.texts if t.get_gid() == "violation-label")
    assert label.get_text() == "no-race"
    box = label.get_window_extent()
    assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1 and box.y1 <= axes_box.y1


def test_legend_explains_every_colour_drawn(slot: RunResult) -> None:
    clean = run_scenario(named_scenario("abort"), SimBackend())
    assert any(op.kind == "idle" for op in clean.trace.ops)  # the host sleeps until an abort
    fig, _ = build_figure([panel(clean), panel(slot)])
    legend = fig.legends[0]
    explained = {
        to_rgb(h.get_facecolor()) for h in legend.legend_handles if isinstance(h, Rectangle)
    }
    labels = [t.get_text() for t in legend.get_texts()]
    assert {"host idle (until an arrival)", "violation", "operations involved"} <= set(labels)
    for ax in fig.axes:
        for patch in ax.patches:
            if patch.get_fill():  # outlines are explained by their own entry
                assert to_rgb(patch.get_facecolor()) in explained, patch


# -- overlap vs normal -------------------------------------------------------------------------


def test_compare_totals_are_the_runs_simulated_times(pair: Pair, tmp_path: Path) -> None:
    overlap, normal = pair
    rendered = render_compare(overlap, normal, tmp_path / "cmp.png")
    totals = [p.total for p in rendered.panels]
    assert totals == [overlap.simulated_seconds, normal.simulated_seconds]
    assert png_size(rendered.path) == rendered.size_px
    assert overlap.simulated_seconds < normal.simulated_seconds
    # The point of the picture: the engine stream idles less under the overlap loop.
    assert rendered.panels[0].engine_idle < rendered.panels[1].engine_idle


def first_op(trace: Trace, kind: str, batch: int) -> Op:
    return next(op for op in trace.ops if op.kind == kind and op.batch == batch)


def forward_batches(trace: Trace) -> list[int]:
    return sorted({op.batch for op in trace.ops if op.kind == "forward" and op.batch is not None})


def test_overlap_launches_next_batch_before_processing(pair: Pair) -> None:
    overlap, normal = pair
    batches = forward_batches(overlap.trace)
    assert len(batches) >= 3
    for n in batches[:-1]:
        launch, read = (
            first_op(overlap.trace, "forward", n + 1),
            first_op(overlap.trace, "read_output", n),
        )
        assert launch.seq < read.seq and launch.issue <= read.issue
        # ... and batch N+1's forward runs on the engine while the host processes batch N.
        assert launch.end is not None and launch.end > read.issue
    for n in forward_batches(normal.trace)[:-1]:
        read, launch = (
            first_op(normal.trace, "read_output", n),
            first_op(normal.trace, "forward", n + 1),
        )
        assert read.seq < launch.seq and read.issue < launch.issue


# -- trace files -------------------------------------------------------------------------------


def test_trace_file_round_trip(race: RunResult, tmp_path: Path) -> None:
    saved = load_trace(save_trace(race, tmp_path / "t.json"))
    assert saved.lossless
    assert saved.trace.digest() == race.trace_hash
    assert saved.violations == race.violations
    assert saved.simulated_seconds == race.simulated_seconds


def test_trace_file_keeps_delays_and_received_messages(tmp_path: Path) -> None:
    result = run_scenario(named_scenario("abort"), SimBackend(Timing(source=SeededDelay(3))))
    saved = load_trace(save_trace(result, tmp_path / "t.json"))
    assert saved.trace.digest() == result.trace_hash
    delays = [op.delay for op in result.trace.ops]
    assert any(delays) and [op.delay for op in saved.trace.ops] == delays
    works = [op.work for op in result.trace.ops]  # what calibration fits host phases against
    assert any(works) and [op.work for op in saved.trace.ops] == works
    assert saved.trace.received == result.trace.received != []


def test_scattered_footprint_is_summarised() -> None:
    trace = Trace()
    cells = np.arange(0, 2000, 2)  # 1000 runs of one cell
    trace.add(Op(0, "host", "stage", 0, "schedule", 0.0, accesses=[Access("kv", cells, "w")]))
    data = trace_to_json(trace)
    assert data["ops"][0]["accesses"][0]["count"] == 1000
    loaded, lossless = trace_from_json(json.loads(json.dumps(data)))
    assert not lossless
    assert list(loaded.ops[0].accesses[0].cells) == list(cells[:16])


# -- command line ------------------------------------------------------------------------------


def test_cli_run_trace_then_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, png = tmp_path / "t.json", tmp_path / "run.png"
    argv = [
        "run",
        "--scenario",
        "single-slot",
        "--fault",
        "copy-done-wrong-stream",
        "--trace",
        str(trace),
        "--timeline",
        str(png),
    ]
    assert cli(argv) == 1  # the fault is found
    assert png_size(png)[0] == 1300
    out = tmp_path / "again.svg"
    assert cli(["timeline", str(trace), "-o", str(out), "--window", "50:150"]) == 0
    assert out.stat().st_size > 0
    assert "window 50-150 µs" in capsys.readouterr().out


def test_cli_counterexample_is_replayed(race: RunResult, tmp_path: Path) -> None:
    counterexample = pytest.importorskip("overlapcheck.formats.counterexample")
    path = counterexample.save(race, Profile(), {}, tmp_path)
    out = tmp_path / "cx.json"
    assert cli(["timeline", str(path), "-o", str(out)]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    assert "VIOLATION no-race" in [e["name"] for e in events]
    # Titled by the file and its invariant, not by the generated scenario every one shares.
    [process] = [e["args"]["name"] for e in events if e["name"] == "process_name"]
    assert process == f"{path.stem} — no-race, step {race.violations[0].step}"


def test_a_counterexample_whose_scheduler_changed_is_drawn_saying_so(tmp_path: Path) -> None:
    """The drawing is a replay of the code as it is now: after a fix it is not the recorded
    failure, and the title and a note say so (they once drew it under the old title)."""
    import subprocess
    import sys

    from overlapcheck.formats import counterexample
    from overlapcheck.harness.scheduler_spec import SchedulerSpec

    plugin = tmp_path / "mine.py"
    plugin.write_text(
        "from dataclasses import replace\n"
        "from overlapcheck.reference.scheduler import Scheduler\n\n\n"
        "def make(config, device, source, sink):\n"
        "    return Scheduler(replace(config, faults=FAULTS), device, source, sink)\n\n\n"
        'FAULTS = frozenset({"copy-done-wrong-stream"})\n'
    )
    spec = SchedulerSpec.load(f"{plugin}:make")
    found = run_scenario(named_scenario("single-slot"), SimBackend(), scheduler=spec)
    path = counterexample.save(found, Profile(), {}, tmp_path, scheduler=spec)
    plugin.write_text(plugin.read_text().replace('{"copy-done-wrong-stream"}', "()"))
    out = tmp_path / "cx.json"
    drawn = subprocess.run(
        [sys.executable, "-m", "overlapcheck", "timeline", str(path), "-o", str(out), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert drawn.returncode == 0, drawn.stderr
    [panel] = json.loads(drawn.stdout)["panels"]
    assert "the scheduler's code changed since it was saved: mine.py" in panel["title"]
    assert "no-race no longer fires" in panel["title"]
    assert "note: drawing the replay of" in drawn.stderr


def test_cli_json_describes_the_picture(
    race: RunResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counterexample = pytest.importorskip("overlapcheck.formats.counterexample")
    path = counterexample.save(race, Profile(), {}, tmp_path)
    out = tmp_path / "cx.png"
    assert cli(["timeline", str(path), "-o", str(out), "--window", "0:100", "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # one object and nothing else on stdout
    assert data["output"] == str(out) and data["format"] == "png"
    assert data["size_px"] == list(png_size(out))
    assert data["window_us"] == [0, 100]
    [shown] = data["panels"]
    assert shown["operations"] == len(race.trace.ops)
    assert 0 < shown["drawn"] < shown["operations"]
    assert shown["violation"] == "no-race" and len(shown["outlined"]) == 2
    assert shown["title"].startswith(f"{path.stem} — no-race")
    # The human lines go to stderr.
    assert captured.err.splitlines() == [shown["title"], f"wrote {out}"]


def test_cli_json_describes_the_perfetto_file(
    pair: Pair, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, out = tmp_path / "t.json", tmp_path / "perfetto.json"
    save_trace(pair[0], trace)
    assert cli(["timeline", str(trace), "-o", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "perfetto" and data["size_px"] is None
    assert data["window_us"] is None
    [shown] = data["panels"]
    assert shown["violation"] is None and shown["outlined"] == []
    assert shown["operations"] == shown["drawn"] == len(pair[0].trace.ops)


def test_every_timeline_option_states_its_default_and_choices() -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices["timeline"]
    for action in parser._actions:
        if action.dest != "help":
            assert "default" in (action.help or ""), action.dest
    text = " ".join(parser.format_help().split())
    assert "{cuda,cpu}" in text and "{tiny,qwen3-0.6b}" in text
    assert "basic, shared-prefix" in text  # the named scenarios
    assert ".png, .svg, .json" in text


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "make_argv",
    [
        lambda d: ["timeline", write(d, "t.json", "{}"), "-o", str(d / "out.gif")],
        lambda d: ["timeline", str(d / "missing.json"), "-o", str(d / "out.png")],
        lambda d: ["timeline", write(d, "bad.json", "{not json"), "-o", str(d / "out.png")],
        lambda d: ["timeline", write(d, "other.json", '{"format": "x"}'), "-o", str(d / "out.png")],
        lambda d: [
            "timeline",
            write(d, "v9.json", '{"format": "overlapcheck-trace", "version": 9}'),
            "-o",
            str(d / "out.png"),
        ],
        lambda d: [
            "timeline",
            write(
                d,
                "broken.json",
                '{"format": "overlapcheck-trace", "version": 1, "trace": {"ops": [{}]}}',
            ),
            "-o",
            str(d / "o.svg"),
        ],
        lambda d: [
            "timeline",
            write(d, "t.json", "{}"),
            "-o",
            str(d / "out.png"),
            "--window",
            "9:3",
        ],
        lambda d: ["timeline", "-o", str(d / "out.png")],
        lambda d: ["timeline", write(d, "t.json", "{}"), "-o", str(d / "out.png"), "--seed", "3"],
        lambda d: ["timeline", "--compare", "--scenario", "nope", "-o", str(d / "out.png")],
        lambda d: [
            "timeline",
            "--compare",
            "--scenario",
            "basic",
            "-o",
            str(d / "no/such/dir.png"),
        ],
    ],
    ids=[
        "extension",
        "missing",
        "malformed",
        "format",
        "version",
        "fields",
        "window",
        "no-file",
        "seed-with-file",
        "scenario",
        "folder",
    ],
)
def test_cli_bad_input_is_one_line_exit_2(
    make_argv: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        raise SystemExit(cli(make_argv(tmp_path)))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("overlapcheck")
