"""Historical vLLM bugs, re-introduced into a copy of a 0.34.0 tree as the minimal reverse of
their upstream fix, and searched for with the vLLM adapter: does `explore` find each one, how
fast, and does its counterexample say `fixed` on the clean tree?

    python -m overlapcheck.bench.upstream_mutants [NAME ...] [--tree DIR] [--budget S]
        [--out DIR] [--clean]

`--tree` is a vLLM 0.34.0 source tree (the folder holding `vllm/`; default `VLLM_PATH`). Each
mutant is copied into `--out` (default: a temporary folder), edited, searched with `--workers 1`
and the mutant's factory, and its first counterexample replayed on the clean tree. `--clean`
runs the same searches on the unedited tree instead (expected: nothing). One search at a time:
each is a process of its own (one vLLM per process).

Each edit is (file, old, new): a few lines of vLLM's code as anchors, never more.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from overlapcheck.bench.text_edits import Edit, apply_edits

SCHEDULER = "vllm/v1/core/sched/scheduler.py"
KV_MANAGER = "vllm/v1/core/kv_cache_manager.py"
ADAPTER = "overlapcheck.adapters.vllm"



@dataclass(frozen=True, slots=True)
class Mutant:
    """One upstream bug: where it was fixed, what it did, the search that should find it, and
    the textual reverse of its fix."""

    name: str
    upstream: str  # the pull request that fixed it
    bug: str
    factory: str  # the adapter factory the search runs
    edits: tuple[Edit, ...]
    args: tuple[str, ...] = ()


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        name="max-tokens-extra-step",
        upstream="https://github.com/vllm-project/vllm/pull/27922",
        bug="async scheduling schedules one more step for a request whose step in flight "
        "already reaches max_tokens (the length check was missing)",
        factory="make_scheduler",
        edits=(
            (
                SCHEDULER,
                "            if (\n                request.num_output_placeholders > 0\n"
                "                # This is (num_computed_tokens + 1)",
                "            if (\n                False\n"
                "                and request.num_output_placeholders > 0\n"
                "                # This is (num_computed_tokens + 1)",
            ),
        ),
    ),
    Mutant(
        name="preempt-stale-output",
        upstream="https://github.com/vllm-project/vllm/pull/48245",
        bug="a request preempted with a step in flight keeps its output placeholders, and "
        "that step's output, returning after the request resumed, counts as the resumed one's",
        factory="make_pipeline_scheduler",
        edits=(
            (
                SCHEDULER,
                "        request.num_stale_output_tokens = request.num_in_flight_tokens\n"
                "        request.num_output_placeholders = 0\n"
                "        request.num_preemptions += 1\n",
                "        request.num_preemptions += 1\n",
            ),
        ),
    ),
    Mutant(
        name="rejected-drafts-placeholders",
        upstream="https://github.com/vllm-project/vllm/pull/24799",
        bug="async scheduling with drafts: rejected drafts roll num_computed_tokens back but "
        "not num_output_placeholders",
        factory="make_ngram_scheduler",
        edits=(
            (
                SCHEDULER,
                "                    if request.num_output_placeholders > 0:\n"
                "                        request.num_output_placeholders -= num_rejected\n",
                "",
            ),
        ),
    ),
    Mutant(
        name="spec-pad-past-max-model-len",
        upstream="https://github.com/vllm-project/vllm/pull/53962",
        bug="a resumed one-token decode is padded to the draft width even when the padded "
        "chunk and its sampled token do not fit in max_model_len",
        factory="make_ngram_scheduler",
        edits=(
            (
                SCHEDULER,
                "                        if (\n"
                "                            num_computed_tokens\n"
                "                            + padded_num_tokens\n"
                "                            + self.num_sampled_tokens_per_step\n"
                "                            <= self.max_model_len\n"
                "                        ):",
                "                        if True:",
            ),
        ),
    ),
    Mutant(
        name="cache-uncommitted-tokens",
        upstream="https://github.com/vllm-project/vllm/pull/20701",
        bug="allocate_slots caches blocks up to the scheduled tokens, not capped at the "
        "request's known tokens (drafts and async output placeholders included)",
        factory="make_scheduler",
        edits=(
            (
                KV_MANAGER,
                "        num_tokens_to_cache = min(\n"
                "            total_computed_tokens + num_new_tokens,\n"
                "            request.num_tokens,\n"
                "        )",
                "        num_tokens_to_cache = total_computed_tokens + num_new_tokens",
            ),
        ),
    ),
)

BY_NAME = {m.name: m for m in MUTANTS}


def apply(tree: Path, mutant: Mutant, into: Path) -> Path:
    """A copy of `tree` (its `vllm/` package) in `into` with the mutant's edits applied."""
    root = into / mutant.name
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    shutil.copytree(tree / "vllm", root / "vllm", ignore=shutil.ignore_patterns("__pycache__"))
    return apply_edits(root, mutant.edits, mutant.name)


