"""Units of time: every clock in overlapcheck (simulated or measured) counts seconds."""

from __future__ import annotations

US = 1e-6  # one microsecond
