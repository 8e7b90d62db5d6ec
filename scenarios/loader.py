"""Load scenarios from JSON or TOML files, with errors that name the field."""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

from overlapcheck.core.config import ConfigError, SchedulerConfig
from overlapcheck.core.errors import UserError
from overlapcheck.core.scenario import Anchor, RequestSpec, Scenario
from overlapcheck.reference.faults import UnknownFaultError, parse_faults


class ScenarioError(UserError, ValueError):
    """A scenario that cannot be built; the message is one line for the user."""


# Each config field's type, from its default: ints for sizes and thresholds, strings for the
# switches (whose allowed values SchedulerConfig itself checks).
CONFIG_TYPES: dict[str, type] = {
    f.name: type(f.default) for f in fields(SchedulerConfig) if f.name not in ("faults", "rank")
}  # (no `rank`: a file names how many ranks run, and the harness numbers them)
CONFIG_FIELDS = {*CONFIG_TYPES, "faults"}
REQUEST_FIELDS = {f.name for f in fields(RequestSpec)}
T = TypeVar("T")


def load_scenario_file(path: str | Path) -> Scenario:
    p = Path(path)
    if p.is_dir():
        raise ScenarioError(f"{p}: is a folder, not a scenario file")
    if not p.is_file():
        raise ScenarioError(f"{p}: no such scenario file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise ScenarioError(f"{p}: cannot read the scenario file: {err}") from None
    try:
        data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as err:
        raise ScenarioError(
            f"{p}: not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {err}"
        ) from None
    return scenario_from_dict(data, default_name=p.stem, where=str(p))


def scenario_from_dict(
    data: Any, default_name: str = "scenario", where: str = "scenario"
) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: expected an object with 'config' and 'requests'")
    known = {"name", "description", "config", "requests", "tags", "eos_probability"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ScenarioError(f"{where}: unknown key {', '.join(unknown)}")
    cfg = data.get("config", {})
    if not isinstance(cfg, dict):
        raise ScenarioError(f"{where}: 'config' must be an object")
    bad = sorted(set(cfg) - CONFIG_FIELDS)
    if bad:
        raise ScenarioError(f"{where}: unknown config field {', '.join(bad)}")
    cfg = dict(cfg)
    if "faults" in cfg:
        cfg["faults"] = _faults(cfg["faults"], f"{where}: config.faults")
    for name, value in cfg.items():
        if name == "faults":
            continue
        if CONFIG_TYPES[name] is int:
            _int(value, f"{where}: config.{name}")
        elif CONFIG_TYPES[name] is tuple:
            if not isinstance(value, list):
                raise ScenarioError(f"{where}: config.{name}: expected a list, got {value!r}")
            for item in value:
                _int(item, f"{where}: config.{name}")
            cfg[name] = tuple(value)
        elif not isinstance(value, str):
            raise ScenarioError(f"{where}: config.{name}: expected a string, got {value!r}")
    try:
        config = SchedulerConfig(**cfg)
    except (ConfigError, TypeError) as err:
        raise ScenarioError(f"{where}: config: {err}") from None
    reqs = data.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise ScenarioError(f"{where}: 'requests' must be a non-empty list")
    specs = tuple(_request(r, i, where) for i, r in enumerate(reqs))
    eos_probability = _float(data.get("eos_probability", 0.0), f"{where}: eos_probability")
    if not 0.0 <= eos_probability <= 1.0:
        raise ScenarioError(f"{where}: eos_probability must be in [0, 1], got {eos_probability}")
    return Scenario(
        _str(data.get("name", default_name), f"{where}: name"),
        config,
        specs,
        _str(data.get("description", ""), f"{where}: description"),
        eos_probability=eos_probability,
    )


def _request(raw: Any, index: int, where: str) -> RequestSpec:
    at = f"{where}: requests[{index}]"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{at}: expected an object")
    bad = sorted(set(raw) - REQUEST_FIELDS)
    if bad:
        raise ScenarioError(f"{at}: unknown field {', '.join(bad)}")
    if "uid" not in raw or "prompt" not in raw:
        raise ScenarioError(f"{at}: needs 'uid' and 'prompt'")
    uid = _int(raw["uid"], f"{at}.uid")
    at = f"{where}: requests[{index}] (uid {uid})"  # from here on, name the request both ways
    spec = RequestSpec(
        uid=uid,
        prompt=_tokens(raw["prompt"], f"{at}.prompt"),
        max_tokens=_int(raw.get("max_tokens", 8), f"{at}.max_tokens"),
        arrival=_seconds(raw.get("arrival", 0.0), f"{at}.arrival"),
        ignore_eos=_bool(raw.get("ignore_eos", False), f"{at}.ignore_eos"),
        continuation=_tokens(raw.get("continuation", []), f"{at}.continuation"),
        abort_at=_maybe(raw, "abort_at", _seconds, at),
        arrival_iteration=_maybe(raw, "arrival_iteration", _int, at),
        abort_iteration=_maybe(raw, "abort_iteration", _int, at),
        after=_maybe(raw, "after", _int, at),
        think=_seconds(raw.get("think", 0.0), f"{at}.think"),
        arrival_after=_maybe(raw, "arrival_after", _anchor, at),
        abort_after=_maybe(raw, "abort_after", _anchor, at),
    )
    problem = spec.problem(index)
    if problem is not None:
        raise ScenarioError(f"{at}: {problem}")
    return spec


def _anchor(value: Any, at: str) -> Anchor:
    """`{"request": 2, "at": "finished", "iterations": 0}` (iterations default to 0)."""
    if not isinstance(value, dict):
        raise ScenarioError(f"{at}: expected an object with 'request' and 'at', got {value!r}")
    bad = sorted(set(value) - {"request", "at", "iterations"})
    if bad:
        raise ScenarioError(f"{at}: unknown field {', '.join(bad)}")
    if "request" not in value or "at" not in value:
        raise ScenarioError(f"{at}: needs 'request' and 'at'")
    return Anchor(
        _int(value["request"], f"{at}.request"),
        _str(value["at"], f"{at}.at"),
        _int(value.get("iterations", 0), f"{at}.iterations"),
    )


def _faults(value: Any, at: str) -> frozenset[str]:
    """Named faults (`overlapcheck faults`) to switch on, as in `--fault`."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ScenarioError(f"{at}: expected a list of fault names, got {value!r}")
    try:
        return parse_faults(value)
    except UnknownFaultError as err:
        raise ScenarioError(f"{at}: {err}") from None


def _maybe(raw: dict[str, Any], name: str, parse: Callable[[Any, str], T], at: str) -> T | None:
    return None if raw.get(name) is None else parse(raw[name], f"{at}.{name}")


def _int(value: Any, at: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{at}: expected an integer, got {value!r}")
    return value


def _float(value: Any, at: str) -> float:
    # bool is an int subclass: `true` where a number belongs is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{at}: expected a number, got {value!r}")
    return float(value)


def _seconds(value: Any, at: str) -> float:
    """A moment or a span in simulated seconds: finite and >= 0 (nan would compare false with
    every bound and slip through every later check)."""
    seconds = _float(value, at)
    if not math.isfinite(seconds) or seconds < 0:
        raise ScenarioError(f"{at}: expected a finite number of seconds >= 0, got {value!r}")
    return seconds


def _bool(value: Any, at: str) -> bool:
    # A string such as "false" is truthy: taken as given it would mean the opposite.
    if not isinstance(value, bool):
        raise ScenarioError(f"{at}: expected true or false, got {value!r}")
    return value


def _str(value: Any, at: str) -> str:
    if not isinstance(value, str):
        raise ScenarioError(f"{at}: expected a string, got {value!r}")
    return value


def _tokens(value: Any, at: str) -> tuple[int, ...]:
    """A list of token ids (each an integer; ids outside the vocabulary are the scheduler's to
    reject, so they load)."""
    if not isinstance(value, list):
        raise ScenarioError(f"{at}: expected a list of token ids, got {value!r}")
    return tuple(_int(t, f"{at}[{i}]") for i, t in enumerate(value))
