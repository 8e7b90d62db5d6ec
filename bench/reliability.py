"""`overlapcheck bench --reliability`: no false alarms, and counterexamples that replay.

Two numbers a user who leaves a search running overnight relies on:

1. The fixed (shipped) scheduler, over N generated workloads with drawn timings spread over every
   worker, reports no violation: any one is a false alarm (or a real bug in the shipped code).
   With modes asked for (`--mode`), N examples in each preemption mode, one mode after the other,
   each with its examples per second; else the modes as the generator draws them. A violating
   example is saved as a counterexample file, so that it replays.
2. Every saved counterexample replays, each replay in a fresh process, with the trace hash it
   recorded and its invariant broken again. With no counterexamples given, one per named fault is
   searched for (seed 0) and saved to a temporary folder first.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from overlapcheck.bench import fixed_clean
from overlapcheck.bench.preemption_modes import PreemptionMode
from overlapcheck.core.errors import UserError
from overlapcheck.explore.parallel import available_cores, search_here
from overlapcheck.explore.search import SearchSpec, stream_seed
from overlapcheck.formats import counterexample
from overlapcheck.formats.jsonfile import read_json_file
from overlapcheck.reference.faults import FAULTS
from overlapcheck.replay.sim import replay_on_sim

EXAMPLES = 2000
REPLAYS = 100
# Examples per task at most: a worker that draws slow examples then holds up the rest by little.
CHUNK = 1000
DRAWN = "drawn"  # the preemption mode of each example as the generator draws it


@dataclass
class ModeRun:
    """The fixed scheduler over generated examples in one preemption mode (or as drawn)."""

    mode: str
    examples: int = 0
    preempted: int = 0  # examples in which it preempted at least once
    violations: list[str] = field(default_factory=list)
    saved: list[str] = field(default_factory=list)  # counterexample files of violating examples
    kinds: dict[str, int] = field(default_factory=dict)  # examples of each workload kind
    seconds: float = 0.0

    @property
    def examples_per_second(self) -> float:
        return self.examples / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "examples": self.examples,
            "preempted": self.preempted,
            "violations": len(self.violations),
            "violation_lines": self.violations,
            "saved": self.saved,
            "seconds": round(self.seconds, 3),
            "examples_per_second": round(self.examples_per_second, 2),
        }


@dataclass(frozen=True, slots=True)
class Replay:
    """One replay of a counterexample in a fresh process."""

    path: str
    recorded_hash: str
    trace_hash: str
    invariant: str
    reproduced: bool  # the recorded invariant broke again

    @property
    def identical(self) -> bool:
        return self.reproduced and self.trace_hash == self.recorded_hash


@dataclass
class Reliability:
    examples: int = 0
    workers: int = 1
    violations: list[str] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)  # examples of each workload kind
    search_seconds: float = 0.0
    modes: list[ModeRun] = field(default_factory=list)
    replays_asked: int = REPLAYS
    counterexamples: list[str] = field(default_factory=list)
    generated: bool = False  # the counterexamples were searched for here
    replays: list[Replay] = field(default_factory=list)
    replay_seconds: float = 0.0

    @property
    def mismatches(self) -> list[Replay]:
        return [r for r in self.replays if not r.identical]

    @property
    def ok(self) -> bool:
        replayed = bool(self.replays) or not self.replays_asked
        return not self.violations and not self.mismatches and replayed

    def to_json(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "workers": self.workers,
            "violations": len(self.violations),
            "violation_lines": self.violations,
            "kinds": dict(sorted(self.kinds.items())),
            "search_seconds": round(self.search_seconds, 3),
            "modes": [m.to_json() for m in self.modes],
            "counterexamples": self.counterexamples,
            "generated": self.generated,
            "replays": len(self.replays),
            "identical": sum(r.identical for r in self.replays),
            "mismatches": [asdict(r) for r in self.mismatches],
            "replay_seconds": round(self.replay_seconds, 3),
            "ok": self.ok,
        }


def _context() -> Any:
    # Fresh interpreters, never a fork of this one: a replay must not inherit any state.
    return mp.get_context("spawn")


def _clean_share(
    count: int, seed: int, speculative: bool, mode: PreemptionMode | None, out: str | None
) -> fixed_clean.CleanRun:
    return fixed_clean.run(count, seed, speculative, mode, None if out is None else Path(out))


def _warm(_: int) -> None:
    """A worker's imports, done before any mode is timed (and a pause, so that each worker of
    the pool gets one of these)."""
    import overlapcheck.bench.fixed_clean  # noqa: F401

    time.sleep(0.5)


def _replay_once(path: str) -> Replay:
    cex = counterexample.load(path)
    run = replay_on_sim(cex)
    return Replay(
        path,
        cex.trace_hash,
        run.trace_hash,
        cex.invariant,
        cex.reproduced(run) is not None,
    )


def _find(fault: str) -> counterexample.Counterexample | None:
    spec = SearchSpec(faults=frozenset([fault]), budget=60, max_examples=20_000, seed=0)
    outcome = search_here(spec)
    return outcome.found


def chunks(total: int, workers: int) -> list[int]:
    """`total` examples as tasks for `workers`: two a worker at least (so that one slow task
    holds up little), `CHUNK` examples a task at most."""
    return shares(total, max(2 * workers, math.ceil(total / CHUNK)))


def shares(total: int, parts: int) -> list[int]:
    """`total` split over `parts`, as even as can be, no empty share."""
    parts = max(1, min(parts, total))
    return [total // parts + (i < total % parts) for i in range(parts)]


def counterexample_files(folder: Path) -> list[Path]:
    """The counterexample files in `folder` (timelines and other JSON beside them skipped)."""
    if not folder.is_dir():
        raise UserError(f"--counterexamples {folder}: no such folder")
    found = []
    for path in sorted(folder.glob("*.json")):
        data = read_json_file(path, "file")
        if isinstance(data, dict) and data.get("format") == counterexample.FORMAT:
            found.append(path)
    if not found:
        raise UserError(f"--counterexamples {folder}: no counterexample files in it")
    return found


@contextmanager
def _counterexamples(folder: Path | None, workers: int) -> Iterator[tuple[list[Path], bool]]:
    """The given folder's counterexamples, or one per named fault, searched for and saved to a
    temporary folder (removed afterwards)."""
    if folder is not None:
        yield counterexample_files(folder), False
        return
    with tempfile.TemporaryDirectory(prefix="overlapcheck-reliability-") as tmp:
        with _context().Pool(workers) as pool:
            found = pool.map(_find, list(FAULTS))
        paths = [cex.save(tmp) for cex in found if cex is not None]
        yield paths, True


def run(
    examples: int = EXAMPLES,
    workers: int | None = None,
    replays: int = REPLAYS,
    folder: Path | None = None,
    speculative: bool = False,
    modes: list[PreemptionMode] | None = None,
    out: Path | None = None,
    report: Callable[[ModeRun], None] | None = None,
) -> Reliability:
    """`examples` in each of `modes` (none: as drawn), then `replays` replays (0: none); each
    mode's run goes to `report` as it ends, violating examples to files in `out`."""
    workers = workers or available_cores()
    result = Reliability(workers=workers, replays_asked=replays)
    with _context().Pool(workers) as pool:
        pool.map(_warm, range(workers), chunksize=1)
        each: list[PreemptionMode | None] = [*modes] if modes else [None]
        for mode in each:
            run = _mode_run(pool, examples, workers, speculative, mode, out)
            result.modes.append(run)
            result.examples += run.examples
            result.violations += run.violations
            result.search_seconds += run.seconds
            for kind, n in run.kinds.items():
                result.kinds[kind] = result.kinds.get(kind, 0) + n
            if report is not None:
                report(run)
    if replays:
        _replay(result, folder, replays)
    return result


