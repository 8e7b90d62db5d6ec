"""The built-in reference scheduler: one implementation of the scheduler-under-test protocol.

It carries every known upstream fix, each at one spot a named fault (`faults.py`) turns back off.
Its KV pages (the allocator and the naive and radix prefix caches) are in `cache/`.
Nothing in the checker depends on it except as the default scheduler.
"""
