"""Issue-7 measurements on a GPU, in three phases (each fits one device command):

    python -m overlapcheck.bench.gpu_replay calibrate --out DIR      # profile.json + fidelity table
    python -m overlapcheck.bench.gpu_replay search --out DIR         # one counterexample per fault
    python -m overlapcheck.bench.gpu_replay replay --out DIR --repeat 20   # fault on / fault off
    python -m overlapcheck.bench.gpu_replay replay --cex docs/gpu-replay --speculative  # those only

`search` uses DIR/profile.json when it exists, so the delays it draws are on the GPU's own scale.
Races are searched with `no-race` skipped, so that each counterexample is one where the race
corrupted tokens (an `oracle` failure): that is what a GPU replay can show happening.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from overlapcheck.backends.sim.timing import Profile
from overlapcheck.explore.search import SearchSpec, search
from overlapcheck.formats import counterexample
from overlapcheck.formats.profile_file import read_profile
from overlapcheck.harness.revision import git_revision
from overlapcheck.reference.faults import FAULTS

if TYPE_CHECKING:
    from overlapcheck.replay.gpu import Verdict

RACE_FAULTS = {"chunk-sample-overwrite", "staging-buffer-reuse", "copy-done-wrong-stream"}
# Speculative faults whose finding is a race (their counterexamples show `no-race` first).
SPEC_RACE_FAULTS = {"resolve-unordered", "reads-done-early", "free-row-in-verify"}


def gate_states(verdicts: list[Verdict]) -> str:
    """How the gates of a replay's repeats ended, counted: `(gate forced 20)`; empty without."""
    counts = Counter(g.state for v in verdicts for g in v.gates)
    return f"(gate {', '.join(f'{s} {n}' for s, n in sorted(counts.items()))})" if counts else ""


def phase_calibrate(out: Path, backend_name: str, preset: str | None) -> None:
    from overlapcheck.backends.gpu.backend import make_torch_backend
    from overlapcheck.calibrate.gpu import calibrate, check

    backend = make_torch_backend(backend_name, preset=preset)  # reference: maps scripted EOS
    fitted = calibrate(backend, out / "profile.json")
    print(json.dumps(fitted.profile.as_dict(), indent=1))
    print(f"held each stream op {fitted.hold * 1e3:.1f} ms for device times; {fitted.summary()}")
    check(backend, fitted.profile, traces=out / "traces", say=print)


def phase_search(out: Path, budget: float, faults: list[str]) -> None:
    profile_path = out / "profile.json"
    profile = read_profile(profile_path) if profile_path.exists() else Profile()
    for name in faults:
        # (the real engine keeps no KV shadow: a GPU counterexample fails a check it can run)
        skip = frozenset({"no-race", "kv-provenance"} if name in RACE_FAULTS else {"kv-provenance"})
        spec = SearchSpec(faults=frozenset([name]), budget=budget, profile=profile, skip=skip)
        result = search(spec)
        if result.found is None:
            print(f"{name}: not found in {result.stats.examples} examples")
            continue
        path = counterexample.save(
            result.found.result, profile, result.found.draws, out / "cex", skip, git=git_revision()
        )
        path.rename(out / "cex" / f"{name}.json")
        v = result.found.result.violations[0]
        print(f"{name}: {v.line()}")


def phase_replay(
    cex_dir: Path, repeat: int, backend_name: str, preset: str | None, faults: list[str]
) -> None:
    from overlapcheck.backends.gpu.backend import make_torch_backend
    from overlapcheck.replay.gpu import replay_verdicts

    backend = make_torch_backend(backend_name, preset=preset)
    if backend_name == "cuda":
        print(f"torch.cuda._sleep: {backend.sleep_rate / 1e9:.3f} G cycles/s")
    rows = []
    for name in faults:
        path = cex_dir / f"{name}.json"
        if not path.exists():
            continue
        cex = counterexample.load(path)
        plan, on = replay_verdicts(cex, backend, repeat)
        _, off = replay_verdicts(cex, backend, repeat, cex.without_faults())
        clean = sum(v.clean for v in off)
        hits = sum(v.reproduced for v in on)
        how = "gate" if plan.gates else f"{len(plan.sleeps)} sleeps"
        rows.append((name, cex.invariant, how, gate_states(on), hits, clean, gate_states(off)))
        followed = ""
        if cex.scenario.config.draft_tokens:
            kept = sum(v.off_record == 0 for v in on)
            followed = f", drafts on the recorded steps in {kept}/{repeat}"
        print(
            f"{name}: {cex.invariant} reproduced {hits}/{repeat} {gate_states(on)}, fault off "
            f"clean {clean}/{repeat} {gate_states(off)}{followed}",
            flush=True,
        )
        for v in on[:1] + off[:1]:
            print(f"   e.g. {v.to_json()}")
    print()
    print("| fault | invariant | order by | fault on: reproduced | fault off: clean |")
    print("| --- | --- | --- | --- | --- |")
    for name, inv, how, on_states, hits, clean, off_states in rows:
        print(
            f"| `{name}` | `{inv}` | {how} | {hits}/{repeat} {on_states} "
            f"| {clean}/{repeat} {off_states} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phase", choices=("calibrate", "search", "replay"))
    parser.add_argument("--out", default="gpu-replay")
    parser.add_argument("--backend", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--preset", default=None)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--fault", action="append", choices=FAULTS, help="only these")
    parser.add_argument("--cex", default=None, help="replay: the folder of files (DIR/cex)")
    parser.add_argument(
        "--speculative", action="store_true", help="only the speculative race faults"
    )
    args = parser.parse_args()
    faults = args.fault or (sorted(SPEC_RACE_FAULTS) if args.speculative else list(FAULTS))
    out = Path(args.out)
    (out / "cex").mkdir(parents=True, exist_ok=True)
    if args.phase == "calibrate":
        phase_calibrate(out, args.backend, args.preset)
    elif args.phase == "search":
        phase_search(out, args.budget, faults)
    else:
        cex_dir = Path(args.cex) if args.cex else out / "cex"
        phase_replay(cex_dir, args.repeat, args.backend, args.preset, faults)


if __name__ == "__main__":
    main()
