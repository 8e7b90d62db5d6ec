"""Timelines of a trace: Chrome Trace Event JSON (Perfetto) and PNG/SVG pictures (matplotlib)."""
