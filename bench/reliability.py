"""`overlapcheck bench --reliability`: no false alarms, and counterexamples that replay.

Two numbers a user who leaves a search running overnight relies on:

1. The fixed (shipped) scheduler, over N generated workloads with drawn timings spread over every
   worker, reports no violation: any one is a false alarm (or a real bug in the shipped code).
2. Every saved counterexample replays, each replay in a fresh process, with the trace hash it
   recorded and its invariant broken again. With no counterexamples given, one per named fault is
   searched for (seed 0) and saved to a temporary folder first.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from overlapcheck.bench import fixed_clean
from overlapcheck.core.errors import UserError
from overlapcheck.explore.parallel import available_cores, search_here
from overlapcheck.explore.search import SearchSpec, stream_seed
from overlapcheck.formats import counterexample
from overlapcheck.formats.jsonfile import read_json_file
from overlapcheck.orchestrate.sim_replay import replay_on_sim
from overlapcheck.reference.faults import FAULTS

EXAMPLES = 2000
REPLAYS = 100


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
    counterexamples: list[str] = field(default_factory=list)
    generated: bool = False  # the counterexamples were searched for here
    replays: list[Replay] = field(default_factory=list)
    replay_seconds: float = 0.0

    @property
    def mismatches(self) -> list[Replay]:
        return [r for r in self.replays if not r.identical]

    @property
    def ok(self) -> bool:
        return not self.violations and not self.mismatches and bool(self.replays)

    def to_json(self) -> dict[str, Any]:
        return {
            "examples": self.examples,
            "workers": self.workers,
            "violations": len(self.violations),
            "violation_lines": self.violations,
            "kinds": dict(sorted(self.kinds.items())),
            "search_seconds": round(self.search_seconds, 3),
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


def _clean_share(count: int, seed: int, speculative: bool) -> tuple[int, list[str], dict[str, int]]:
    run = fixed_clean.run(count, seed, speculative)
    return run.examples, run.violations, dict(run.kinds)


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


def _find(fault: str) -> dict[str, Any] | None:
    spec = SearchSpec(faults=frozenset([fault]), budget=60, max_examples=20_000, seed=0)
    outcome = search_here(spec)
    return outcome.found


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
        paths = [counterexample.save_data(d, tmp) for d in found if d is not None]
        yield paths, True


def run(
    examples: int = EXAMPLES,
    workers: int | None = None,
    replays: int = REPLAYS,
    folder: Path | None = None,
    speculative: bool = False,
) -> Reliability:
    workers = workers or available_cores()
    out = Reliability(workers=workers)
    started = time.perf_counter()
    parts = shares(examples, workers)
    with _context().Pool(len(parts)) as pool:
        results = pool.starmap(
            _clean_share, [(n, stream_seed(0, i), speculative) for i, n in enumerate(parts)]
        )
    for count, violations, kinds in results:
        out.examples += count
        out.violations += violations
        for kind, n in kinds.items():
            out.kinds[kind] = out.kinds.get(kind, 0) + n
    out.search_seconds = time.perf_counter() - started
    with _counterexamples(folder, workers) as (paths, generated):
        out.counterexamples, out.generated = [str(p) for p in paths], generated
        started = time.perf_counter()
        # Round-robin over the files; every replay in a process of its own.
        jobs = [str(paths[i % len(paths)]) for i in range(replays)]
        with _context().Pool(workers, maxtasksperchild=1) as pool:
            out.replays = pool.map(_replay_once, jobs, chunksize=1)
        out.replay_seconds = time.perf_counter() - started
    if generated:  # the temporary files are gone: name what they held
        out.counterexamples = [Path(p).name for p in out.counterexamples]
    return out


def print_report(result: Reliability) -> None:
    print(
        f"reliability: the fixed scheduler over {result.examples} generated examples on "
        f"{result.workers} worker(s) in {result.search_seconds:.1f} s: "
        f"{len(result.violations)} violation(s) (must be 0)"
    )
    for line in result.violations[:20]:
        print(f"  {line}")
    if result.kinds:
        print("  kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(result.kinds.items())))
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
