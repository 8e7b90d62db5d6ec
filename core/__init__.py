"""The scheduler under test: plain Python, no torch and no simpy.

Backends implement :class:`overlapcheck.core.device.Device`; everything in this package talks to the
accelerator only through that seam.
"""
