"""`python -m overlapcheck` and the `overlapcheck` script: a fixed string-hash seed, then the
command line (`cli.py`).

Python draws each process's string-hash seed at start unless `PYTHONHASHSEED` gives one. A
scheduler whose order follows string hashes (a `set` of request-id strings iterated into a
batch) would then run one way in the search that found its bug and another in the replay that
confirms the fix. So the command, given no seed, starts itself again with `PYTHONHASHSEED=0`,
before anything heavy is imported (an interpreter's start: `overlapcheck faults` took 1.91 s for
1.83 s on the loaded 2-core machine); ranks 1.. take theirs
from it (`harness/rank_processes.py`). A seed the caller gives, `random` included, is kept.
"""

from __future__ import annotations

import os
import sys
from contextlib import suppress


def main() -> int:
    """The console script and `python -m overlapcheck`."""
    if "PYTHONHASHSEED" not in os.environ and sys.orig_argv:
        os.environ["PYTHONHASHSEED"] = "0"
        with suppress(OSError):  # if it cannot start again, it runs with this one's seed
            os.execv(sys.executable, sys.orig_argv)
    from overlapcheck.cli import main as command_line

    return command_line()


if __name__ == "__main__":
    sys.exit(main())
