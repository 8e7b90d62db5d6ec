"""How a report names a folder of the scheduler's code to someone without this machine: the
project and version its metadata declares, the git commit and whether tracked files changed
(for a checkout), the snapshot's folder name (for an unpacked tree), never the local path.

    tree = describe("/tmp/x/mini-sglang-20fcd7f")
    tree.text()  # "`mini-sglang-20fcd7f`, a source tree of minisgl 0.1.0 (its pyproject.toml);
                 #  not a git checkout, so its commit and any local changes are not known"

A folder that is not on this machine (a counterexample recorded elsewhere) is named from what
its fingerprint recorded: the commit and whether the tree was dirty, and the folder's name.
"""

from __future__ import annotations

import subprocess
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from email.parser import Parser
from functools import cache
from pathlib import Path

from overlapcheck.harness.fingerprint import CodeFingerprint, git_state

_INSTALLED = ("site-packages", "dist-packages")


@dataclass(frozen=True, slots=True)
class SourceTree:
    """One folder files are named relative to, as upstream can know it.

    `folder`: the folder's name (a snapshot's `mini-sglang-20fcd7f`), or its path inside the tree
    it belongs to (`sglang/srt/mem_cache`, with `tree` the tree's name); `project`: name and
    version from the metadata (`vllm 0.34.0`) and `source`: which file said so; `commit` and
    `dirty`: the git checkout's HEAD and whether its tracked files differ from it."""

    folder: str
    tree: str = ""
    project: str = ""
    source: str = ""
    commit: str | None = None
    dirty: bool | None = None
    installed: bool = False
    unknown: bool = False  # not on this machine, and the counterexample does not describe it
    remote: str = ""  # the checkout's `origin`, as a URL anyone can fetch ("" if none or local)

    def text(self) -> str:
        """The folder, as a phrase that follows "Paths are relative to "."""
        project = f"{self.project} (its {self.source})" if self.project else ""
        if self.unknown:
            return f"the root of `{self.folder}` (not on this machine; the file does not say more)"
        if self.installed:
            what = project or "the scheduler's package"
            return f"the {self.folder} folder holding {what}, installed"
        where = f"`{self.folder}` in " if self.tree else "the root of "
        if self.commit is not None:
            changes = {
                True: "with local changes to tracked files",
                False: "no local changes to tracked files",
                None: "whether it had local changes is not known",
            }[self.dirty]
            named = f"{project}, " if project else ""
            return f"{where}a git checkout: {named}commit `{self.commit}`, {changes}"
        name = self.tree or self.folder
        named = f", a source tree of {project}" if project else ""
        return (
            f"{where}`{name}`{named}; not a git checkout, so its commit and any local changes "
            "are not known"
        )


def describe(
    root: str, files: Iterable[str] = (), recorded: CodeFingerprint | None = None
) -> SourceTree:
    """`root` as upstream can know it. `files`: paths relative to it that the report names (they
    pick the distribution of an installed folder holding several); `recorded`: the
    counterexample's fingerprint, for a folder not on this machine."""
    path = Path(root)
    if not path.is_dir():
        return _recorded(path, recorded)
    commit, dirty = git_state(path)
    if commit is not None and _tracked(path):
        top = _git_top(path) or path
        inner = "" if top == path else path.relative_to(top).as_posix()
        project, source = _metadata(path, files) or _metadata(top, ()) or ("", "")
        return SourceTree(inner or top.name, top.name if inner else "", project, source, commit,
                          dirty, remote=_remote(top))  # fmt: skip
    if path.name in _INSTALLED:
        project, source = _metadata(path, files) or ("", "")
        return SourceTree(path.name, project=project, source=source, installed=True)
    top = next((p for p in (path, *path.parents) if _metadata(p, files)), path)
    project, source = _metadata(top, files) or ("", "")
    if top == path:
        return SourceTree(path.name, project=project, source=source)
    return SourceTree(path.relative_to(top).as_posix(), top.name, project, source)


