"""The scheduler's whole code, file by file: what a replay compares to tell a fix from a flake.

After a run has built the scheduler, every module in `sys.modules` that is the scheduler's code
counts: not the Python installation, not a third-party library (site-packages), not
overlapcheck's own machinery, nor another `--scheduler` file this process loaded. The reference
and the shipped examples count when they are the scheduler (the spec, the factory's module, or a
class of the scheduler object's). A scheduler may also name folders whose modules are its code
even when installed in site-packages (`code_roots()`, `core/protocol.py`): an adapter names the
upstream checkout or installed package, so its files are recorded relative to that root
(`python/minisgl/scheduler/scheduler.py`), with the checkout's git commit and whether its tree
was dirty.

    code = fingerprint(spec_module_files, scheduler_object)
    changed = code.changed_since(recorded)   # ['python/minisgl/scheduler/scheduler.py']
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, cast

from overlapcheck.core.capability import provides
from overlapcheck.core.owners import PACKAGE, SHIPPED_FOLDERS, owner
from overlapcheck.core.protocol import HasCodeRoots

PLUGIN_PREFIX = "overlapcheck_plugin_"  # modules `--scheduler PATH.py:F` loads (scheduler_spec)


@dataclass(frozen=True, slots=True)
class CodeRoot:
    """One folder of the scheduler's code: its files (path relative to it -> hash) and, for a
    git checkout, its commit and whether the tree had changes (None: not a checkout)."""

    path: str
    files: dict[str, str]
    commit: str | None = None
    dirty: bool | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "files": dict(sorted(self.files.items()))}
        if self.commit is not None:
            out["commit"], out["dirty"] = self.commit, self.dirty
        return out

    @staticmethod
    def from_json(raw: Any) -> CodeRoot:
        if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
            raise ValueError("scheduler.code.roots: expected objects with a path")
        files = raw.get("files", {})
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise ValueError("scheduler.code.roots[].files: expected path -> hash strings")
        commit = raw.get("commit")
        dirty = raw.get("dirty")
        return CodeRoot(
            raw["path"],
            dict(files),
            commit if isinstance(commit, str) else None,
            dirty if isinstance(dirty, bool) else None,
        )


@dataclass(frozen=True, slots=True)
class CodeFingerprint:
    """Every file of the scheduler's code, by root."""

    roots: tuple[CodeRoot, ...] = field(default=())

    def digest(self) -> str:
        """One hash of every file (relative path and content hash): the file's `source_hash`."""
        digest = hashlib.blake2b(digest_size=8)
        for name, value in sorted(self.files().items()):
            digest.update(f"{name}\0{value}\0".encode())
        return digest.hexdigest()

    def files(self) -> dict[str, str]:
        """Relative path -> hash over every root (a name two roots share: the first root's)."""
        out: dict[str, str] = {}
        for root in reversed(self.roots):
            out.update(root.files)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"roots": [root.to_json() for root in self.roots]}

    @staticmethod
    def from_json(raw: Any) -> CodeFingerprint:
        if not isinstance(raw, dict) or not isinstance(raw.get("roots"), list):
            raise ValueError("scheduler.code: expected an object with a list of roots")
        return CodeFingerprint(tuple(CodeRoot.from_json(r) for r in raw["roots"]))

    def changed_files(self, now: CodeFingerprint | None = None) -> list[str]:
        """The files (relative paths) that differ from this recording: each recorded file
        hashed again where it was (or, for a moved checkout, where `now` found its root), and
        the files `now` holds that were not recorded (code a fix brought in). `now`: the
        fingerprint after a replay built the scheduler (None: the recorded files only)."""
        now_roots = now.roots if now is not None else ()
        current = {(r.path, name): value for r in now_roots for name, value in r.files.items()}
        # A file the replay imported from another folder (a patched copy of the tree, named by
        # the engine's variable) is the code now, whether or not the recorded folder still holds
        # the old one.
        by_name: dict[str, str] = {}
        for r in now_roots:
            for name, hashed in r.files.items():
                by_name.setdefault(name, hashed)
        elsewhere = [Path(r.path) for r in now_roots]
        changed = []
        for root in self.roots:
            gone = not elsewhere and not Path(root.path).is_dir()
            for name, recorded in root.files.items():
                value: str | None = current.get((root.path, name))
                if value is None:
                    value = by_name.get(name)
                if value is None and gone:
                    continue  # recorded on another machine, nothing imported yet: cannot tell
                if value is None:  # not imported now: as on disk, where the code now is first
                    value = _hash_where(name, [*elsewhere, Path(root.path)])
                if value != recorded:
                    changed.append(name)
        pairs = {(r.path, name) for r in self.roots for name in r.files}
        names = {name for _, name in pairs}
        changed += [
            name for (path, name) in current if (path, name) not in pairs and name not in names
        ]
        return sorted(set(changed))

    def commits_moved(self, now: CodeFingerprint) -> list[str]:
        """`root: old -> new` for each checkout whose commit differs."""
        before = {r.path: r.commit for r in self.roots if r.commit is not None}
        return [
            f"{r.path}: {before[r.path][:12]} -> {r.commit[:12]}"
            for r in now.roots
            if r.commit is not None and r.path in before and before[r.path] != r.commit
        ]


