"""Search (Hypothesis), counterexamples, replay."""
