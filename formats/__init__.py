"""File formats, one owner each, read and written only: counterexamples (`counterexample.py`),
saved traces (`trace_file.py`), timing profiles (`profile_file.py`), the JSON of `run --json`
(`run_json.py`), overlapcheck's own bug reports (`bug_report.py`), and the JSON header they share
(`jsonfile.py`)."""
