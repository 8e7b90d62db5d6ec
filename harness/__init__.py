"""The harness: run a scenario with a scheduler under test on a backend and check it.

`runner` runs a scenario and holds its result; `stepping` steps the scheduler, wraps its message
source and sink, and runs the checks deferred to after the run; `crash` tells whose exception it
is; `scheduler_spec` names and loads the scheduler under test; `revision` reads the git revision.
"""
