"""Bad input: every case is one line on stderr and exit 2; a violation is never hidden by an output
file that cannot be written; exit codes mean one thing (0 ok, 1 violation, 2 bad input, 3 ours).

`python tests/test_bad_input.py` prints the table of docs/bad-input.md from these cases (run it
from the repository root; `test_the_bad_input_page_lists_every_case` keeps the two in step).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from overlapcheck.backends.sim.backend import SimBackend
from overlapcheck.backends.sim.timing import Profile
from overlapcheck.cli import main
from overlapcheck.commands.common import (
    DEFAULT_PRESET,
    PRESET_NAMES,
    finite_nonneg_float,
    finite_positive_float,
)
from overlapcheck.formats import counterexample
from overlapcheck.formats.profile_file import read_profile
from overlapcheck.harness.runner import run_scenario
from overlapcheck.reference.faults import parse_faults
from overlapcheck.scenarios.named import named_scenario

ROOT = Path(__file__).resolve().parents[1]
BAD_INPUT_DOC = ROOT / "docs" / "bad-input.md"


@dataclass(frozen=True)
class Case:
    """One bad input: the files it needs (name, content), the command, key words of the line."""

    id: str
    argv: tuple[str, ...]
    needles: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()
    shown: str = ""  # what docs/bad-input.md says the input is, when not the files' whole text


def _json(value: Any) -> str:
    return json.dumps(value)  # NaN and Infinity as Python writes them (json.loads reads them)


def _code(text: str) -> str:
    """`text` as a Markdown code span inside a table cell (one span per line)."""
    shown = text.replace("|", "\\|").replace("\udcff", "\\xff")
    return " ".join(f"`{part}`" for part in shown.strip().splitlines())


VALID_CEX: dict[str, Any] = {
    "format": "overlapcheck-counterexample",
    "version": 1,
    "invariant": "oracle",
    "trace_hash": "0" * 16,
    "scenario": {"requests": [{"uid": 0, "prompt": [5, 6]}]},
}


def _cex(**changes: Any) -> str:
    """A minimal valid counterexample file with `changes` on top."""
    return _json({**VALID_CEX, **changes})


def _shown_cex(changes: dict[str, Any]) -> str:
    return "a valid counterexample with " + _code(_json(changes)[1:-1])


def _scenario(request: dict[str, Any] | None = None, **top: Any) -> str:
    return _json({"requests": [{"uid": 0, "prompt": [5, 6], **(request or {})}], **top})


def _trace(message: dict[str, Any]) -> str:
    row = {"time": 0.0, "step": 0, "uid": 0, "kind": "token", "token": 5, "finished": True}
    return _json(
        {
            "format": "overlapcheck-trace",
            "version": 1,
            "trace": {"ops": [], "messages": [{**row, "reason": "", **message}], "received": []},
        }
    )


def _profile(case: str, name: str, content: str) -> Case:
    return Case(case, ("run", "--timing", name), ("timing profile",), ((name, content),))


def _request(case: str, field: str, value: Any, needles: tuple[str, ...]) -> Case:
    return Case(
        case,
        ("run", "--scenario", "s.json"),
        ("s.json", "requests[0]", field, *needles),
        (("s.json", _scenario({field: value})),),
    )


def _toml(case: str, lines: str, needles: tuple[str, ...]) -> Case:
    return Case(case, ("run", "--scenario", "s.toml"), ("s.toml", *needles), (("s.toml", lines),))


def _replay(case: str, content: str | dict[str, Any], needles: tuple[str, ...]) -> Case:
    """`replay cex.json`: the file's whole text, or a valid file with these keys changed."""
    if isinstance(content, str):
        files, shown = (("cex.json", content),), ""
    else:
        files, shown = (("cex.json", _cex(**content)),), _shown_cex(content)
    return Case(case, ("replay", "cex.json"), ("cex.json", *needles), files, shown)


NAN, INF = math.nan, math.inf
TOML_REQUEST = "[[requests]]\nuid = 3\nprompt = [5, 6]\n"

