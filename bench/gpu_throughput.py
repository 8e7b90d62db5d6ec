"""Decode throughput and engine-stream idle share, overlap loop vs normal loop, on the real engine.

    python -m overlapcheck.bench.gpu_throughput [--preset qwen3-0.6b] [--batch 1 8 32] [--eager]

Per batch size B: B requests (prompt 32 tokens, 128 output tokens, EOS ignored) arrive at once;
both loops run the same workload with no invariants attached (the checker's own host time is not
the scheduler's). From the trace's CUDA-event times:

* decode tokens/s over the decode phase (first decode forward's start to the last one's end);
* idle share: the engine stream's gaps between consecutive decode forwards over that span;
* T_gpu (mean decode forward) and T_cpu (mean host time per decode step: the schedule, launch and
  process spans minus their blocking waits); the overlap loop's speed-up is bounded by
  T_serial / max(T_gpu, T_cpu) with T_serial = T_gpu + T_cpu.

Also FlashInfer's first-use (JIT compile) time of its prefill and decode kernels.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from typing import Any

import torch

from overlapcheck.backends.gpu.backend import TorchBackend, make_torch_backend
from overlapcheck.backends.gpu.engine import Engine
from overlapcheck.core.batch import BatchInput, Phase, SeqWork
from overlapcheck.core.config import LoopKind, SchedulerConfig
from overlapcheck.core.scenario import RequestSpec, Scenario
from overlapcheck.core.trace import HOST, Trace
from overlapcheck.harness.runner import run_scenario

PROMPT, OUTPUT, PAGE = 32, 128, 16


def workload(batch: int, loop: LoopKind) -> Scenario:
    cfg = SchedulerConfig(
        num_slots=batch,
        num_pages=batch * (PROMPT + OUTPUT) // PAGE + batch,
        page_size=PAGE,
        max_extend_tokens=batch * PROMPT,
        max_seq_len=256,
        loop=loop,
    )
    reqs = tuple(
        RequestSpec(
            u,
            tuple(3 + (u * 131 + 7 * i) % 997 for i in range(PROMPT)),
            max_tokens=OUTPUT,
            ignore_eos=True,
        )
        for u in range(batch)
    )
    return Scenario(f"decode-b{batch}", cfg, reqs)


def measure(trace: Trace) -> dict[str, float]:
    fwd = sorted(
        (
            op
            for op in trace.ops
            if op.agent == "engine"
            and op.kind == "forward"
            and op.label.startswith("D")
            and op.start is not None
            and op.end is not None
        ),
        key=lambda op: op.start or 0.0,
    )
    span = (fwd[-1].end or 0.0) - (fwd[0].start or 0.0)
    gaps = [max(0.0, (b.start or 0.0) - (a.end or 0.0)) for a, b in itertools.pairwise(fwd)]
    steps = {op.step for op in fwd}
    host = [op for op in trace.ops if op.agent == HOST and op.step in steps]
    busy = sum(
        (op.end or 0.0) - (op.start or 0.0)
        for op in host
        if op.kind == "span" and op.label in ("schedule", "launch", "process")
    )
    waits = sum((op.end or 0.0) - (op.start or 0.0) for op in host if op.kind == "host_wait")
    return {
        "tokens_per_s": sum(len(op.uids) for op in fwd) / span,
        "idle_share": sum(gaps) / span,
        "t_gpu_ms": 1e3 * statistics.mean((op.end or 0.0) - (op.start or 0.0) for op in fwd),
        "t_cpu_ms": 1e3 * (busy - waits) / len(steps),
        "decode_steps": len(fwd),
    }


def compile_times(backend: TorchBackend) -> dict[str, float]:
    """Seconds for the first and second plan+run of FlashInfer prefill and decode."""
    cfg = SchedulerConfig(num_slots=1, num_pages=4, page_size=PAGE, max_seq_len=64)
    engine = Engine(backend.model, cfg, flashinfer=True)
    out: dict[str, float] = {}
    shapes: tuple[tuple[Phase, int, int], ...] = (("prefill", 0, 8), ("decode", 8, 9))
    for phase, start, end in shapes:
        for attempt in ("first", "second"):
            seq = SeqWork(0, 0, start, end, 0, end, tuple(range(end)))
            batch = BatchInput(1, phase, (seq,))
            t = time.perf_counter()
            engine.plan(batch, [None])
            engine.run(batch, [None])
            torch.cuda.synchronize()
            out[f"{phase}_{attempt}_s"] = time.perf_counter() - t
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m overlapcheck.bench.gpu_throughput")
    p.add_argument("--backend", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--preset", default="qwen3-0.6b")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--eager", action="store_true", help="no CUDA graphs for decode")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    cuda = args.backend == "cuda"
    graphs = args.batch if cuda and not args.eager else []
    t = time.perf_counter()
    backend = make_torch_backend(args.backend, preset=args.preset, oracle=False, graph_sizes=graphs)
    results: dict[str, Any] = {
        "preset": args.preset,
        "graphs": bool(graphs),
        "load_s": time.perf_counter() - t,
    }
    if cuda:
        results["flashinfer"] = compile_times(backend)
        shown = ", ".join(f"{k} {v:.2f}" for k, v in results["flashinfer"].items())
        print(f"FlashInfer first use: {shown}")
    print(f"{'batch':>5} {'loop':>8} {'tok/s':>9} {'idle':>6} {'T_gpu ms':>9} {'T_cpu ms':>9}")
    for b in args.batch:
        row: dict[str, Any] = {}
        loops: tuple[LoopKind, ...] = ("normal", "overlap")
        for loop in loops:
            run_scenario(workload(b, loop), backend, invariants=[])  # warm-up: allocator, caches
            result = run_scenario(workload(b, loop), backend, invariants=[])
            m = row[loop] = measure(result.trace)
            row[loop]["distinct_tokens_uid0"] = len(set(result.outcomes[0].tokens))
            print(
                f"{b:>5} {loop:>8} {m['tokens_per_s']:>9.0f} {m['idle_share']:>6.1%} "
                f"{m['t_gpu_ms']:>9.3f} {m['t_cpu_ms']:>9.3f}"
            )
        n = row["normal"]
        bound = (n["t_gpu_ms"] + n["t_cpu_ms"]) / max(n["t_gpu_ms"], n["t_cpu_ms"])
        row["speedup"] = row["overlap"]["tokens_per_s"] / n["tokens_per_s"]
        row["speedup_bound"] = bound
        print(
            f"{b:>5} overlap speed-up {row['speedup']:.2f}x (bound T_serial/max(T_gpu, T_cpu) "
            f"= {bound:.2f}x)"
        )
        results[f"batch{b}"] = row
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
