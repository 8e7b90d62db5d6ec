"""File formats, one owner: trace files, counterexample files, and the JSON header they share."""
