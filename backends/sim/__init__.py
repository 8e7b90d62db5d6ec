"""The SimPy GPU model: streams, events, copy engines, a compute unit, a host clock, a toy model."""
