"""Reading the JSON files users hand us (counterexamples, traces), with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from overlapcheck.core.errors import UserError


def read_json_file(path: str | Path, what: str) -> Any:
    """The parsed contents of `path`; a missing or malformed file is a UserError naming `what`."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p}: is a folder, not a {what} file")
    if not p.is_file():
        raise UserError(f"{p}: no such {what} file")
    try:
        return json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"{p}: not valid JSON: {err}") from None


def check_header(data: Any, fmt: str, version: int, what: str, where: str) -> None:
    """`data` must be a JSON object of our `fmt` at the `version` we read; else one UserError."""
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise UserError(f'{where}: not an overlapcheck {what} (no "format": "{fmt}")')
    if data.get("version") != version:
        raise UserError(
            f"{where}: {what} format version {data.get('version')!r} is not supported "
            f"(this overlapcheck reads version {version})"
        )
