"""Save and load a run's trace as JSON (`overlapcheck run --trace PATH`), for the timeline and for
counterexamples that embed one.

Every op keeps all its fields. A footprint's cells are stored as runs `[first, length]` in their
original order: footprints are row slices, so a few runs hold thousands of cells and the saved trace
stays small while loading gives back the same cells (and the same `Trace.digest()`). A footprint
that needs more than `MAX_RUNS` runs is summarised (count and the first cells) and marked lossy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from overlapcheck.core.errors import UserError
from overlapcheck.core.sites import Location
from overlapcheck.core.trace import Access, Message, Op, Trace
from overlapcheck.formats.jsonfile import check_header, read_json_file
from overlapcheck.invariants.base import Violation

if TYPE_CHECKING:
    from overlapcheck.harness.runner import RunResult

FORMAT = "overlapcheck-trace"
VERSION = 1
MAX_RUNS = 256
SAMPLE = 16


@dataclass
class SavedTrace:
    """A trace read back from a file, with what the run said about itself."""

    trace: Trace
    violations: list[Violation]
    scenario: dict[str, Any]
    run: dict[str, Any] = field(default_factory=dict)
    lossless: bool = True

    @property
    def name(self) -> str:
        return str(self.scenario.get("name", "trace"))

    @property
    def loop(self) -> str:
        return str(self.scenario.get("config", {}).get("loop", "?"))

    @property
    def simulated_seconds(self) -> float | None:
        value = self.run.get("simulated_seconds")
        return float(value) if value is not None else None


# -- writing ----------------------------------------------------------------------------------


def save_trace(result: RunResult, path: str | Path) -> Path:
    """Write the run's trace, violations and scenario to `path` (JSON)."""
    out = Path(path)
    try:
        text = json.dumps(result_to_json(result), separators=(",", ":"), default=_plain)
        out.write_text(text + "\n")
    except OSError as err:
        raise UserError(f"{out}: cannot write the trace: {err.strerror or err}") from None
    return out


def result_to_json(result: RunResult) -> dict[str, Any]:
    scenario = result.scenario.to_json()
    scenario["config"]["faults"] = sorted(result.config.faults)
    return {
        "format": FORMAT,
        "version": VERSION,
        "backend": result.backend,
        "scenario": scenario,
        "run": {
            "iterations": result.iterations,
            "simulated_seconds": result.simulated_seconds,
            "trace_hash": result.trace_hash,
            "ok": result.ok,
        },
        "violations": [v.to_json() for v in result.violations],
        "trace": trace_to_json(result.trace),
    }


def trace_to_json(trace: Trace) -> dict[str, Any]:
    return {
        "ops": [_op_to_json(op) for op in trace.ops],
        "messages": [_message_to_json(m) for m in trace.messages],
        "received": [_message_to_json(m) for m in trace.received],
    }


def _message_to_json(m: Message) -> dict[str, Any]:
    return {
        "time": m.time,
        "step": m.step,
        "uid": m.uid,
        "kind": m.kind,
        "token": m.token,
        "finished": m.finished,
        "reason": m.reason,
    }


def _op_to_json(op: Op) -> dict[str, Any]:
    return {
        **op.identity(),
        "issue": op.issue,
        "start": op.start,
        "end": op.end,
        "delay": op.delay,
        "work": op.work,
        "records": op.records,
        "waits": op.waits,
        "accesses": [_access_to_json(a) for a in op.accesses],
    }


def _access_to_json(acc: Access) -> dict[str, Any]:
    cells = np.asarray(acc.cells, dtype=np.int64)
    out: dict[str, Any] = {"buffer": acc.buffer, "mode": acc.mode, "count": len(cells)}
    runs = _runs(cells)
    if len(runs) <= MAX_RUNS:
        out["runs"] = runs
    else:
        out["sample"] = [int(c) for c in cells[:SAMPLE]]
    return out


def _runs(cells: np.ndarray) -> list[list[int]]:
    """`cells` as consecutive runs `[first, length]`, in order (duplicates and all)."""
    if len(cells) == 0:
        return []
    breaks = np.flatnonzero(np.diff(cells) != 1) + 1
    starts = np.concatenate([[0], breaks])
    lengths = np.diff(np.concatenate([starts, [len(cells)]]))
    return [[int(cells[s]), int(n)] for s, n in zip(starts, lengths, strict=True)]