def _mode_run(
    pool: Any,
    examples: int,
    workers: int,
    speculative: bool,
    mode: PreemptionMode | None,
    out: Path | None,
) -> ModeRun:
    started = time.perf_counter()
    where = None if out is None else str(out)
    tasks = [
        (n, stream_seed(0, i), speculative, mode, where)
        for i, n in enumerate(chunks(examples, workers))
    ]
    run = ModeRun(DRAWN if mode is None else mode.name)
    for part in pool.starmap(_clean_share, tasks, chunksize=1):
        run.examples += part.examples
        run.preempted += part.preempted
        run.violations += part.violations
        run.saved += part.saved
        for kind, n in part.kinds.items():
            run.kinds[kind] = run.kinds.get(kind, 0) + n
    run.seconds = time.perf_counter() - started
    return run


def _replay(result: Reliability, folder: Path | None, replays: int) -> None:
    with _counterexamples(folder, result.workers) as (paths, generated):
        result.counterexamples, result.generated = [str(p) for p in paths], generated
        started = time.perf_counter()
        # Round-robin over the files; every replay in a process of its own.
        jobs = [str(paths[i % len(paths)]) for i in range(replays)]
        with _context().Pool(result.workers, maxtasksperchild=1) as pool:
            result.replays = pool.map(_replay_once, jobs, chunksize=1)
        result.replay_seconds = time.perf_counter() - started
    if generated:  # the temporary files are gone: name what they held
        result.counterexamples = [Path(p).name for p in result.counterexamples]


def print_mode(run: ModeRun) -> None:
    """One mode's run, as it ends (a long run shows what it has so far)."""
    preempted = f" ({run.preempted} preempted)" if run.mode != "none" else ""
    print(
        f"  {run.mode}: {run.examples} examples{preempted} in {run.seconds:.1f} s, "
        f"{run.examples_per_second:.1f} examples/s: {len(run.violations)} violation(s)",
        flush=True,
    )
    for path in run.saved:
        print(f"    saved {path}", flush=True)


def print_report(result: Reliability) -> None:
    """The totals, the violations and the replays (each mode's line came as it ended)."""
    print(
        f"reliability: the fixed scheduler over {result.examples} generated examples on "
        f"{result.workers} worker(s) in {result.search_seconds:.1f} s: "
        f"{len(result.violations)} violation(s) (must be 0)"
    )
    for line in result.violations[:20]:
        print(f"  {line}")
    if result.kinds:
        print("  kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(result.kinds.items())))
    if not result.replays_asked:
        print("replays: none asked (--replays 0)")
    else:
        where = "searched for here, one per named fault" if result.generated else "given"
        identical = sum(r.identical for r in result.replays)
        print(
            f"replays: {len(result.counterexamples)} counterexample(s) ({where}), "
            f"{len(result.replays)} replays in fresh processes in {result.replay_seconds:.1f} s: "
            f"{identical} identical (same trace hash, same invariant), "
            f"{len(result.mismatches)} differ (must be 0)"
        )
    for r in result.mismatches:
        print(
            f"  {r.path}: trace hash {r.trace_hash} (recorded {r.recorded_hash}), "
            f"{r.invariant} {'reproduced' if r.reproduced else 'NOT reproduced'}"
        )
    print("reliability: ok" if result.ok else "reliability: FAILED")
