"""Backends implementing the device seam: `sim/` (the SimPy GPU model), `gpu/` (the real engine in
torch: CUDA with two streams, or the CPU), and `torchsim/` (a simulated CUDA under which real torch
code, such as an upstream engine's scheduler, runs on the SimPy model). Beside them: the `Backend`
protocol (`base.py`), the backends by name (`registry.py`), delay plans and gates for forcing an
order on a GPU (`delays.py`, `gates.py`)."""
