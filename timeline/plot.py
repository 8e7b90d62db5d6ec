"""PNG/SVG timelines with matplotlib: one panel per run, a lane per host/stream, boxes labelled by
batch, idle stretches of the engine stream shaded, a violation drawn as an arrow between the two
conflicting operations.

Figures are built with `matplotlib.figure.Figure` and never through pyplot, so nothing global (the
pyplot backend, open figures) changes; `savefig` picks the Agg or SVG canvas from the extension.
The figure size is fixed (no tight bounding box), so a picture's pixel size follows from the
number of panels and lanes alone.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from matplotlib import patheffects
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter

from overlapcheck.core.errors import UserError
from overlapcheck.core.trace import HOST, Op
from overlapcheck.timeline.model import (
    ENGINE,
    Interval,
    Panel,
    PanelSummary,
    Rendered,
    batch_labels,
    engine_idle,
    highlighted_ops,
    interval,
    lanes,
    span_batches,
    summarise,
    sync_edges,
    violation_ops,
)

WIDTH_IN = 13.0
DPI = 100
LANE_IN = 0.5
PANEL_IN = 1.0  # title and time axis of one panel
LEGEND_IN = 0.65
CAPTION_LINE_IN = 0.17
CAPTION_WIDTH = 150  # characters per line of a violation's message
AXES_SHARE = 0.86  # about how much of the width the time axis gets (for label fitting)

HOST_COLORS = {"schedule": "#4C72B0", "launch": "#55A868", "process": "#DD8452"}
PREFILL, DECODE = "#8172B3", "#C44E52"
H2D, D2H = "#64B5CD", "#CCB974"
SLEEP = "#DDDDDD"
EDGE = "#555555"
OUTLINE = [patheffects.withStroke(linewidth=2, foreground="#333333")]
IDLE_SHADE = "#F6D55C"
VIOLATION = "#D62728"
# Room right of the run's end, so a violation marked at the last moment is drawn whole.
RIGHT_MARGIN = 0.04
MIN_OUTLINE_PX = 6.0  # an outlined box too thin to see is widened to this, centred on it
LABEL_LEFT_FROM = 0.8  # a marker past this share of the axis gets its label on its left


def plot_panels(
    panels: Sequence[Panel], out: Path, window: Interval | None = None, suptitle: str = ""
) -> Rendered:
    """Draw the panels one above the other on one time axis and save to `out` (.png or .svg)."""
    fig, summaries = build_figure(panels, window, suptitle)
    try:
        fig.savefig(out, dpi=DPI)
    except OSError as err:
        raise UserError(f"{out}: cannot write the timeline: {err.strerror or err}") from None
    size = fig.get_size_inches()
    return Rendered(out, summaries, (float(size[0]), float(size[1])), DPI)


def build_figure(
    panels: Sequence[Panel], window: Interval | None = None, suptitle: str = ""
) -> tuple[Figure, tuple[PanelSummary, ...]]:
    """The figure `plot_panels` saves, and what each panel shows (tests inspect its artists)."""
    lo, hi = window if window is not None else (0.0, max(p.total for p in panels) or 1e-6)
    if window is None and any(p.violation is not None for p in panels):
        hi += RIGHT_MARGIN * (hi - lo)
    heights = [
        len(lanes(p.trace)) * LANE_IN + PANEL_IN + _caption_lines(p) * CAPTION_LINE_IN
        for p in panels
    ]
    size = (WIDTH_IN, round(sum(heights) + LEGEND_IN + (0.35 if suptitle else 0.0), 2))
    fig = Figure(figsize=size, dpi=DPI, layout="constrained")
    axes = fig.subplots(len(panels), 1, sharex=True, height_ratios=heights, squeeze=False)[:, 0]
    px_per_s = WIDTH_IN * DPI * AXES_SHARE / (hi - lo)
    summaries = tuple(
        _draw_panel(ax, p, window, (lo, hi), px_per_s) for ax, p in zip(axes, panels, strict=True)
    )
    scale, unit = (1e3, "ms") if hi - lo >= 2e-3 else (1e6, "µs")
    axes[-1].xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x * scale:g}"))
    axes[-1].set_xlabel(f"time ({unit})")
    if suptitle:
        fig.suptitle(suptitle, fontsize=12, fontweight="bold")
    handles = _legend(
        violation=any(p.violation is not None for p in panels),
        host_idle=any(op.kind == "idle" for p in panels for op in p.trace.ops),
        cut_off=any(op.start is not None and not op.done for p in panels for op in p.trace.ops),
    )
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncols=-(-len(handles) // 2),
        fontsize=8,
        frameon=False,
    )
    return fig, summaries


def _caption_lines(panel: Panel) -> int:
    if panel.violation is None:
        return 0
    return len(textwrap.wrap(panel.violation.line(), CAPTION_WIDTH))


def _draw_panel(
    ax: Axes, panel: Panel, window: Interval | None, shown: Interval, px_per_s: float
) -> PanelSummary:
    trace = panel.trace
    lo, hi = shown
    lane_list = lanes(trace)
    ys = {lane.agent: float(len(lane_list) - 1 - i) for i, lane in enumerate(lane_list)}
    labels = batch_labels(trace)
    spans = span_batches(trace)

    # Idle stretches of the engine stream first, under everything else.
    gaps = engine_idle(panel, window)
    for a, b in gaps:
        ax.add_patch(
            Rectangle(
                (a, ys[ENGINE] - 0.5),
                b - a,
                1.0,
                facecolor=IDLE_SHADE,
                alpha=0.35,
                edgecolor="none",
                zorder=0,
            )
        )
    summary = summarise(panel, window)

    boxes = 0
    for op in trace.ops:
        when = interval(op, panel.total)
        if when is None or when[1] <= when[0] or when[1] < lo or when[0] > hi:
            continue
        label = _box(ax, op, when, ys[op.agent], labels, spans)
        boxes += 1
        if label and (when[1] - when[0]) * px_per_s >= 6.5 * len(label) + 4:
            ax.text(
                (when[0] + when[1]) / 2,
                ys[op.agent],
                label,
                ha="center",
                va="center",
                fontsize=7.5,
                color="white",
                fontweight="bold",
                zorder=4,
                clip_on=True,
                path_effects=OUTLINE,
            )

    # Cross-lane sync edges: from where the event fired to where the waiter went on past it.
    for record, wait in sync_edges(trace):
        if record.agent == wait.agent or record.end is None or wait.start is None:
            continue
        released = max(wait.start, record.end)
        if released >= lo and record.end <= hi:
            ax.plot(
                [record.end, released],
                [ys[record.agent], ys[wait.agent]],
                color=EDGE,
                lw=0.7,
                ls=":",
                zorder=3,
            )
            ax.plot(record.end, ys[record.agent], marker=".", ms=3, color=EDGE, zorder=3)

    if lo <= panel.total <= hi:
        ax.axvline(panel.total, color="black", lw=1.0, ls="--", zorder=5)
    title = summary.title
    outlined: tuple[int, ...] = ()
    if panel.violation is not None:
        outlined = _draw_violation(ax, panel, ys, shown, px_per_s)
        title += "\n" + "\n".join(textwrap.wrap(panel.violation.line(), CAPTION_WIDTH))
    ax.set_title(title, loc="left", fontsize=9.5)
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.6, len(lane_list) - 0.4)
    ax.set_yticks(list(ys.values()), [lane.name for lane in lane_list], fontsize=9)
    ax.grid(axis="x", color="#EEEEEE", zorder=-1)
    ax.set_axisbelow(True)
    return replace(summary, boxes=boxes, outlined=outlined)


def _box(
    ax: Axes, op: Op, when: Interval, y: float, labels: dict[int, str], spans: dict[int, int]
) -> str:
    """Draw one op's box; return the text it should carry."""
    height, hatch, face, text = 0.8, "", "#999999", ""
    if op.agent == HOST:
        if op.kind == "span":
            face = HOST_COLORS.get(op.label, "#999999")
            text = labels.get(spans.get(op.seq, -1), "")
        elif op.kind == "idle":
            face, height = SLEEP, 0.5
        else:  # a host wait inside a span: drawn over it, hatched
            face, height, hatch = "white", 0.45, "////"
    elif op.kind == "forward":
        face = PREFILL if op.label.startswith("P") else DECODE
        text = op.label
    elif op.kind in ("h2d", "d2h"):
        face, height = (H2D if op.kind == "h2d" else D2H), 0.55
    elif op.kind == "wait":
        face, height, hatch = "white", 0.45, "////"
    ax.add_patch(
        Rectangle(
            (when[0], y - height / 2),
            when[1] - when[0],
            height,
            facecolor=face,
            edgecolor="#444444" if hatch else "white",
            lw=0.5,
            hatch=hatch,
            alpha=1.0 if op.done else 0.5,  # cut off by the end of the run
            zorder=2 if op.kind != "span" else 1,
        )
    )
    return text


