"""Fit a scenario written for the simulator to a real model.

* Prompt ids map into the model's vocabulary (ids outside the scenario's vocabulary stay outside,
  so requests meant to be rejected still are), each position shifted by its own offset. A shrunk
  counterexample's prompt is often one id repeated, and a random model answers a constant context
  with a constant: an overwritten prompt token then changes no output, and the oracle cannot see
  the race. The shift keeps what the cache matches on (equal prefixes stay equal, different ids
  at one position stay different) while no two positions hold the same token.
* Scripted continuations cannot steer a real model. Where a scenario scripts an EOS at position k
  of a request, the EOS id becomes a token of the reference's own greedy output: the candidate
  `greedy[k]` of some scripted request that makes the most scripted requests stop exactly where
  their script says (then the most stop early at all, then the fewest unscripted ones stop).
  Without scripted EOS, the model's own EOS id is used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.scenario import RequestSpec, Scenario, user_msg

Greedy = Callable[[tuple[int, ...], int], list[int]]


POSITION_SHIFT = 37  # odd: coprime with a power-of-two vocabulary, so positions shift apart


def map_prompt(prompt: tuple[int, ...], scenario_vocab: int, model_vocab: int) -> tuple[int, ...]:
    def one(position: int, t: int) -> int:
        if 0 <= t < scenario_vocab:
            return (t + POSITION_SHIFT * position) % model_vocab
        return t if t < 0 else model_vocab + (t - scenario_vocab)  # still out of range

    return tuple(one(i, t) for i, t in enumerate(prompt))


def fit_scenario(scenario: Scenario, model_vocab: int, model_eos: int, greedy: Greedy) -> Scenario:
    cfg = scenario.config
    specs = tuple(
        replace(s, prompt=map_prompt(s.prompt, cfg.vocab_size, model_vocab), continuation=())
        for s in scenario.requests
    )
    fitted = replace(cfg, vocab_size=model_vocab, eos_token_id=model_eos % model_vocab)
    targets = {
        s.uid: s.continuation.index(cfg.eos_token_id)
        for s in scenario.requests
        if cfg.eos_token_id in s.continuation and not s.ignore_eos
    }
    if targets:
        eos = choose_eos(specs, targets, lambda s: _generate(fitted, s, greedy))
        if eos is not None:
            fitted = replace(fitted, eos_token_id=eos)
    return replace(scenario, config=fitted, requests=specs)


def choose_eos(
    specs: tuple[RequestSpec, ...],
    targets: dict[int, int],
    generate: Callable[[RequestSpec], list[int] | None],
) -> int | None:
    outputs = {s.uid: out for s in specs if not s.ignore_eos and (out := generate(s)) is not None}
    candidates = sorted(
        {outputs[u][k] for u, k in targets.items() if u in outputs and k < len(outputs[u])}
    )

    def score(token: int) -> tuple[int, int, int]:
        exact = early = stray = 0
        for uid, out in outputs.items():
            first = out.index(token) if token in out else None
            if uid in targets:
                exact += first == targets[uid]
                early += first is not None
            else:
                stray += first is not None
        return exact, early, -stray

    return max(candidates, key=score) if candidates else None


def _generate(config: SchedulerConfig, spec: RequestSpec, greedy: Greedy) -> list[int] | None:
    msg = user_msg(spec)
    if rejection(config, msg, live=False) is not None:
        return None
    return greedy(spec.prompt, max_output(config, msg))
