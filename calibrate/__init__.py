"""Calibrating the simulator against a GPU: measuring a real engine's latencies (`gpu.py`) and
fitting the simulator's timing profile to them (`fit.py`). Above the harness."""
