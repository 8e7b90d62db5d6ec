"""overlapcheck: a model checker for LLM-serving schedulers that use overlap scheduling."""

__version__ = "0.1.0"
