"""Checks over a run: messages, slots, pages, races (happens-before), the oracle, liveness."""
