"""`overlapcheck report`: a Markdown bug report from a counterexample, with the lines, the
workload, the interleaving, the replay command and a fix to try derived from the finding."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile
from overlapcheck.cli import main
from overlapcheck.core.sites import Location
from overlapcheck.formats import counterexample
from overlapcheck.formats.finding_report import _call_path
from overlapcheck.harness.fingerprint import CodeFingerprint, CodeRoot
from overlapcheck.harness.runner import run_scenario
from overlapcheck.harness.scheduler_spec import SchedulerSpec
from overlapcheck.harness.source_tree import describe
from overlapcheck.invariants.base import Violation
from overlapcheck.invariants.fixes import fix_to_try
from overlapcheck.scenarios.loader import scenario_from_dict
from overlapcheck.scenarios.named import named_scenario
from tests.test_locations import EARLY_FREE, ROOT

# examples/minimal_scheduler.py launching a forward without its metadata staged: a finding at
# a line of the copy (`device-contract`).
STAGED = "            self.staged = dev.stage_metadata(batch, dev.scheduler_stream)\n"


@pytest.fixture(scope="module")
def found(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = run_scenario(scenario_from_dict(EARLY_FREE), SimBackend())
    return counterexample.save(result, Profile(), {}, tmp_path_factory.mktemp("cex"))


def test_a_report_names_the_lines_the_workload_the_replay_and_a_fix(
    found: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bug.md"
    assert main(["report", str(found), "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# `slot-not-in-flight`: a slot reused while a launched batch")
    for heading in ("What goes wrong", "Where", "Minimal workload", "The interleaving"):
        assert f"## {heading}" in text
    assert "| freed | `reference/scheduler.py:" in text  # the line that freed it, first
    assert "| in flight |" in text and "| reused |" in text
    assert '{"uid": 1, "prompt": [3], "max_tokens": 2, "continuation": [2]}' in text
    assert f"overlapcheck replay {found}" in text
    assert "Defer the free (`reference/scheduler.py:" in text
    assert "Timeline: `" in text  # beside the report, named relative to it
    assert (out.parent / text.split("Timeline: `")[1].split("`")[0]).is_file()


def test_a_fix_to_try_follows_the_finding_kind_and_its_words() -> None:
    def loc(role: str, agent: str) -> Location:
        return Location(role, "engine/run.py", 7, "step", "/src", agent, 1, "op")

    reuse = Violation(
        "no-race",
        2,
        0.0,
        (),
        "WAR",
        {"first": {"agent": "engine"}, "second": {"agent": "scheduler"}},
        (loc("read", "engine"), loc("reused", "scheduler"), loc("write", "scheduler")),
    )
    assert "`record_stream` with engine's stream" in fix_to_try(reuse)
    plain = Violation(
        "no-race",
        2,
        0.0,
        (),
        "RAW",
        {"first": {"agent": "scheduler"}, "second": {"agent": "engine"}},
    )
    assert "make engine wait for scheduler (`wait_stream`" in fix_to_try(plain)
    slot = Violation("slot-not-in-flight", 2, 0.0, (), "", {}, (loc("freed", "host"),))
    assert fix_to_try(slot, {"slot": "table_idx"}).startswith("The table_idx goes back")


def test_bad_input_is_one_line_and_exit_2(
    found: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert main(["report", str(found), "-o", str(tmp_path / "bug.txt")]) == 2
    not_one = tmp_path / "trace.json"
    not_one.write_text('{"format": "overlapcheck-trace", "version": 1}')
    assert main(["report", str(not_one)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("overlapcheck: error:") for line in lines)


def _git(tree: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@example.com",
         "-c", "commit.gpgsign=false", *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


@pytest.mark.parametrize("checkout", [True, False], ids=["git", "unpacked"])
def test_a_report_names_the_tree_by_its_commit_never_by_its_local_folder(
    checkout: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if checkout and shutil.which("git") is None:
        pytest.skip("no git")
    tree = tmp_path / "engine-checkout"
    tree.mkdir()
    source = (ROOT / "examples" / "minimal_scheduler.py").read_text()
    assert source.count(STAGED) == 1
    (tree / "mine.py").write_text(source.replace(STAGED, "            self.staged = None\n"))
    if checkout:
        _git(tree, "init", "-q")
        _git(tree, "add", "mine.py")
        _git(tree, "commit", "-q", "-m", "mine")
    spec = SchedulerSpec.load(f"{tree / 'mine.py'}:make_scheduler")
    result = run_scenario(named_scenario("basic"), SimBackend(), scheduler=spec)
    assert result.violations and result.violations[0].locations[0].root == str(tree)
    found = counterexample.save(result, Profile(), {}, tree / "found", scheduler=spec)
    monkeypatch.setenv("ENGINE_TREE", str(tree))  # how the user's replay finds the tree
    elsewhere = tmp_path / "reports"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["report", str(found), "-o", "bug.md"]) == 0
    text = (elsewhere / "bug.md").read_text()
    assert str(tmp_path) not in text, text  # neither the tree's folder nor any other local one
    assert "| `mine.py:" in text  # the lines: relative to the tree's root
    assert f"ENGINE_TREE=/path/to/engine-checkout overlapcheck replay found/{found.name}" in text
    if checkout:
        head = _git(tree, "rev-parse", "HEAD")
        assert f"a git checkout: commit `{head}`, no local changes to tracked files." in text
    else:
        assert "the root of `engine-checkout`; not a git checkout, so its commit" in text


def _dist(folder: Path, name: str, version: str) -> None:
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")


def test_a_tree_that_is_no_checkout_is_named_by_its_metadata_and_folder_name(
    tmp_path: Path,
) -> None:
    sdist = tmp_path / "vllm-0.34.0"  # an unpacked source distribution
    sdist.mkdir()
    (sdist / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.34.0\n")
    assert describe(str(sdist)).text() == (
        "the root of `vllm-0.34.0`, a source tree of vllm 0.34.0 (its PKG-INFO); not a git "
        "checkout, so its commit and any local changes are not known"
    )
    wheel = tmp_path / "sglang-0.5.23"  # an unpacked wheel; files named inside a package
    inner = wheel / "sglang" / "srt" / "mem_cache"
    inner.mkdir(parents=True)
    _dist(wheel, "sglang", "0.5.23")
    assert (
        describe(str(inner), ["memory_pool.py"])
        .text()
        .startswith(
            "`sglang/srt/mem_cache` in `sglang-0.5.23`, a source tree of sglang 0.5.23 (its "
            ".dist-info); not a git checkout"
        )
    )
    site = tmp_path / "site-packages"  # installed: the distribution holding the files named
    _dist(site, "aaa", "1.0")
    _dist(site, "engine", "2.0")
    assert describe(str(site), ["engine/sched.py"]).text() == (
        "the site-packages folder holding engine 2.0 (its .dist-info), installed"
    )
    if shutil.which("git") is not None:  # unpacked into an ignored folder of a checkout
        _git(tmp_path, "init", "-q")
        (tmp_path / ".gitignore").write_text("vllm-0.34.0/\n")
        _git(tmp_path, "add", ".gitignore")
        _git(tmp_path, "commit", "-q", "-m", "ignore")
        assert "not a git checkout" in describe(str(sdist)).text()
    # not on this machine: what the counterexample's fingerprint recorded, never its path
    recorded = CodeFingerprint((CodeRoot(str(tmp_path / "gone"), {}, "0123abcd", True),))
    assert describe(str(tmp_path / "gone"), (), recorded).text() == (
        "the root of a git checkout: commit `0123abcd`, with local changes to tracked files"
    )


def test_a_crash_report_shows_the_call_path_to_the_line_that_raised() -> None:
    """The line that raised may only meet what an earlier decision made (an admission that let
    too much in): the report keeps the frames the exception passed through, outermost first."""
    frames = [
        "sched/loop.py:10 in step",
        "sched/cache.py:52 in allocate",
        "kv/cache.py:35 in evict",
    ]
    crash = Violation(
        "no-crash", 0, 0.0, (), "the scheduler raised NotImplementedError", {"traceback": frames}
    )
    shown = _call_path(crash)
    assert shown[1] == "Call path (outermost first):" and shown[4:7] == frames
    assert "earlier decision" in fix_to_try(crash)
    assert _call_path(Violation("no-race", 0, 0.0, (), "WAR", {})) == []
