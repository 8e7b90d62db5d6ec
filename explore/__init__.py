"""The search: Hypothesis over workloads, configurations and timings (`search.py`), on worker
processes (`parallel.py`) or Ray (`ray_search.py`), shrinking a failure by workload passes
(`reduce.py`), keeping what it found on disk before shrinking (`keeper.py`), and resuming from a
saved example database (`resume.py`). Replays live in `replay/`."""
