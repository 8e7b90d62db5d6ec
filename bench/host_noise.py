"""How steady is the host? A launch-bound engine runs at the host's speed, so calibration is only
as good as that speed is steady between `calibrate` and the runs it predicts.

    python -m overlapcheck.bench.host_noise [--backend cuda] [--scenario basic] [--runs 40]
        [--pin CPUS] [--no-gc]

Runs one named scenario (overlap loop) `--runs` times back to back and prints, per block of five
runs, the median launch phase and mean iteration, then their spread over the whole series.
`--pin 2,3` pins the process (and the driver threads it starts) to those CPUs; `--no-gc` turns
Python's cyclic garbage collector off during the runs: two suspects for a drifting host.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time

from overlapcheck.backends.gpu.backend import make_torch_backend
from overlapcheck.core.trace import HOST, Trace
from overlapcheck.harness.runner import run_scenario
from overlapcheck.scenarios.named import NAMED, named_scenario

BLOCK = 5


def launch_phases(trace: Trace) -> list[float]:
    return [
        op.end - op.start
        for op in trace.ops
        if op.agent == HOST
        and op.kind == "span"
        and op.label == "launch"
        and op.start is not None
        and op.end is not None
    ]


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=10)
    ratio = max(values) / min(values)
    return f"median {q[4]:.0f}, p10 {q[0]:.0f}, p90 {q[8]:.0f}, max/min {ratio:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--scenario", default="basic", choices=NAMED)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--pin", default=None, help="comma-separated CPU ids")
    parser.add_argument("--no-gc", action="store_true")
    args = parser.parse_args()
    if args.runs < 2 * BLOCK:
        parser.error(f"--runs must be at least {2 * BLOCK}")
    if args.pin:
        os.sched_setaffinity(0, {int(c) for c in args.pin.split(",")})
    backend = make_torch_backend(args.backend)
    scenario = named_scenario(args.scenario).with_config(loop="overlap")
    run_scenario(scenario, backend, [])  # warm-up: kernels compile, caches fill
    if args.no_gc:
        gc.disable()
    launches: list[float] = []
    iterations: list[float] = []
    began = time.perf_counter()
    for i in range(args.runs):
        result = run_scenario(scenario, backend, [])
        if backend.device is not None:
            backend.device.finish()
        launches.append(statistics.median(launch_phases(result.trace)) * 1e6)
        iterations.append(result.simulated_seconds / max(1, result.iterations) * 1e6)
        if (i + 1) % BLOCK == 0:
            block = slice(i + 1 - BLOCK, i + 1)
            print(
                f"runs {i + 2 - BLOCK:>3}-{i + 1:<3} at {time.perf_counter() - began:6.1f} s: "
                f"launch {statistics.median(launches[block]):6.0f} µs, "
                f"iteration {statistics.median(iterations[block]):6.0f} µs"
            )
    gc.enable()
    print(f"launch phase µs (per-run medians): {spread(launches)}")
    print(f"mean iteration µs: {spread(iterations)}")


if __name__ == "__main__":
    main()