CASES = [
    # Timing profiles (--timing FILE, calibrate --check PROFILE): checked when loaded.
    _profile("profile-negative", "p.json", '{"forward": -1}'),
    _profile("profile-nan", "p.json", '{"forward": NaN}'),
    _profile("profile-infinite", "p.json", '{"launch": Infinity}'),
    _profile("profile-string", "p.json", '{"forward": "60e-6"}'),
    _profile("profile-bool", "p.json", '{"d2h": true}'),
    _profile("profile-unknown-key", "p.json", '{"fwd": 6e-05}'),
    _profile("profile-not-object", "p.json", "[1, 2]"),
    _profile("profile-nested-negative", "p.json", '{"profile": {"h2d": -6e-06}}'),
    _profile("profile-not-json", "p.json", "{forward: 1}"),
    Case("profile-missing", ("run", "--timing", "none.json"), ("none.json", "no such")),
    Case(
        "calibrate-check-profile",
        ("calibrate", "--check", "p.json"),
        ("p.json", "forward", "finite"),
        (("p.json", '{"forward": Infinity}'),),
    ),
    Case(
        "explore-timing-profile",
        ("explore", "--timing", "p.json", "--budget", "1"),
        ("p.json", "forward", ">= 0"),
        (("p.json", '{"forward": -1}'),),
    ),
    # Scenario files: each field has its type; bool is not a number and a string is not a bool.
    _request("ignore-eos-string", "ignore_eos", "false", ("true or false",)),
    _request("ignore-eos-int", "ignore_eos", 1, ("true or false",)),
    _request("max-tokens-string", "max_tokens", "3", ("expected an integer",)),
    _request("max-tokens-bool", "max_tokens", True, ("expected an integer",)),
    _request("max-tokens-float", "max_tokens", 3.0, ("expected an integer",)),
    _request("arrival-string", "arrival", "x", ("expected a number",)),
    _request("arrival-negative", "arrival", -1, (">= 0",)),
    _request("arrival-nan", "arrival", NAN, ("finite",)),
    _request("abort-at-infinite", "abort_at", INF, ("finite",)),
    _request("think-negative", "think", -0.5, (">= 0",)),
    _request("arrival-iteration-float", "arrival_iteration", 1.5, ("expected an integer",)),
    _request("prompt-string-token", "prompt", [5, "6"], ("prompt[1]", "expected an integer")),
    _request("prompt-float-token", "prompt", [5, 6.0], ("prompt[1]", "expected an integer")),
    _request("prompt-string", "prompt", "5 6", ("list of token ids",)),
    _request("continuation-bool-token", "continuation", [True], ("continuation[0]",)),
    _request("uid-string", "uid", "7", ("expected an integer",)),
    _toml("toml-max-tokens-string", TOML_REQUEST + 'max_tokens = "3"\n', ("uid 3", "max_tokens")),
    _toml("toml-max-tokens-bool", TOML_REQUEST + "max_tokens = true\n", ("uid 3", "max_tokens")),
    _toml("toml-arrival-string", TOML_REQUEST + 'arrival = "x"\n', ("uid 3", "arrival")),
    _toml("toml-abort-at-nan", TOML_REQUEST + "abort_at = nan\n", ("uid 3", "abort_at", "nan")),
    _toml("toml-config-string", '[config]\nnum_slots = "2"\n' + TOML_REQUEST, ("num_slots",)),
    _toml("toml-config-bool", "[config]\npage_size = true\n" + TOML_REQUEST, ("page_size",)),
    _toml("toml-config-float", "[config]\nnum_pages = 2.5\n" + TOML_REQUEST, ("num_pages",)),
    _toml("toml-config-loop-number", "[config]\nloop = 1\n" + TOML_REQUEST, ("loop", "string")),
    _toml("toml-not-toml", "requests = [", ("not valid TOML",)),
    Case(
        "eos-probability-string",
        ("run", "--scenario", "s.json"),
        ("eos_probability", "expected a number"),
        (("s.json", _scenario(eos_probability="0.1")),),
    ),
    Case(
        "eos-probability-nan",
        ("run", "--scenario", "s.json"),
        ("eos_probability", "nan"),
        (("s.json", _scenario(eos_probability=NAN)),),
    ),
    Case(
        "name-number",
        ("run", "--scenario", "s.json"),
        ("name", "expected a string"),
        (("s.json", _scenario(name=5)),),
    ),
    Case(
        "scenario-not-utf8",
        ("run", "--scenario", "s.json"),
        ("s.json", "cannot read"),
        (("s.json", "\udcff"),),  # written as one invalid byte
    ),
    # Counterexample files (replay FILE, timeline FILE).
    _replay("cex-not-json", "{not json", ("not valid JSON",)),
    _replay("cex-not-object", "[]", ("not an overlapcheck counterexample",)),
    _replay(
        "cex-missing-keys",
        '{"format": "overlapcheck-counterexample", "version": 1, "scenario": {}}',
        ("lacks invariant, trace_hash",),
    ),
    _replay("cex-invariant-number", dict(invariant=5), ("invariant", "expected a string")),
    _replay(
        "cex-profile-negative",
        dict(timing={"profile": {"forward": -1}}),
        ("timing.profile", "forward", ">= 0"),
    ),
    _replay(
        "cex-profile-string",
        dict(timing={"profile": {"forward": "fast"}}),
        ("timing.profile", "forward", "number"),
    ),
    _replay(
        "cex-profile-unknown",
        dict(timing={"profile": {"warp": 1.0}}),
        ("timing.profile", "unknown field warp"),
    ),
    _replay("cex-draw-negative", dict(timing={"draws": {"3": -1e-06}}), ("timing.draws[3]",)),
    _replay("cex-draw-site", dict(timing={"draws": {"x": 1e-06}}), ("timing.draws", "'x'")),
    _replay("cex-timing-list", dict(timing=[]), ("timing", "expected an object")),
    _replay(
        "cex-scenario-field",
        dict(scenario={"requests": [{"uid": 0, "prompt": [5], "ignore_eos": "false"}]}),
        ("scenario", "requests[0] (uid 0).ignore_eos", "true or false"),
    ),
    _replay("cex-faults-string", dict(faults="free-slot-early"), ("faults", "expected a list")),
    _replay("cex-skip-unknown", dict(skip=["nope"]), ("skip", "unknown invariant nope")),
    _replay("cex-invariants-unknown", dict(invariants=["bogus"]), ("unknown invariant",)),
    _replay("cex-scheduler-string", dict(scheduler="x.py:f"), ("scheduler", "expected an object")),
    Case(
        "timeline-cex-profile",
        ("timeline", "cex.json", "-o", "out.png"),
        ("cex.json", "timing.profile", "nan"),
        (("cex.json", _cex(timing={"profile": {"process": NAN}})),),
        _shown_cex({"timing": {"profile": {"process": NAN}}}),
    ),
    # Saved traces (timeline FILE).
    Case(
        "trace-finished-string",
        ("timeline", "t.json", "-o", "out.png"),
        ("t.json", "malformed trace", "finished"),
        (("t.json", _trace({"finished": "no"})),),
        "a saved trace with a message's " + _code('"finished": "no"'),
    ),
    Case(
        "trace-missing-field",
        ("timeline", "t.json", "-o", "out.png"),
        ("t.json", "malformed trace", "'uid'"),
        (("t.json", _trace({"uid": None}).replace('"uid": null, ', "")),),
        "a saved trace with a message without " + _code('"uid"'),
    ),
    # Options.
    Case("check-default-on", ("run", "--check", "no-race"), ("no-race is already on",)),
    Case("check-default-on-oracle", ("run", "--check", "oracle"), ("oracle is already on",)),
    Case(
        "check-twice",
        ("run", "--check", "bounded-wait=1", "--check", "bounded-wait=1"),
        ("bounded-wait=1", "given twice"),
    ),
    Case("check-negative-k", ("run", "--check", "bounded-wait=-1"), ("K >= 0",)),
    Case("check-unknown", ("run", "--check", "nope"), ("unknown invariant 'nope'",)),
    Case("seed-nan", ("run", "--seed", "nan"), ("--seed", "'nan'")),
    Case("seed-negative", ("run", "--seed", "-1"), ("--seed", "'-1'")),
    Case("page-size-inf", ("run", "--page-size", "inf"), ("--page-size", "'inf'")),
    Case("repeat-zero", ("replay", "x.json", "--repeat", "0"), ("--repeat", "'0'")),
    Case("preset-unknown", ("run", "--preset", "huge"), ("--preset", "invalid choice")),
    Case(
        "trace-unwritable",
        ("run", "--scenario", "basic", "--trace", "no-dir/t.json"),
        ("no-dir/t.json", "does not exist"),
    ),
    Case("trace-a-folder", ("run", "--trace", "."), ("is a folder", "trace")),
    Case(
        "timeline-format", ("run", "--timeline", "x.txt"), ("x.txt", ".png, .svg, .json, .perfetto")
    ),
    Case(
        "hb-graph-unwritable",
        ("replay", "x.json", "--hb-graph", "no-dir/g.graphml"),
        ("no-dir/g.graphml", "does not exist"),
    ),
    # Folders given as files, files given as folders.
    Case("scenario-a-folder", ("run", "--scenario", "."), ("is a folder", "scenario file")),
    Case("timing-a-folder", ("run", "--timing", "."), ("is a folder", "timing profile")),
    Case("replay-a-folder", ("replay", "."), ("is a folder", "counterexample file")),
    Case(
        "db-a-file",
        ("explore", "--db", "db", "--budget", "1"),
        ("--db db", "is a file, not a folder"),
        (("db", ""),),
    ),
    Case(
        "out-a-file",
        ("explore", "--out", "out", "--budget", "1"),
        ("--out out", "is a file, not a folder"),
        (("out", ""),),
    ),
    Case("skip-unknown", ("run", "--skip", "nope"), ("unknown invariant nope",)),
    # Sizes and times past what one run can hold: the field and the limit, before any run.
    _request("arrival-too-late", "arrival", 1e12, ("arrival must be <= 1e+06 simulated seconds",)),
    _request("arrival-iteration-too-late", "arrival_iteration", 10**8, ("<= 100,000",)),
    _toml(
        "config-max-seq-len-huge",
        "[config]\nmax_seq_len = 100000000\n" + TOML_REQUEST,
        ("max_seq_len must be <= 65,536",),
    ),
    _toml(
        "config-num-pages-huge",
        "[config]\nnum_pages = 1000000000\n" + TOML_REQUEST,
        ("num_pages x page_size must be <= 4,194,304 KV cells",),
    ),
    _toml(
        "config-slots-times-row",
        "[config]\nnum_slots = 4000\nmax_seq_len = 60000\n" + TOML_REQUEST,
        ("(num_slots + 1) x max_seq_len",),
    ),
    _toml(
        "config-fault-unknown",
        '[config]\nfaults = ["nope"]\n' + TOML_REQUEST,
        ("config.faults", "unknown fault nope"),
    ),
    Case("page-size-huge", ("run", "--page-size", "1000000000"), ("num_pages x page_size",)),
    # Ranks (docs/ranks.md): a count in 1..64, given on the command line or as num_ranks.
    Case("ranks-zero", ("run", "--ranks", "0"), ("--ranks", "positive integer")),
    Case("ranks-too-many", ("explore", "--ranks", "65"), ("--ranks", "at most 64")),
    _toml("config-rank", "[config]\nrank = 1\n" + TOML_REQUEST, ("unknown config field rank",)),
    Case("ranks-on-cpu", ("run", "--ranks", "2", "--backend", "cpu"), ("simulator only",)),
    Case(
        "timeline-unwritable",
        ("run", "--scenario", "basic", "--timeline", "no-dir/x.png"),
        ("no-dir/x.png", "does not exist"),
    ),
]


