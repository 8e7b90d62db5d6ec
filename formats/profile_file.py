"""Timing profile files: `{"profile": {field: seconds}}` as `calibrate` writes them, or the bare
object of field -> seconds. What the fields mean and how they are checked is `Profile`'s."""

from __future__ import annotations

import json
from pathlib import Path

from overlapcheck.backends.sim.timing import Profile, ProfileError


def read_profile(path: str | Path) -> Profile:
    """The profile in a file. Raises FileNotFoundError, or ProfileError naming the file."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProfileError(f"{path}: not a readable JSON timing profile: {err}") from None
    if isinstance(data, dict) and "profile" in data:
        data = data["profile"]
    try:
        return Profile.from_dict(data)
    except ProfileError as err:
        raise ProfileError(f"{path}: timing profile: {err}") from None


def write_profile(profile: Profile, path: str | Path) -> Path:
    """Write `profile` as `calibrate` does; the path written."""
    out = Path(path)
    out.write_text(json.dumps({"profile": profile.as_dict()}, indent=1) + "\n")
    return out
