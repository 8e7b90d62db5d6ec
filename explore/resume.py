"""Resume a search from its saved counterexample: the same search, its saved example replayed
first, so that a shrink cut short (by the budget, Ctrl-C or a killed worker) is finished. A
generated workload's file holds the example that first failed: the workload passes
(`explore/reduce.py`) run on it again, deterministically, with the new budget. A named or a
user's scenario's file holds the smallest example Hypothesis had reached: it is replayed as it
is (Hypothesis does not shrink again an example its database replays exactly).

A counterexample file written by `explore` records the search that found it (`search`: the
scenario argument, the policy, and the failing example's choices as Hypothesis saves them); with
the faults, checks, scheduler and timing profile it records anyway, that rebuilds the search.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import replace
from pathlib import Path
from typing import Any

from overlapcheck.core.config import POLICIES
from overlapcheck.core.errors import UserError
from overlapcheck.core.scenario import Scenario
from overlapcheck.explore.search import SearchSpec
from overlapcheck.formats import counterexample
from overlapcheck.scenarios.loader import ScenarioError, scenario_from_dict
from overlapcheck.scenarios.named import NAMED


def resumed_spec(path: str | Path, spec: SearchSpec) -> SearchSpec:
    """`spec` (budget, seed, database, workers' share) searching what the file at `path` was
    found by, with its example to replay first. Raises UserError on a file that cannot say."""
    cex = counterexample.load(path)
    search: Any = cex.data.get("search")
    if not isinstance(search, dict) or not isinstance(search.get("choices"), str):
        raise UserError(
            f"{path}: records no search to resume (saved by an older overlapcheck, or by a "
            "replay): rerun the search with the same --db, which replays its saved failures first"
        )
    try:
        choices = base64.b64decode(search["choices"], validate=True)
    except (binascii.Error, ValueError):
        raise UserError(f"{path}: search.choices is not base64") from None
    raw = search.get("scenario", "all")
    scenario: str | Scenario
    if isinstance(raw, dict):
        try:
            scenario = scenario_from_dict(raw, where=f"{path}: search.scenario")
        except ScenarioError as err:
            raise UserError(str(err)) from None
    elif raw == "all" or raw in NAMED:
        scenario = raw
    else:
        raise UserError(f"{path}: search.scenario: unknown scenario {raw!r}")
    recorded = search.get("policy")
    policy = next((p for p in POLICIES if p == recorded), None)
    if recorded is not None and policy is None:
        raise UserError(
            f"{path}: search.policy: expected one of {', '.join(POLICIES)}, got {recorded!r}"
        )
    return replace(
        spec,
        scenario=scenario,
        faults=cex.scenario.config.faults,
        profile=cex.profile,
        skip=cex.skip,
        policy=policy,
        extra_checks=cex.extra_checks,
        scheduler=cex.scheduler,
        ranks=cex.scenario.config.num_ranks if cex.scenario.config.num_ranks > 1 else None,
        resume=choices,
    )