@contextmanager
def _in_folder_with(case: Case, folder: Path) -> Iterator[None]:
    """Run in `folder` with the case's files written there, so messages name relative paths."""
    before = Path.cwd()
    for name, content in case.files:
        (folder / name).write_bytes(content.encode("utf-8", "surrogateescape"))
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_and_exit_2(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _in_folder_with(case, tmp_path):
        try:
            code = main(list(case.argv))
        except SystemExit as stop:  # argparse's errors
            code = stop.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert code == 2, err
    assert not out, out  # refused before anything ran
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "overlapcheck bug" not in err
    for needle in case.needles:
        assert needle in lines[0], (needle, lines[0])


def test_a_valid_profile_with_negative_offsets_still_loads(tmp_path: Path) -> None:
    """forward_tail and d2h_queued are offsets that a calibrated GPU puts before the launch
    phase's end; the shipped H200 profile has both negative."""
    shipped = read_profile(ROOT / "docs" / "gpu-replay" / "profile-h200-tiny.json")
    assert shipped.forward_tail < 0 and shipped.d2h_queued < 0
    path = tmp_path / "p.json"
    path.write_text('{"forward": 6e-05, "forward_tail": -1e-05, "launch": 0}')
    assert read_profile(path) == Profile(forward=6e-05, forward_tail=-1e-05, launch=0.0)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-1", "x", ""])
def test_float_option_types_refuse_non_finite_and_negative(text: str) -> None:
    for parse in (finite_positive_float, finite_nonneg_float):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(text)):
            parse(text)