def _recorded(path: Path, recorded: CodeFingerprint | None) -> SourceTree:
    for code_root in recorded.roots if recorded is not None else ():
        if code_root.path == str(path):
            return SourceTree(path.name, commit=code_root.commit, dirty=code_root.dirty)
    return SourceTree(path.name, unknown=True)


def checkout_top(path: str) -> Path | None:
    """The top folder of the git checkout whose tracked files include `path`'s, else None."""
    folder = Path(path)
    if not folder.is_dir() or git_state(folder)[0] is None or not _tracked(folder):
        return None
    return _git_top(folder)


@cache
def _git_top(path: Path) -> Path | None:
    top = _git(path, "rev-parse", "--show-toplevel")
    return Path(top).resolve() if top else None


@cache
def _remote(top: Path) -> str:
    """The checkout's `origin` as a URI others can reach, credentials left out; "" when there is
    none or it is a folder of this machine. An scp-like `git@host:owner/repo` is written as the
    `ssh://` URI it stands for."""
    url = _git(top, "remote", "get-url", "origin")
    scheme, sep, rest = url.partition("://")
    if sep:
        authority, slash, path = rest.partition("/")
        local = scheme == "file" or not authority
        return "" if local else f"{scheme}://{authority.rpartition('@')[2]}{slash}{path}"
    host, colon, path = url.partition(":")
    if colon and len(host) > 1 and "/" not in host and path:
        return f"ssh://{host}/{path.lstrip('/')}"
    return ""


@cache
def _tracked(path: Path) -> bool:
    """Whether the checkout holding `path` tracks files in it: a tree unpacked into an ignored
    folder of another checkout is not that checkout's commit."""
    return bool(_git(path, "ls-files", "--", "."))


def _git(path: Path, *args: str) -> str:
    """The output of a git command run in `path` ("" when it fails or there is no git)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(path), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _metadata(folder: Path, files: Iterable[str]) -> tuple[str, str] | None:
    """(`name version`, the file that says so) from the folder's own metadata: an sdist's
    PKG-INFO, a wheel's .dist-info (the one holding `files`' packages where there are several),
    else its pyproject.toml (a version the build computes is left out)."""
    pkg_info = folder / "PKG-INFO"
    if pkg_info.is_file():
        return _core_metadata(pkg_info, "PKG-INFO")
    dists = sorted(folder.glob("*.dist-info"))
    tops = {f.split("/")[0] for f in files}
    chosen = [d for d in dists if tops and tops & _top_level(d)] or (
        dists if len(dists) == 1 else []
    )
    if len(chosen) == 1 and (chosen[0] / "METADATA").is_file():
        return _core_metadata(chosen[0] / "METADATA", ".dist-info")
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file():
        try:
            project = tomllib.loads(pyproject.read_text()).get("project", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return None
        name, version = project.get("name"), project.get("version")
        if isinstance(name, str) and name:
            text = f"{name} {version}" if isinstance(version, str) and version else name
            return text, "pyproject.toml"
    return None


def _core_metadata(path: Path, source: str) -> tuple[str, str] | None:
    try:
        headers = Parser().parsestr(path.read_text(errors="replace"), headersonly=True)
    except OSError:
        return None
    name, version = headers.get("Name"), headers.get("Version")
    if not name:
        return None
    return (f"{name} {version}" if version else str(name)), source


def _top_level(dist_info: Path) -> set[str]:
    """The top-level names a distribution installs: its top_level.txt, else its RECORD's."""
    top_level = dist_info / "top_level.txt"
    if top_level.is_file():
        return {line.strip() for line in top_level.read_text().splitlines() if line.strip()}
    record = dist_info / "RECORD"
    if record.is_file():
        return {line.split("/")[0] for line in record.read_text().splitlines() if "/" in line}
    return set()
