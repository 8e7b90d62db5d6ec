"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from overlapcheck.backends.sim.timing import Profile, ProfileError, SeededDelay, Timing
from overlapcheck.commands.paths import output_file
from overlapcheck.core.config import CACHE_KINDS, LOOP_KINDS, MAX_RANKS, POLICIES, ConfigError
from overlapcheck.core.errors import UserError
from overlapcheck.core.scenario import Scenario
from overlapcheck.formats.profile_file import read_profile
from overlapcheck.harness.scheduler_spec import REFERENCE, SchedulerSpec
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.registry import INVARIANTS, RUN_ENDING, make_invariant
from overlapcheck.reference.faults import FAULTS, UnknownFaultError, parse_faults
from overlapcheck.scenarios.loader import ScenarioError, load_scenario_file
from overlapcheck.scenarios.named import NAMED, named_scenario


def _int_at_least(minimum: int, name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}")
        return value

    return parse


positive_int = _int_at_least(1, "a positive integer")
nonneg_int = _int_at_least(0, "an integer >= 0")


def _finite_float(allow_zero: bool, name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        # float() takes "nan" and "inf": a budget of nan compares false with everything and
        # would silently run nothing, so both are refused here, with the negatives.
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}")
        return value

    return parse


# argparse types for float options (seconds, probabilities, scales): nan, inf and negatives are
# refused when the arguments are parsed, as one line and exit 2.
finite_positive_float = _finite_float(False, "a finite number > 0")
finite_nonneg_float = _finite_float(True, "a finite number >= 0")


# The real engine's model presets (backends/gpu/weights.PRESETS, which needs torch to import; a
# test keeps the two equal) and the one it uses when neither --model nor --preset is given.
PRESET_NAMES = ("tiny", "qwen3-0.6b")
DEFAULT_PRESET = "tiny"


def add_model_options(parser: argparse.ArgumentParser, prefix: str = "(cpu/cuda) ") -> None:
    parser.add_argument(
        "--model",
        metavar="DIR",
        help=f"{prefix}a Hugging Face checkpoint directory (default: none, use --preset)",
    )
    parser.add_argument(
        "--preset",
        choices=PRESET_NAMES,
        help=f"{prefix}a model preset with deterministic random weights, when no --model is "
        f"given (default: {DEFAULT_PRESET})",
    )


def add_config_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loop", choices=LOOP_KINDS, help="scheduler loop (default: the scenario's)"
    )
    parser.add_argument(
        "--cache", choices=CACHE_KINDS, help="prefix cache (default: the scenario's)"
    )
    parser.add_argument(
        "--page-size",
        type=positive_int,
        metavar="N",
        help="tokens per KV page (default: the scenario's)",
    )
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        help="queue policy before each prefill batch (default: the scenario's)",
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        dest="max_extend_tokens",
        metavar="N",
        help="prefill token budget per batch (max_extend_tokens; default: the scenario's)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME",
        help="re-enable a named known bug (repeatable; one of " + ", ".join(FAULTS) + "; "
        "see `overlapcheck faults`; default: none)",
    )
    add_ranks_option(parser, "the scenario's, else 1")


def add_ranks_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--ranks",
        type=ranks_count,
        dest="num_ranks",
        metavar="N",
        help="run N ranks of the scheduler side by side, fed the same messages, and check that "
        f"they launch and decide alike (rank-consistent; docs/ranks.md) (default: {default})",
    )


def ranks_count(text: str) -> int:
    value = positive_int(text)
    if value > MAX_RANKS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_RANKS} ranks, got {text!r}")
    return value


def add_timing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seed",
        type=nonneg_int,
        default=None,
        metavar="N",
        help="draw random operation delays from this seed (default: nominal timing)",
    )
    parser.add_argument(
        "--timing",
        metavar="FILE",
        help="a timing profile (JSON), e.g. from calibrate (default: the built-in nominal one)",
    )


def resolve_scenario(text: str) -> Scenario:
    if text in NAMED:
        return named_scenario(text)
    if Path(text).is_dir():
        raise UserError(f"{text}: is a folder, not a scenario file")
    if Path(text).suffix in (".json", ".toml") or Path(text).exists():
        try:
            return load_scenario_file(text)
        except ScenarioError as err:
            raise UserError(str(err)) from None
    raise UserError(
        f"unknown scenario {text!r}: name one of {', '.join(NAMED)} or a .json/.toml file"
    )