def test_float_option_types_take_finite_values() -> None:
    assert finite_positive_float("2.5") == 2.5 and finite_nonneg_float("0") == 0.0
    with pytest.raises(argparse.ArgumentTypeError, match="> 0"):
        finite_positive_float("0")


def test_preset_choices_are_the_engines_presets() -> None:
    weights = pytest.importorskip("overlapcheck.backends.gpu.weights")
    backend = pytest.importorskip("overlapcheck.backends.gpu.backend")
    assert tuple(weights.PRESETS) == PRESET_NAMES
    assert backend.DEFAULT_PRESET == DEFAULT_PRESET


def test_python_dash_m_overlapcheck() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "overlapcheck", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("overlapcheck "), proc.stderr


def _folder_removed_during_the_run(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """The outputs' folder is there when the run starts and gone when it ends."""
    from overlapcheck.commands import run
    from overlapcheck.harness import runner

    def run_then_remove(*args: Any, **kwargs: Any) -> Any:
        result = runner.run_scenario(*args, **kwargs)
        folder.rmdir()
        return result

    monkeypatch.setattr(run, "run_scenario", run_then_remove)


def test_a_violation_is_printed_before_a_write_that_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finding first, then each write's own error line; exit 1, since a violation was found."""
    missing = tmp_path / "no-dir"
    missing.mkdir()
    _folder_removed_during_the_run(monkeypatch, missing)
    argv = ["run", "--scenario", "abort", "--fault", "free-slot-early"]
    code = main([*argv, "--timeline", str(missing / "x.png"), "--trace", str(missing / "t.json")])
    out, err = capsys.readouterr()
    assert code == 1
    assert "VIOLATION [" in out and "FAILED (1 violation)" in out
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "cannot write the trace" in lines[0], err
    assert "x.png" in lines[1] and "does not exist" in lines[1], err


def test_run_json_comes_out_before_a_write_that_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "no-dir").mkdir()
    _folder_removed_during_the_run(monkeypatch, tmp_path / "no-dir")
    argv = ["run", "--scenario", "single-slot", "--fault", "copy-done-wrong-stream", "--json"]
    assert main([*argv, "--trace", str(tmp_path / "no-dir" / "t.json")]) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["violations"][0]["invariant"] == "no-race"
    assert len(err.strip().splitlines()) == 1 and "cannot write the trace" in err


