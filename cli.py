"""The `overlapcheck` command line.

Exit status: 0 ok, 1 a violation was found, 2 bad input (one line on stderr), 3 a bug of
overlapcheck's own (`overlapcheck bug:`, with the input saved when a run crashed).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from overlapcheck import __version__
from overlapcheck.commands import bench, calibrate, explore, faults, replay, report, run, timeline
from overlapcheck.core.errors import UserError
from overlapcheck.formats.bug_report import save_checker_bug
from overlapcheck.harness.crash import CheckerBug
from overlapcheck.harness.heap import keep_freed_heap

COMMANDS = [run, explore, replay, report, timeline, faults, bench, calibrate]


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already states it or there is
    none to state (a flag, an empty list, None: then the help says in words what happens)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    # Every subcommand's parser is one of these (add_subparsers(parser_class=...)), so the help
    # format is set here once for all of them.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="overlapcheck", description=__doc__)
    parser.add_argument("--version", action="version", version=f"overlapcheck {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    args = build_parser().parse_args(argv)
    keep_freed_heap()  # (a command's runs reuse the heap the one before freed)
    try:
        return int(args.main(args))
    except UserError as err:
        print(f"overlapcheck: error: {err}", file=sys.stderr)
        return 2
    except CheckerBug as bug:
        return _report_bug(bug, Path(getattr(args, "out", None) or "."))
    except BrokenPipeError:  # `overlapcheck run --json | head`: the reader left, not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("overlapcheck: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # anything else escaping a command is our bug
        # Python's own exit status for an uncaught exception is 1, which means "violation" here.
        traceback.print_exc()
        print(f"overlapcheck bug: {type(err).__name__}: {err}; please report it", file=sys.stderr)
        return 3


def _report_bug(bug: CheckerBug, folder: Path) -> int:
    """An exception inside overlapcheck (not the scheduler's): save the input, exit 3."""
    try:
        path = save_checker_bug(bug, folder)
    except OSError as err:
        print(f"overlapcheck bug: {bug} (could not save the input: {err})", file=sys.stderr)
        return 3
    print(
        f"overlapcheck bug: {bug}; input saved to {path} (traceback in "
        f"{path.with_suffix('.txt')}); please report it",
        file=sys.stderr,
    )
    return 3


if __name__ == "__main__":
    sys.exit(main())
