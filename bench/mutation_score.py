"""The mutation score: each one-spot mutant of the reference scheduler (`bench/mutants.py`),
searched like a user's plugged-in scheduler, one core, a fixed budget per mutant.

A mutant is built as a copy of `reference/` under a fresh package name in a temporary directory,
with its patch applied, and exposed through a `PATH.py:FACTORY` scheduler spec: the search runs
it exactly as it runs `explore --scheduler`. Per mutant: found or not, time to the first failure,
the invariant, the shrunk size (requests, iterations) and the shrink time.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from overlapcheck.bench.mutants import BY_ID, MUTANTS, Mutant
from overlapcheck.core.errors import UserError
from overlapcheck.explore.search import SearchSpec, search
from overlapcheck.harness.heap import keep_freed_heap
from overlapcheck.harness.scheduler_spec import SchedulerSpec

REFERENCE = Path(__file__).resolve().parent.parent / "reference"
PACKAGE = "overlapcheck.reference"
BUDGET = 60.0  # seconds of search per mutant (one core)


class PatchError(UserError, ValueError):
    """A mutant's `old` text does not occur exactly once in its file."""


def patched_source(mutant: Mutant, root: Path = REFERENCE) -> str:
    """The mutated text of the mutant's file. Raises PatchError unless `old` occurs once."""
    text = (root / mutant.file).read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise PatchError(
            f"mutant {mutant.id}: its patch matches {count} times in reference/{mutant.file}"
        )
    return text.replace(mutant.old, mutant.new)


def materialize(mutant: Mutant, into: Path, root: Path = REFERENCE) -> SchedulerSpec:
    """Write the mutated reference package under `into`; return the spec of its scheduler.

    The package gets a name unique to the patched text, so that several mutants (and the same
    mutant twice) can be loaded in one process side by side.
    """
    mutated = patched_source(mutant, root)
    digest = hashlib.blake2b(mutated.encode(), digest_size=5).hexdigest()
    name = f"overlapcheck_mutant_{mutant.id.replace('-', '_')}_{digest}"
    pkg = into / name
    for src in sorted(root.rglob("*.py")):
        rel = src.relative_to(root)
        text = mutated if rel.as_posix() == mutant.file else src.read_text()
        dst = pkg / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_text(text.replace(PACKAGE, name))
    plugin = into / f"{name}_plugin.py"
    plugin.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(into)!r})\n"
        f"from {name}.scheduler import Scheduler  # noqa: E402\n"
    )
    return SchedulerSpec(f"{plugin}:Scheduler")


@dataclass
class Score:
    mutant: Mutant
    found: bool
    invariant: str | None = None
    first_failure: float | None = None  # seconds, before shrinking
    examples: int = 0
    shrink: float | None = None  # seconds from the first failure to the shrunk counterexample
    requests: int | None = None
    iterations: int | None = None
    line: str = ""  # the violation, shrunk
    cut: str | None = None  # shrinking was cut short (the budget or Ctrl-C): `explore --resume`
    error: str = ""  # the search itself failed (a checker bug the mutant tripped)

    @property
    def ok(self) -> bool:
        """Found when it should be; silent when it is equivalent."""
        return self.found != self.mutant.equivalent


def score(
    mutant: Mutant, budget: float = BUDGET, seed: int = 0, max_examples: int = 50_000
) -> Score:
    """Search one mutant from an empty example database."""
    with tempfile.TemporaryDirectory(prefix="overlapcheck-mutant-") as tmp:
        spec = SearchSpec(
            scheduler=materialize(mutant, Path(tmp)),
            budget=budget,
            max_examples=max_examples,
            seed=seed,
        )
        try:
            result = search(spec)
        except Exception as err:  # a checker bug: reported in the table, the bench goes on
            return Score(mutant, False, error=f"{type(err).__name__}: {err}".splitlines()[0])
    stats = result.stats
    if result.found is None:
        return Score(mutant, False, examples=stats.examples)
    run = result.found.result
    first = stats.first_failure or 0.0
    return Score(
        mutant,
        True,
        invariant=run.violations[0].invariant,
        first_failure=first,
        examples=stats.examples_to_failure or 0,
        shrink=stats.seconds - first,
        requests=len(run.scenario.requests),
        iterations=run.iterations,
        line=run.violations[0].line(),
        cut=result.cut,
    )


def _score_alone(job: tuple[Mutant, float, int]) -> Score:
    keep_freed_heap()  # a process of ours, as the command line's
    return score(*job)