def test_replay_prints_the_reproduced_race_before_the_hb_graph_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from overlapcheck.commands import replay

    def disk_full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(replay.nx, "write_graphml", disk_full)
    scenario = named_scenario("single-slot")
    scenario = scenario.with_config(faults=parse_faults(["copy-done-wrong-stream"]))
    result = run_scenario(scenario, SimBackend())
    assert result.violations and result.violations[0].invariant == "no-race"
    path = counterexample.save(result, Profile(), {}, tmp_path)
    assert main(["replay", str(path), "--hb-graph", str(tmp_path / "g.graphml")]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("reproduced: [no-race]")
    assert len(err.strip().splitlines()) == 1 and "g.graphml" in err


def test_an_exception_escaping_a_command_is_exit_3_not_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Python exits 1 on an uncaught exception, and 1 means a violation here."""
    from overlapcheck.commands import faults

    def broken(args: argparse.Namespace) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(faults, "main", broken)
    assert main(["faults"]) == 3
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .startswith("overlapcheck bug: RuntimeError: boom")
    )


def test_help_states_defaults_and_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{sim,cpu,cuda}" in text and "(default: sim)" in text
    assert "single-slot" in text and "(default: basic)" in text
    assert "{tiny,qwen3-0.6b}" in text and "(default: tiny)" in text
    with pytest.raises(SystemExit):
        main(["replay", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "FILE a counterexample file" in text and "(default: the one the file records)" in text


def messages() -> list[tuple[Case, str]]:
    """Each case with the line it prints (for the table of docs/bad-input.md)."""
    import contextlib
    import io

    rows = []
    for case in CASES:
        with tempfile.TemporaryDirectory() as folder, _in_folder_with(case, Path(folder)):
            err, out = io.StringIO(), io.StringIO()
            with (
                contextlib.redirect_stderr(err),
                contextlib.redirect_stdout(out),
                contextlib.suppress(SystemExit),  # argparse's errors
            ):
                main(list(case.argv))
        rows.append((case, err.getvalue().strip()))
    return rows


def _row(case: Case, line: str) -> str:
    files = case.shown or "; ".join(f"{name}: {_code(content)}" for name, content in case.files)
    return f"| {_code(' '.join(['overlapcheck', *case.argv]))} | {files} | {_code(line)} |"


def test_the_bad_input_page_lists_every_case() -> None:
    text = BAD_INPUT_DOC.read_text()
    missing = [case.id for case, line in messages() if _row(case, line) not in text]
    assert not missing, f"docs/bad-input.md's table lacks {missing}: python {__file__}"


if __name__ == "__main__":
    print("| command | input file | message (stderr; exit 2) |\n| --- | --- | --- |")
    for case, line in messages():
        print(_row(case, line))
