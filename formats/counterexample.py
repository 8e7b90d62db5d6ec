"""Counterexample files: everything needed to replay a violation exactly."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from overlapcheck import __version__
from overlapcheck.backends.sim.timing import Profile, ProfileError, ReplayDelay, Timing
from overlapcheck.core.errors import UserError
from overlapcheck.core.owners import owner
from overlapcheck.core.scenario import Scenario
from overlapcheck.formats.jsonfile import check_header, read_json_file
from overlapcheck.formats.trace_file import trace_to_json
from overlapcheck.harness.fingerprint import CodeFingerprint
from overlapcheck.harness.revision import checker_digest, git_revision
from overlapcheck.harness.runner import RunResult
from overlapcheck.harness.scheduler_spec import SchedulerSpec, parse_spec
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.registry import INVARIANTS, RUN_ENDING, check_specs, make_invariant
from overlapcheck.reference.faults import UnknownFaultError, parse_faults
from overlapcheck.scenarios.loader import ScenarioError, scenario_from_dict

FORMAT = "overlapcheck-counterexample"
VERSION = 1


# The default invariants of files saved before they recorded their list (this format's first
# release): an older file replays with exactly these.
LEGACY_INVARIANTS = (
    "no-race",
    "no-post-eos",
    "exact-length",
    "oracle",
    "slot-not-in-flight",
    "pages-conserved",
    "abort-silent",
    "liveness",
)


class Counterexample:
    """A counterexample: everything needed to replay a violation exactly. The one type on
    both sides of the file: a search builds it from a run (`of_run`), it crosses process pipes
    as it is, `save`/`write` put it on disk, and `load` reads it back (files of every earlier
    release included), validated the same way each time.

        cex = Counterexample.of_run(result, profile, draws, scheduler=spec)
        path = cex.save("counterexamples")   # counterexamples/no-race-637ee2ed.json
        assert load(path).trace_hash == cex.trace_hash
    """

    @classmethod
    def of_run(
        cls,
        result: RunResult,
        profile: Profile,
        draws: dict[int, float],
        skip: frozenset[str] = frozenset(),
        extra_checks: tuple[str, ...] = (),
        scheduler: SchedulerSpec | None = None,
        git: str = "unknown",
        search: dict[str, Any] | None = None,
    ) -> Counterexample:
        """The first violation of `result` (a run that built its scheduler in this process:
        its code is fingerprinted now); `git`: the revision of the code that found it;
        `search`: what `explore --resume` needs to go on shrinking it."""
        violation = result.violations[0]
        spec = scheduler or SchedulerSpec()
        data: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "overlapcheck": __version__,
            "git": git,
            # overlapcheck's own code: a replay whose trace differs says whether it changed.
            "checker": checker_digest(),
            # Which scheduler ran, and its code file by file: a replay says which files changed.
            "scheduler": spec.to_json(result.scheduler),
            "scenario": result.scenario.to_json(),
            "faults": sorted(result.config.faults),
            "skip": sorted(skip),  # invariants the search did not check
            "checks": list(extra_checks),  # opt-in ones it did (bounded-wait=K)
            # Exactly what was checked: a replay checks the same, whatever invariants come
            # later (a new one firing first would hide the recorded violation and change the
            # trace).
            "invariants": check_specs(skip, extra_checks),
            "timing": {
                "profile": profile.as_dict(),
                "draws": {str(k): v for k, v in sorted(draws.items())},
            },
            "invariant": violation.invariant,
            "violation": violation.to_json(),
            "trace_hash": result.trace_hash,
            # The watchdog's timeout (wall-clock seconds a step may take; null: off): a no-hang
            # found with a short one must replay with it.
            "hang_timeout": result.hang_timeout,
            "size": {"requests": len(result.scenario.requests), "iterations": result.iterations},
            # The trace itself, so that tools can read what happened without replaying.
            "trace": trace_to_json(result.trace),
        }
        if search is not None:
            data["search"] = search
        return cls(data, f"{violation.invariant}-{result.trace_hash[:8]}")

    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data = data
        self.where = where
        try:
            self.invariant: str = _text(data["invariant"], "invariant")
            self.trace_hash: str = _text(data["trace_hash"], "trace_hash")
            faults = parse_faults(_list(data.get("faults", []), "faults"))
            base = scenario_from_dict(data["scenario"], where="scenario")
            self.scenario: Scenario = base.with_config(faults=faults)
            timing = _object(data.get("timing", {}), "timing")
            self.profile = Profile.from_dict(_object(timing.get("profile", {}), "timing.profile"))
            self.draws = _draws(_object(timing.get("draws", {}), "timing.draws"))
            self.hang_timeout = _timeout(data.get("hang_timeout", DEFAULT_TIMEOUT))
            self.skip = frozenset(_text(i, "skip") for i in _list(data.get("skip", []), "skip"))
            unknown = sorted(self.skip - set(INVARIANTS) - set(RUN_ENDING))
            if unknown:
                raise ValueError(f"skip: unknown invariant {', '.join(unknown)}")
            self.extra_checks = tuple(
                _text(c, "checks") for c in _list(data.get("checks", []), "checks")
            )
            # Exactly the invariants the run that found it checked (the "checks" key holds only
            # the opt-in ones among them, `extra_checks`).
            self.invariants: list[str]
            recorded_checks = data.get("invariants")
            if recorded_checks is None:
                self.invariants = check_specs(self.skip, self.extra_checks, LEGACY_INVARIANTS)
            else:
                self.invariants = [
                    _text(c, "invariants") for c in _list(recorded_checks, "invariants")
                ]
            for spec in self.invariants:
                try:
                    make_invariant(spec)  # validates: ValueError names the problem
                except ValueError as err:
                    raise ValueError(f"invariants: {err}") from None
            recorded = _object(data.get("scheduler") or {}, "scheduler")
            self.scheduler: SchedulerSpec = parse_spec(
                _text(recorded.get("spec", "reference"), "scheduler.spec")
            )
            source_hash = recorded.get("source_hash")
            self.scheduler_hash: str | None = (
                None if source_hash is None else _text(source_hash, "scheduler.source_hash")
            )
            # Every file of the scheduler's code (files saved before it held only the hash).
            code = recorded.get("code")
            self.code: CodeFingerprint | None = (
                None if code is None else CodeFingerprint.from_json(code)
            )
            self.git = _text(data.get("git", "unknown"), "git")
            checker = data.get("checker")
            self.checker: str | None = None if checker is None else _text(checker, "checker")
        except ProfileError as err:
            raise UserError(f"{where}: timing.profile: {err}") from None
        except (UnknownFaultError, ScenarioError, UserError, ValueError, TypeError) as err:
            raise UserError(f"{where}: {err}") from None

    def timing(self) -> Timing:
        return Timing(self.profile, ReplayDelay(self.draws))

    @property
    def requests(self) -> int:
        """Its size: requests in the workload (the scenario's, for files that do not say)."""
        return int(self.data.get("size", {}).get("requests", len(self.scenario.requests)))

    @property
    def iterations(self) -> int:
        """Its size: scheduler iterations of the recorded run (0: the file does not say)."""
        value = self.data.get("size", {}).get("iterations")
        return value if isinstance(value, int) else 0

    @property
    def size(self) -> dict[str, Any]:
        return {"requests": self.requests, "iterations": self.iterations}

    @property
    def violation(self) -> dict[str, Any] | None:
        """The recorded violation as the file holds it (`Violation.to_json()`)."""
        value = self.data.get("violation")
        return value if isinstance(value, dict) else None

    def file_name(self, unshrunk: bool = False) -> str:
        """`<invariant>-<hash>.json`, or `unshrunk-<invariant>-<hash>.json` for a failure
        saved before shrinking."""
        return f"{UNSHRUNK if unshrunk else ''}{self.invariant}-{self.trace_hash[:8]}.json"

    def save(self, out_dir: str | Path, unshrunk: bool = False) -> Path:
        """Write it as `file_name()` in `out_dir` (made if missing)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        path = out / self.file_name(unshrunk)
        self.write(path)
        return path

    def write(self, path: Path) -> None:
        """The one writer of counterexample files: written whole beside `path`, then renamed
        over it, so a reader (or a kill mid-write) sees the old file or the new one."""
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        os.replace(tmp, path)

    def code_changes(self, now: CodeFingerprint | None = None) -> list[str] | None:
        """The scheduler's files that changed since the file was saved, relative to their
        roots (`python/minisgl/scheduler/scheduler.py`); `now`: the code after a replay built
        the scheduler (None: the recorded files only, as on disk now). An old file, which
        recorded one hash of the defining file, gives that file's name or []; a file that
        recorded nothing gives None (a change cannot be told)."""
        if self.code is not None:
            return self.code.changed_files(now)
        if self.scheduler_hash is None:
            return None
        if self.scheduler.source_hash() == self.scheduler_hash:
            return []
        source = self.scheduler.source_path()
        if source is not None and owner(source.resolve()) == "checker":
            return []  # an adapter of overlapcheck's: a change of ours (`checker_change`)
        return [source.name if source is not None else "reference/"]

    def checker_change(self) -> str | None:
        """One phrase when overlapcheck's own code differs from the one that wrote the file
        (None: the same, or it cannot be told: a file without a digest, written outside a
        checkout or replayed outside one)."""
        now_git = git_revision()
        revisions = (
            f" (git {self.git[:12]} -> {now_git[:12]})"
            if "unknown" not in (self.git, now_git) and self.git != now_git
            else ""
        )
        if self.checker is not None:
            if self.checker == checker_digest():
                return None
        elif not revisions:
            return None
        return f"overlapcheck's own code changed since the file was written{revisions}"

    def scheduler_change(self, scheduler: SchedulerSpec | None = None) -> str | None:
        """One line when the recorded scheduler's files differ from those on disk now (None
        when they are the same, or when `scheduler` overrides the recorded one)."""
        if scheduler is not None and scheduler != self.scheduler:
            return None
        changed = self.code_changes()
        if not changed:
            return None
        return (
            f"note: the scheduler's code changed since this counterexample was saved "
            f"({', '.join(changed)}); replaying the code as it is now"
        )

    def with_scheduler(self, scheduler: SchedulerSpec | None) -> Counterexample:
        """The same counterexample checking another scheduler (None: unchanged); it travels as
        data (to a Ray task) with the override in it."""
        if scheduler is None or scheduler == self.scheduler:
            return self
        return Counterexample({**self.data, "scheduler": {"spec": scheduler.text}}, self.where)

    def reproduced(self, result: RunResult) -> Violation | None:
        return next((v for v in result.violations if v.invariant == self.invariant), None)

    def without_faults(self) -> Counterexample:
        """The same workload, timing and checks with the injected faults off: the fixed code."""
        return Counterexample({**self.data, "faults": []}, f"{self.where} (fault off)")


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{field}: expected a string, got {value!r}")
    return value


def _list(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{field}: expected a list, got {value!r}")
    return value


def _object(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected an object, got {value!r}")
    return value


# Files that do not say ran with a 5 s watchdog on the simulator (harness/runner.py).
DEFAULT_TIMEOUT = 5.0


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0:
        raise ValueError(f"hang_timeout: expected a finite number of seconds > 0, got {value!r}")
    return float(value)


def _draws(raw: dict[str, Any]) -> dict[int, float]:
    """Recorded delays, site -> seconds: a bad one would fail deep in the simulator instead."""
    draws: dict[int, float] = {}
    for key, value in raw.items():
        if not key.isdigit():
            raise ValueError(f"timing.draws: site {key!r} is not an integer >= 0")
        finite = isinstance(value, int | float) and not isinstance(value, bool)
        if not finite or not math.isfinite(value) or value < 0:
            raise ValueError(f"timing.draws[{key}]: expected a finite delay >= 0, got {value!r}")
        draws[int(key)] = float(value)
    return draws


UNSHRUNK = "unshrunk-"


def save(
    result: RunResult,
    profile: Profile,
    draws: dict[int, float],
    out_dir: str | Path,
    skip: frozenset[str] = frozenset(),
    extra_checks: tuple[str, ...] = (),
    scheduler: SchedulerSpec | None = None,
    git: str = "unknown",
) -> Path:
    """`Counterexample.of_run(...).save(out_dir)`: a run's first violation, on disk."""
    cex = Counterexample.of_run(result, profile, draws, skip, extra_checks, scheduler, git)
    return cex.save(out_dir)


def load(path: str | Path) -> Counterexample:
    p = Path(path)
    data = read_json_file(p, "counterexample")
    check_header(data, FORMAT, VERSION, "counterexample", str(p))
    missing = [k for k in ("scenario", "invariant", "trace_hash") if k not in data]
    if missing:
        raise UserError(f"{p}: counterexample lacks {', '.join(missing)}")
    return Counterexample(data, str(p))