def apply_overrides(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    changes: dict[str, Any] = {}
    for name in ("loop", "cache", "page_size", "max_extend_tokens", "policy", "num_ranks"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    try:
        # --fault adds to the faults a scenario file switches on.
        changes["faults"] = scenario.config.faults | parse_faults(getattr(args, "fault", []) or [])
        return replace(scenario, config=replace(scenario.config, **changes))
    except (UnknownFaultError, ConfigError) as err:
        raise UserError(str(err)) from None


def load_profile(path: str) -> Profile:
    """A timing profile file, validated (no unknown field, no negative, nan or infinite latency),
    or one clear UserError."""
    if Path(path).is_dir():
        raise UserError(f"{path}: is a folder, not a timing profile")
    try:
        return read_profile(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such timing profile") from None
    except ProfileError as err:
        raise UserError(str(err)) from None


def check_spec(text: str) -> str:
    """`--check ID=ARG`, validated when the arguments are parsed. A default invariant is always
    on: naming it did nothing before, and silently, so it is an error now."""
    name, has_arg, _ = text.partition("=")
    if name in INVARIANTS and not has_arg:
        raise argparse.ArgumentTypeError(
            f"{name} is already on (every default invariant is checked; --check adds an opt-in "
            "one such as bounded-wait=K)"
        )
    try:
        make_invariant(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


class _AppendCheck(argparse.Action):
    """`--check` (repeatable): the same opt-in check twice is an error, not a silent no-op."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        chosen = list(getattr(namespace, self.dest, None) or [])
        if values in chosen:
            parser.error(f"argument --check: {values} is already on (given twice)")
        setattr(namespace, self.dest, [*chosen, values])


def add_skip_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="INVARIANT",
        help="do not check this invariant (repeatable; default: check all of them; e.g. "
        "--skip exact-length to look past a bug you know, --skip no-race to look for races that "
        "corrupt tokens, the ones a GPU replay can show; a search may also skip no-crash or "
        "no-hang, to look past a crash or a hang it found)",
    )


def skipped(args: argparse.Namespace, run_ending: bool = False) -> frozenset[str]:
    """`--skip`, each a default invariant, or (a search's, `run_ending`) a finding that ends a
    run (`RUN_ENDING`); one line naming the known ones otherwise."""
    known = [*INVARIANTS, *(RUN_ENDING if run_ending else ())]
    unknown = sorted(set(args.skip) - set(known))
    if unknown:
        raise UserError(f"unknown invariant {', '.join(unknown)} (known: {', '.join(known)})")
    return frozenset(args.skip)


def add_hang_timeout_option(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--hang-timeout",
        type=finite_nonneg_float,
        metavar="SECONDS",
        help="wall-clock seconds one step() may take before it is the finding no-hang, with the "
        f"frame where it was stuck (0: no limit; default: {default})",
    )


def add_check_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action=_AppendCheck,
        default=[],
        type=check_spec,
        metavar="ID=ARG",
        help="also check an opt-in property (repeatable): bounded-wait=K, no request is "
        "overtaken by more than K later arrivals (default: none; the default invariants are "
        "always on)",
    )


def make_timing(args: argparse.Namespace) -> Timing:
    profile = load_profile(args.timing) if getattr(args, "timing", None) else Profile()
    seed = getattr(args, "seed", None)
    return Timing(profile, SeededDelay(seed)) if seed is not None else Timing(profile)


def add_scheduler_option(parser: argparse.ArgumentParser, default: str | None = REFERENCE) -> None:
    parser.add_argument(
        "--scheduler",
        default=default,
        metavar="SPEC",
        help="the scheduler under test: PATH.py:FACTORY, module:FACTORY or reference "
        "(default: " + (default or "the one the file records") + ")",
    )


def print_hints(violations: Sequence[Violation], loop: str) -> None:
    """One line on stderr for a finding whose usual cause is a setting, not a bug."""
    if loop == "overlap" and any(v.invariant == "no-hidden-sync" for v in violations):
        print(
            "hint: no-hidden-sync is checked because the run asks for the overlap loop; a "
            'scheduler with only a normal loop runs with --loop normal (or loop = "normal" in '
            "the scenario's config), where waiting for each forward is by design",
            file=sys.stderr,
        )


def finish_with_outputs(ok: bool, writes: Sequence[Callable[[], object]]) -> int:
    """Attempt every output write (after the verdict is printed) and give the exit status.

    A write that fails is one line on stderr; the others are still attempted. The status says
    what was found, so a failed write exits 2 only when nothing was: a violation keeps exit 1
    (the finding matters more than the file, and a script that tests for 1 must not miss it).
    """
    failed = False
    for write in writes:
        try:
            write()
        except UserError as err:
            print(f"overlapcheck: error: {err}", file=sys.stderr)
            failed = True
    if not ok:
        return 1
    return 2 if failed else 0


def scheduler_from_args(args: argparse.Namespace) -> SchedulerSpec | None:
    """`--scheduler`, parsed and loaded (a bad spec is one line here, before any search)."""
    if args.scheduler is None:
        return None
    return SchedulerSpec.load(args.scheduler)


def add_sarif_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--sarif",
        metavar="FILE",
        help="also write the findings as SARIF 2.1.0 (code scanning: one result per finding, "
        "at the scheduler's lines; none: an empty result list) (default: not written)",
    )


def sarif_path(args: argparse.Namespace) -> Path | None:
    """`--sarif`, checked before the run: a finding must never wait on an unwritable path."""
    return output_file(args.sarif, "SARIF file") if args.sarif else None
