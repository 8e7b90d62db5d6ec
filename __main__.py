"""`python -m overlapcheck`: the same command line as the `overlapcheck` script."""

from __future__ import annotations

import sys

from overlapcheck.entry import main

sys.exit(main())
