"""Fit the simulator's nominal profile to measured durations (least squares per operation kind)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from overlapcheck.backends.sim.timing import Profile

HOST_PHASES = ("schedule", "launch", "process")


@dataclass(frozen=True, slots=True)
class Sample:
    """One measured operation: its kind, duration and the sizes its cost depends on."""

    kind: str  # schedule | launch | process | h2d | d2h | forward
    seconds: float
    work: int = 0  # host phases: requests touched
    cells: int = 0  # h2d: cells copied
    tokens: int = 0  # forward: new tokens
    context: int = 0  # forward: context tokens attended over


def _fit(rows: Sequence[Sequence[float]], y: Sequence[float]) -> list[float]:
    """Non-negative least squares (a negative cost is noise, not physics): with at most three
    terms, solving every subset of them and keeping the best non-negative fit is exact and cheap."""
    a = np.asarray(rows, dtype=float)
    b = np.asarray(y, dtype=float)
    n = a.shape[1]
    best: tuple[float, list[float]] = (float("inf"), [0.0] * n)
    for mask in range(1, 1 << n):
        cols = [i for i in range(n) if mask >> i & 1]
        coef, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
        if (coef < 0).any():
            continue
        full = [0.0] * n
        for i, c in zip(cols, coef, strict=True):
            full[i] = float(c)
        residual = float(np.sum((a @ np.asarray(full) - b) ** 2))
        if residual < best[0]:
            best = (residual, full)
    return best[1]


def fit_profile(samples: Iterable[Sample], base: Profile | None = None) -> Profile:
    """A profile whose costs best explain `samples`; kinds without samples keep `base`'s values."""
    by_kind: dict[str, list[Sample]] = {}
    for s in samples:
        by_kind.setdefault(s.kind, []).append(s)
    changes: dict[str, float] = {}
    for phase in HOST_PHASES:
        got = by_kind.get(phase, [])
        if got:
            changes[phase], changes[f"{phase}_per_req"] = _fit(
                [[1, s.work] for s in got], [s.seconds for s in got]
            )
    if by_kind.get("h2d"):
        got = by_kind["h2d"]
        changes["h2d"], changes["h2d_per_cell"] = _fit(
            [[1, s.cells] for s in got], [s.seconds for s in got]
        )
    if by_kind.get("d2h"):
        changes["d2h"] = float(np.median([s.seconds for s in by_kind["d2h"]]))
    if by_kind.get("forward"):
        got = by_kind["forward"]
        a, b, c = _fit([[1, s.tokens, s.context] for s in got], [s.seconds for s in got])
        changes.update(forward=a, forward_per_token=b, forward_per_context=c)
    known = {f.name for f in fields(Profile)}
    assert set(changes) <= known
    return replace(base or Profile(), **changes)
