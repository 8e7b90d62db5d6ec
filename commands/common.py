"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from overlapcheck.backends.sim.timing import Profile, SeededDelay, Timing
from overlapcheck.core.config import CACHE_KINDS, LOOP_KINDS, POLICIES, ConfigError
from overlapcheck.core.scenario import Scenario
from overlapcheck.errors import UserError
from overlapcheck.invariants.registry import make_invariant
from overlapcheck.reference.faults import UnknownFaultError, parse_faults
from overlapcheck.scenarios.loader import ScenarioError, load_scenario_file
from overlapcheck.scenarios.named import NAMED, named_scenario
from overlapcheck.scheduler_spec import REFERENCE, SchedulerSpec, parse_spec


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


def add_config_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--loop", choices=LOOP_KINDS, help="scheduler loop (default: the scenario's)"
    )
    parser.add_argument(
        "--cache", choices=CACHE_KINDS, help="prefix cache (default: the scenario's)"
    )
    parser.add_argument("--page-size", type=positive_int, help="tokens per KV page")
    parser.add_argument(
        "--policy",
        choices=POLICIES,
        help="queue policy before each prefill batch (default: the scenario's)",
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        dest="max_extend_tokens",
        help="prefill token budget per batch (max_extend_tokens)",
    )
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME",
        help="re-enable a named known bug (repeatable; see `overlapcheck faults`)",
    )


def add_timing(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seed",
        type=nonneg_int,
        default=None,
        help="draw random operation delays from this seed (default: nominal timing)",
    )
    parser.add_argument(
        "--timing", metavar="FILE", help="a timing profile (JSON), e.g. from calibrate"
    )


def resolve_scenario(text: str) -> Scenario:
    if text in NAMED:
        return named_scenario(text)
    if Path(text).suffix in (".json", ".toml") or Path(text).exists():
        try:
            return load_scenario_file(text)
        except ScenarioError as err:
            raise UserError(str(err)) from None
    raise UserError(
        f"unknown scenario {text!r}: name one of {', '.join(NAMED)} or a .json/.toml file"
    )


def apply_overrides(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    changes: dict[str, object] = {}
    for name in ("loop", "cache", "page_size", "max_extend_tokens", "policy"):
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    try:
        changes["faults"] = parse_faults(getattr(args, "fault", []) or [])
        return replace(scenario, config=replace(scenario.config, **changes))
    except (UnknownFaultError, ConfigError) as err:
        raise UserError(str(err)) from None


def load_profile(path: str) -> Profile:
    """A timing profile file, or one clear UserError."""
    try:
        return Profile.load(path)
    except FileNotFoundError:
        raise UserError(f"{path}: no such timing profile") from None
    except (OSError, ValueError, TypeError) as err:
        raise UserError(f"{path}: bad timing profile: {err}") from None


def check_spec(text: str) -> str:
    """`--check ID=ARG`, validated when the arguments are parsed."""
    try:
        make_invariant(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def add_check_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="append",
        default=[],
        type=check_spec,
        metavar="ID=ARG",
        help="also check an opt-in property, e.g. bounded-wait=K (repeatable)",
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


def scheduler_from_args(args: argparse.Namespace) -> SchedulerSpec | None:
    """`--scheduler`, parsed and loaded (a bad spec is one line here, before any search)."""
    if args.scheduler is None:
        return None
    spec = parse_spec(args.scheduler)
    spec.factory()
    return spec