def _plain(value: Any) -> Any:
    # Violation details may hold numpy scalars or tuples from the checkers.
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"cannot save {type(value).__name__} in a trace")


# -- reading ----------------------------------------------------------------------------------


def load_trace(path: str | Path) -> SavedTrace:
    """Read a file written by `save_trace`. Any problem is a one-line UserError."""
    return trace_file_from_json(read_json_file(path, "trace"), where=str(path))


def trace_file_from_json(data: Any, where: str = "trace") -> SavedTrace:
    check_header(data, FORMAT, VERSION, "trace", where)
    try:
        trace, lossless = trace_from_json(data["trace"])
        violations = [_violation(v) for v in data.get("violations", [])]
        scenario = data.get("scenario", {})
        run = data.get("run", {})
        if not isinstance(scenario, dict) or not isinstance(run, dict):
            raise TypeError("'scenario' and 'run' must be objects")
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as err:
        raise UserError(f"{where}: malformed trace: {_reason(err)}") from None
    return SavedTrace(trace, violations, scenario, run, lossless)


def trace_from_json(data: dict[str, Any]) -> tuple[Trace, bool]:
    """The trace, and whether every footprint came back whole. Raises KeyError, TypeError or
    ValueError on a malformed object."""
    trace = Trace()
    lossless = True
    for i, raw in enumerate(data["ops"]):
        accesses = []
        for a in raw["accesses"]:
            acc, whole = _access(a)
            accesses.append(acc)
            lossless &= whole
        op = Op(
            seq=int(raw["seq"]),
            agent=str(raw["agent"]),
            kind=str(raw["kind"]),
            step=int(raw["step"]),
            phase=str(raw["phase"]),
            issue=float(raw["issue"]),
            label=str(raw["label"]),
            batch=_opt_int(raw["batch"]),
            uids=tuple(int(u) for u in raw["uids"]),
            accesses=accesses,
            records=_opt_int(raw["records"]),
            waits=_opt_int(raw["waits"]),
            start=_opt_float(raw["start"]),
            end=_opt_float(raw["end"]),
            delay=float(raw["delay"]),
            work=int(raw.get("work", 0)),  # absent from traces saved before it was kept
        )
        if op.seq != i:
            raise ValueError(f"op {i} has seq {op.seq}: ops must be in issue order")
        trace.add(op)
    trace.messages.extend(_message(m) for m in data["messages"])
    trace.received.extend(_message(m) for m in data["received"])
    return trace, lossless


def _message(raw: dict[str, Any]) -> Message:
    return Message(
        time=float(raw["time"]),
        step=int(raw["step"]),
        uid=int(raw["uid"]),
        kind=str(raw["kind"]),
        token=int(raw["token"]),
        finished=_flag(raw["finished"], "finished"),
        reason=str(raw["reason"]),
    )


def _access(raw: dict[str, Any]) -> tuple[Access, bool]:
    mode = raw["mode"]
    if mode not in ("r", "w"):
        raise ValueError(f"access mode {mode!r} is neither 'r' nor 'w'")
    if "runs" in raw:
        parts = [np.arange(int(s), int(s) + int(n), dtype=np.int64) for s, n in raw["runs"]]
        cells = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        if len(cells) != int(raw["count"]):
            raise ValueError(
                f"{raw['buffer']}: runs hold {len(cells)} cells, count says {raw['count']}"
            )
        return Access(str(raw["buffer"]), cells, mode), True
    cells = np.asarray([int(c) for c in raw["sample"]], dtype=np.int64)
    return Access(str(raw["buffer"]), cells, mode), False


def _violation(raw: dict[str, Any]) -> Violation:
    return Violation(
        invariant=str(raw["invariant"]),
        step=int(raw["step"]),
        time=float(raw["time"]),
        uids=tuple(int(u) for u in raw["uids"]),
        message=str(raw["message"]),
        details=dict(raw.get("details", {})),
        locations=tuple(Location.from_json(loc) for loc in raw.get("locations", [])),
    )


def _flag(value: Any, name: str) -> bool:
    # bool("false") is True: a string here would silently mean the opposite.
    if not isinstance(value, bool):
        raise TypeError(f"message field {name!r} must be true or false, got {value!r}")
    return value


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _reason(err: Exception) -> str:
    if isinstance(err, KeyError):
        return f"missing field {err.args[0]!r}"
    return str(err).splitlines()[0] if str(err) else type(err).__name__