def _draw_violation(
    ax: Axes, panel: Panel, ys: dict[str, float], shown: Interval, px_per_s: float
) -> tuple[int, ...]:
    """Outline the boxes of both operations, arrow from the first access to the second, mark
    where it broke; return the seqs of the outlined boxes."""
    v = panel.violation
    assert v is not None
    first, second = violation_ops(panel.trace, v)
    target = _point(second, ys, panel.total) if second is not None else (v.time, ys[HOST])
    outlined = []
    for box in highlighted_ops(panel.trace, v):
        when = interval(box, panel.total)
        if when is None:
            continue
        # A zero-length op (a record, a copy that never ran long) still gets a visible frame.
        pad = max(0.0, MIN_OUTLINE_PX / px_per_s - (when[1] - when[0])) / 2
        ax.add_patch(
            Rectangle(
                (when[0] - pad, ys[box.agent] - 0.45),
                when[1] - when[0] + 2 * pad,
                0.9,
                fill=False,
                edgecolor=VIOLATION,
                lw=2.0,
                zorder=6,
                gid=f"outline-{box.seq}",
            )
        )
        outlined.append(box.seq)
    if first is not None:
        source = _point(first, ys, panel.total)
        ax.annotate(
            "",
            xy=target,
            xytext=source,
            zorder=7,
            arrowprops={
                "arrowstyle": "-|>",
                "color": VIOLATION,
                "lw": 2.0,
                "connectionstyle": "arc3,rad=-0.25",
                "shrinkA": 0,
                "shrinkB": 4,
            },
        )
        ax.plot(*source, marker="o", ms=7, mfc="white", mec=VIOLATION, mew=2, zorder=8)
    ax.plot(*target, marker="X", ms=12, color=VIOLATION, mec="white", zorder=8)
    # Near the right edge the label goes left of the marker, so it stays inside the picture.
    lo, hi = shown
    on_left = target[0] >= lo + LABEL_LEFT_FROM * (hi - lo)
    ax.annotate(
        v.invariant,
        xy=target,
        xytext=(-9 if on_left else 9, 6),
        textcoords="offset points",
        ha="right" if on_left else "left",
        va="bottom",
        zorder=9,
        color=VIOLATION,
        fontsize=9,
        fontweight="bold",
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": VIOLATION, "lw": 1},
        gid="violation-label",
    )
    return tuple(outlined)


