"""Schedulers written against the protocol (`core/protocol.py`), shipped in the package so that a
wheel install can check them by module (`--scheduler overlapcheck.examples.minimal_scheduler:
make_scheduler`) or copy one to start from: `minimal_scheduler` (the smallest correct one),
`upstream_overlap` (mini-sglang's overlap loop, its known bugs included), `ondemand_scheduler`
(pages on demand, preemption)."""