@dataclass(slots=True)
class Outcome:
    name: str
    found: bool
    invariant: str
    seconds: float
    examples: str
    shrunk: str
    replay_clean: str  # the replay's verdict on the clean tree


def search(
    mutant: Mutant, tree: Path, clean: Path, budget: int, out: Path, extra: Sequence[str] = ()
) -> Outcome:
    """One explore of `tree` with the mutant's factory; its first counterexample replayed on
    `clean`."""
    found_at = out / f"{mutant.name}-cx"
    shutil.rmtree(found_at, ignore_errors=True)
    args = [
        "explore",
        "--scheduler",
        f"{ADAPTER}:{mutant.factory}",
        *mutant.args,
        "--budget",
        str(budget),
        "--workers",
        "1",
        "--out",
        str(found_at),
        *extra,
    ]
    began = time.monotonic()
    done = _cli(args, tree, out)
    seconds = time.monotonic() - began
    text = done.stdout + done.stderr
    (out / f"{mutant.name}.log").write_text(text)
    files = sorted(
        p for p in found_at.glob("*.json") if "perfetto" not in p.name and p.stem[:1] != "."
    )
    invariant = examples = shrunk = replay = ""
    if files:
        invariant = json.loads(files[0].read_text())["violation"]["invariant"]
        replayed = _cli(["replay", str(files[0])], clean, out)
        replay = f"exit {replayed.returncode}: " + _first(replayed.stdout, r"(fixed|identical)")
    hit = re.search(r"found after (\d+) examples", text)
    examples = hit.group(1) if hit else _first(text, r"(\d+) examples")
    small = re.search(r"shrunk to (\d+) request\(s\), (\d+) iterations", text)
    shrunk = f"{small.group(1)} req, {small.group(2)} it" if small else ""
    if done.returncode not in (0, 1):
        invariant = f"exit {done.returncode}: {text.strip().splitlines()[-1:]}"
    return Outcome(mutant.name, bool(files), invariant, seconds, examples, shrunk, replay)


def _first(text: str, pattern: str) -> str:
    hit = re.search(pattern, text)
    return hit.group(1) if hit else ""


def _cli(args: list[str], tree: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, VLLM_PATH=str(tree))
    command = [sys.executable, "-m", "overlapcheck", *args]
    return subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m overlapcheck.bench.upstream_mutants")
    parser.add_argument("names", nargs="*", help=f"mutants (default all): {', '.join(BY_NAME)}")
    parser.add_argument("--tree", default=os.environ.get("VLLM_PATH", ""))
    parser.add_argument("--budget", type=int, default=180)
    parser.add_argument("--out", default="")
    parser.add_argument("--clean", action="store_true", help="search the unedited tree instead")
    ns = parser.parse_args(argv)
    unknown = [n for n in ns.names if n not in BY_NAME]
    if unknown or not ns.tree or not (Path(ns.tree) / SCHEDULER).is_file():
        print(f"unknown mutant {unknown}" if unknown else "--tree: not a vLLM source tree")
        return 2
    tree = Path(ns.tree).resolve()
    out = Path(ns.out or tempfile.mkdtemp(prefix="upstream-mutants-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print("| mutant | upstream | found | invariant | seconds | examples | shrunk | clean replay |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in ns.names or list(BY_NAME):
        mutant = BY_NAME[name]
        target = tree if ns.clean else apply(tree, mutant, out / "trees")
        got = search(mutant, target, tree, ns.budget, out)
        print(
            f"| {got.name} | {mutant.upstream.rsplit('/', 1)[-1]} | {'yes' if got.found else 'no'}"
            f" | {got.invariant} | {got.seconds:.0f} | {got.examples} | {got.shrunk}"
            f" | {got.replay_clean} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
