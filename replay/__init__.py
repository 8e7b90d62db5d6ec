"""Replaying a counterexample: on the simulator (`sim.py`, exact), on a real engine with the
recorded delays and gates forcing the racy order (`gpu.py`, planned by `plan.py`; speculative
steps drafted to the recorded acceptance, `drafts.py`), mini-sglang's own scheduler on a GPU
(`minisgl_gpu.py`), and a GPU replay's repeats over a Ray cluster (`ray.py`). Above the harness;
what a replay prints and its exit status are the command's (`commands/replay.py`)."""