def _hash_where(name: str, roots: Iterable[Path]) -> str | None:
    for root in roots:
        path = root / name
        if path.is_file():
            return file_hash(path)
    return None


def file_hash(path: Path) -> str:
    stat = path.stat()
    return _file_hash(path, stat.st_mtime_ns, stat.st_size)


@cache
def _file_hash(path: Path, mtime_ns: int, size: int) -> str:
    # (keyed by the modification time and size too: a file edited in this process hashes anew)
    return hashlib.blake2b(path.read_bytes(), digest_size=8).hexdigest()


def fingerprint(
    scheduler: object | None,
    own_files: Sequence[Path] = (),
    extra_roots: Sequence[Path] = (),
    scheduler_folders: Sequence[Path] = (),
) -> CodeFingerprint:
    """The scheduler's code as this process holds it now (call it after the scheduler was
    built). `scheduler`: the built object (its `code_roots()`, the classes it is made of);
    `own_files`: files that are the scheduler's whatever else is true (its factory's module);
    `extra_roots`: folders to record files relative to (a `PATH.py` spec's folder);
    `scheduler_folders`: overlapcheck folders that are the scheduler (the reference's)."""
    declared: list[Path] = []
    if scheduler is not None and provides(scheduler, HasCodeRoots):
        declared = [Path(p).resolve() for p in cast(HasCodeRoots, scheduler).code_roots()]
    folders = {f.resolve() for f in scheduler_folders}
    for path in [*own_files, *_class_files(scheduler)]:
        folders.update(f for f in SHIPPED_FOLDERS if path.resolve().is_relative_to(f))
    # (a factory of overlapcheck's own, an adapter's say, is machinery: its engine is the code)
    own = {
        p.resolve()
        for p in own_files
        if not p.resolve().is_relative_to(PACKAGE)
        or any(p.resolve().is_relative_to(f) for f in SHIPPED_FOLDERS)
    }
    roots = [*declared, *(p.resolve() for p in extra_roots)]
    if folders:
        roots.append(PACKAGE)
    path_entries = sorted(
        {Path(p).resolve() for p in sys.path if p and Path(p).is_dir()},
        key=lambda p: len(p.parts),
        reverse=True,
    )
    by_root: dict[Path, dict[str, str]] = {}
    code_roots = tuple(declared)
    chosen = [p for p in _module_files() if p not in own and _counts(p, code_roots, folders)]
    for path in sorted([*chosen, *own], key=str):
        root = _root_of(path, roots, path_entries)
        by_root.setdefault(root, {})[path.relative_to(root).as_posix()] = file_hash(path)
    return CodeFingerprint(
        tuple(
            CodeRoot(str(root), files, *git_state(root))
            for root, files in sorted(by_root.items(), key=lambda item: str(item[0]))
        )
    )


def _module_files() -> set[Path]:
    out = set()
    for name, module in list(sys.modules.items()):
        if name in ("__main__", "__mp_main__") or name.startswith(PLUGIN_PREFIX):
            continue  # the script running, and other `--scheduler` files (own_files has ours)
        file = getattr(module, "__file__", None)
        if isinstance(file, str):
            path = _resolved(file)
            if path is not None:
                out.add(path)
    return out


@cache
def _resolved(file: str) -> Path | None:
    path = Path(file).resolve()
    return path if path.is_file() else None


def _counts(path: Path, code_roots: tuple[Path, ...], folders: set[Path]) -> bool:
    """Whether a loaded module's file is the scheduler's code: its own, or a scheduler
    overlapcheck ships when it is the one under test (`folders`)."""
    whose = owner(path, code_roots)
    if whose == "shipped":
        return any(path.is_relative_to(folder) for folder in folders)
    return whose == "scheduler"


def _root_of(path: Path, roots: Sequence[Path], path_entries: Sequence[Path]) -> Path:
    """The folder `path` is recorded relative to: the innermost declared root holding it, else
    the innermost import path entry, else its own folder."""
    holding = [r for r in roots if path.is_relative_to(r)]
    if holding:
        return max(holding, key=lambda r: len(r.parts))
    entry = next((e for e in path_entries if path.is_relative_to(e)), None)
    if entry is not None:
        return entry
    top = path.parent  # no longer on the import path: above its outermost package
    while (top / "__init__.py").is_file() and top.parent != top:
        top = top.parent
    return top


def _class_files(scheduler: object | None) -> list[Path]:
    if scheduler is None:
        return []
    out = []
    for cls in type(scheduler).__mro__:
        file = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if isinstance(file, str):
            out.append(Path(file))
    return out


@cache
def git_state(root: Path) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout holding `root`; (None, None) when there is no git or
    `root` is not in a checkout. Asked once per root and process. Untracked files do not make
    a tree dirty: a counterexample folder in the checkout would (the files hashed tell more)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if head.returncode != 0:
            return None, None
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None, None
    dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
    return head.stdout.strip() or None, dirty