def _point(op: Op, ys: dict[str, float], end: float) -> tuple[float, float]:
    """Where an op's access happens on the picture: its start (a kernel reads when it starts)."""
    when = interval(op, end)
    return (when[0] if when is not None else op.issue), ys[op.agent]


def _legend(violation: bool, host_idle: bool, cut_off: bool) -> list[Patch | Line2D]:
    handles: list[Patch | Line2D] = [
        Patch(facecolor=HOST_COLORS["schedule"], label="host: schedule"),
        Patch(facecolor=HOST_COLORS["launch"], label="host: launch"),
        Patch(facecolor=HOST_COLORS["process"], label="host: process results"),
    ]
    if host_idle:
        handles.append(Patch(facecolor=SLEEP, label="host idle (until an arrival)"))
    handles += [
        Patch(facecolor=PREFILL, label="forward (prefill)"),
        Patch(facecolor=DECODE, label="forward (decode)"),
        Patch(facecolor=H2D, label="H2D copy"),
        Patch(facecolor=D2H, label="D2H copy"),
        Patch(facecolor="white", edgecolor="#444444", hatch="////", label="waiting on an event"),
        Patch(facecolor=IDLE_SHADE, alpha=0.35, label="engine stream idle"),
        Line2D([], [], color=EDGE, lw=0.7, ls=":", marker=".", ms=3, label="event record → wait"),
    ]
    if cut_off:
        handles.append(Patch(facecolor="#999999", alpha=0.5, label="unfinished when it stopped"))
    if violation:
        handles += [
            Patch(fill=False, edgecolor=VIOLATION, lw=2.0, label="operations involved"),
            Line2D([], [], color=VIOLATION, marker="X", lw=2, label="violation"),
        ]
    return handles
