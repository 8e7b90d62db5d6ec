"""Input and output paths, checked before a run starts: a run of minutes must not end in an error
that the first millisecond could have reported, and a found bug must have somewhere to go."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from overlapcheck.core.errors import UserError


def input_file(text: str, what: str) -> Path:
    """An existing regular file (a folder or a missing path is one line naming `what`)."""
    path = Path(text)
    if path.is_dir():
        raise UserError(f"{path}: is a folder, not a {what} file")
    if not path.is_file():
        raise UserError(f"{path}: no such {what} file")
    return path


def output_file(text: str, what: str, suffixes: Iterable[str] = ()) -> Path:
    """A file that can be written: not a folder, in a folder that exists and takes new files,
    with one of `suffixes` (any when empty)."""
    path = Path(text)
    allowed = tuple(suffixes)
    if allowed and path.suffix.lower() not in allowed:
        raise UserError(
            f"{path}: a {what} must end in {', '.join(allowed)}, not "
            f"{path.suffix or '(no extension)'!r}"
        )
    if path.is_dir():
        raise UserError(f"{path}: is a folder; the {what} needs a file name")
    folder = path.parent
    if not folder.is_dir():
        raise UserError(f"{path}: folder {folder} does not exist")
    _probe(folder, f"{path}: cannot write the {what} in {folder}")
    return path


def output_folder(text: str, option: str) -> Path:
    """A folder that exists (created if missing) and takes new files."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path}: is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"{option} {path}: cannot create the folder ({err.strerror})") from None
    _probe(path, f"{option} {path}: the folder is not writable")
    return path


def _probe(folder: Path, message: str) -> None:
    """Create and remove a file in `folder`. `os.access` is not enough: it says yes to root on a
    read-only file system, and to anyone on a folder whose quota is spent."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".overlapcheck-probe-")
    except OSError as err:
        raise UserError(f"{message} ({err.strerror})") from None
    os.close(fd)
    os.unlink(name)
