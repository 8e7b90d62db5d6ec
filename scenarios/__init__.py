"""Workloads: the `Scenario` type, a file loader, the named scenarios and Hypothesis strategies."""
