"""The JSON of one run, as `overlapcheck run --json` prints it: the configuration that ran, each
request's tokens and finish reason, the violations, the trace hash and the run's figures. Users
parse it: its field names stay."""

from __future__ import annotations

from typing import Any

from overlapcheck.harness.runner import RequestOutcome, RunResult


def outcome_to_json(outcome: RequestOutcome) -> dict[str, Any]:
    out: dict[str, Any] = {
        "uid": outcome.uid,
        "tokens": outcome.tokens,
        "finish_reason": outcome.finish_reason,
    }
    if outcome.reason:
        out["reason"] = outcome.reason
    return out


def run_to_json(result: RunResult) -> dict[str, Any]:
    c = result.config
    return {
        "backend": result.backend,
        "scenario": result.scenario.name,
        "loop": c.loop,
        "cache": c.cache,
        "page_size": c.page_size,
        "policy": c.policy,
        "faults": sorted(c.faults),
        "ok": result.ok,
        "requests": [outcome_to_json(o) for o in result.outcomes],
        "violations": [v.to_json() for v in result.violations],
        "notices": result.notices,
        "trace_hash": result.trace_hash,
        "stats": {
            "iterations": result.iterations,
            "simulated_seconds": result.simulated_seconds,
            "wall_seconds": result.wall_seconds,
            "operations": len(result.trace.ops),
            # a run of several ranks: their count (each rank's logs and traces stay in Python)
            **{k: v for k, v in result.extra.items() if k not in ("ranks", "rank_traces")},
            **({"ranks": len(result.extra["ranks"])} if "ranks" in result.extra else {}),
        },
    }