def scores_in_fresh_processes(
    jobs: list[tuple[Mutant, int]], budget: float, workers: int
) -> Iterator[tuple[Mutant, int, Score]]:
    """Each (mutant, seed) searched in a process of its own, `workers` at a time (one core
    each), yielded as each finishes: a mutant's package, its caches and whatever state a broken
    scheduler leaves behind stay out of the next one's search, and the table of every mutant at
    three seeds takes a fraction of the time on a machine with cores to spare."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, max_tasks_per_child=1) as pool:
        running = {pool.submit(_score_alone, (m, budget, seed)): (m, seed) for m, seed in jobs}
        for done in as_completed(running):
            mutant, seed = running[done]
            yield mutant, seed, done.result()


def _row(s: Score, seed: int) -> str:
    mutant = s.mutant
    kind = "equiv" if mutant.equivalent else "bug"
    head = f"{mutant.id:<28}{kind:<7}{seed:>5}"
    if s.found:
        return (
            f"{head}{'yes':>6}{s.first_failure or 0:>9.2f}{s.examples:>9}"
            f"{s.shrink or 0:>9.2f}{s.requests:>9}{s.iterations:>11}  {s.invariant}"
            + (f" (shrink cut short: {s.cut})" if s.cut else "")
            + ("" if s.ok else "  <- an equivalent mutant must stay silent")
        )
    if s.error:
        return f"{head}{'error':>6}  checker failed: {s.error}"
    return f"{head}{'no':>6}{'':>9}{s.examples:>9}" + (
        "" if s.ok else f"  <- missed; needs {mutant.needs or '?'}"
    )


def _cell(s: Score) -> str:
    """One seed's result in the summary table: examples to the failure / shrink seconds."""
    if s.error:
        return "error"
    if not s.found:
        return "silent" if s.mutant.equivalent else "MISSED"
    cell = f"{s.examples} / {s.shrink or 0:.1f}"
    if s.cut:
        cell += " cut"
    return cell + ("" if s.ok else " FALSE")


def summary(scores: dict[tuple[str, int], Score], seeds: list[int]) -> list[str]:
    """The table by mutant, a column per seed (examples to the first failure / shrink seconds),
    then one score line per seed and one over all of them."""
    ids = list(dict.fromkeys(m for m, _ in scores))
    lines = [f"{'mutant':<28}{'kind':<7}" + "".join(f"{f'seed {seed}':>18}" for seed in seeds)]
    for mid in ids:
        first = scores[(mid, seeds[0])]
        kind = "equiv" if first.mutant.equivalent else "bug"
        lines.append(
            f"{mid:<28}{kind:<7}" + "".join(f"{_cell(scores[(mid, seed)]):>18}" for seed in seeds)
        )
    for label, chosen in [*((f"seed {seed}", [seed]) for seed in seeds), ("all seeds", seeds)]:
        group = [s for (_, seed), s in scores.items() if seed in chosen]
        lines.append(f"{label}: {score_line(group)}")
    return lines


def score_line(scores: list[Score]) -> str:
    bugs = [s for s in scores if not s.mutant.equivalent]
    equivalent = [s for s in scores if s.mutant.equivalent]
    shrinks = [s.shrink for s in bugs if s.shrink is not None]
    return (
        f"{sum(s.found for s in bugs)}/{len(bugs)} mutants found, "
        f"{sum(not s.found for s in equivalent)}/{len(equivalent)} equivalent ones silent; "
        f"median shrink {statistics.median(shrinks) if shrinks else 0:.2f} s, "
        f"longest {max(shrinks) if shrinks else 0:.2f} s, "
        f"{sum(s.cut is not None for s in bugs)} cut short"
    )


def main(
    ids: Iterable[str] | None = None,
    budget: float = BUDGET,
    seeds: Iterable[int] = (0,),
    workers: int = 1,
) -> list[tuple[int, Score]]:
    """Score each chosen mutant at each seed, `workers` searches at once; print a row per
    search as it finishes, then the table by mutant and the score per seed. Returns
    (seed, score) pairs in table order."""
    ids = list(ids or ())
    seeds = list(dict.fromkeys(seeds)) or [0]
    unknown = [i for i in ids if i not in BY_ID]
    if unknown:
        raise UserError(f"unknown mutant {', '.join(unknown)} (known: {', '.join(BY_ID)})")
    chosen = [BY_ID[i] for i in ids] if ids else list(MUTANTS)
    # Every patch must still apply before any search starts: a refactor of the reference
    # scheduler fails the bench loudly instead of scoring mutants that test nothing.
    stale = []
    for m in chosen:
        try:
            patched_source(m)
        except PatchError as err:
            stale.append(str(err))
    if stale:
        raise UserError("; ".join(stale))
    # Seed-major order: with fewer workers than jobs, every seed's table fills at the same pace.
    jobs = [(m, seed) for seed in seeds for m in chosen]
    print(
        f"mutation score: {len(chosen)} one-spot mutants of the reference scheduler at seed(s) "
        f"{', '.join(map(str, seeds))}, explore from an empty database, all invariants on, "
        f"{budget:.0f} s each on one core, each in a fresh process, {workers} at a time"
    )
    print(
        f"{'mutant':<28}{'kind':<7}{'seed':>5}{'found':>6}{'first s':>9}{'examples':>9}"
        f"{'shrink s':>9}{'requests':>9}{'iterations':>11}  invariant"
    )
    scores: dict[tuple[str, int], Score] = {}
    started = time.perf_counter()
    for mutant, seed, s in scores_in_fresh_processes(jobs, budget, workers):
        scores[(mutant.id, seed)] = s
        print(_row(s, seed), flush=True)
    print()
    print("by mutant: examples to the first failure / shrink seconds, per seed")
    for line in summary(scores, seeds):
        print(line)
    print(f"{time.perf_counter() - started:.0f} s in all")
    return [(seed, scores[(m.id, seed)]) for seed in seeds for m in chosen]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ids", nargs="*", help="mutant ids (default: all)")
    parser.add_argument("--budget", type=float, default=BUDGET)
    parser.add_argument(
        "--seed", type=int, action="append", help="the search's seed (repeatable; default 0)"
    )
    parser.add_argument("--workers", type=int, default=1, help="searches at once")
    args = parser.parse_args()
    main(args.ids, args.budget, args.seed or [0], args.workers)
