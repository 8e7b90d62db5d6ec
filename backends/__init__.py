"""Backends implementing the device seam: `sim` (SimPy GPU model) and `gpu` (torch)."""
