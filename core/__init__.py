"""The contract between a scheduler under test and overlapcheck: plain Python, no torch and no
simpy. The device seam (`device.py`), the trace and its footprints, batches, messages, the
configuration, the rules every scheduler is held to, and the scheduler-under-test protocol; and
the evidence the checks judge by: the KV shadow (`kv_shadow.py`), expected outputs
(`expected.py`), units (`units.py`).

Backends implement :class:`overlapcheck.core.device.Device`; a scheduler talks to the accelerator
only through that seam.
"""
