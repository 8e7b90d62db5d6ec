"""Work that orchestrates whole runs on the backends: replaying a counterexample on a GPU and
calibrating the simulator against one. Above the harness; nothing below imports it."""
