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
  Without scripted EOS, the model's own EOS id is used. Where no candidate makes every scripted
  request stop exactly where its script says (the token at k also comes earlier in the model's
  output), the prompts are mapped again with another offset, up to `OFFSETS` of them, and the
  first mapping that does is taken (else the best): a replay whose requests stop elsewhere runs
  another schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from overlapcheck.core.config import SchedulerConfig
from overlapcheck.core.rules import max_output, rejection
from overlapcheck.core.scenario import RequestSpec, Scenario, user_msg

Greedy = Callable[[tuple[int, ...], int], list[int]]


POSITION_SHIFT = 37  # odd: coprime with a power-of-two vocabulary, so positions shift apart
OFFSETS = 16  # prompt mappings tried for exact scripted stops
OFFSET_STEP = 101  # between two tried mappings (prime: the offsets spread over the vocabulary)


def map_prompt(
    prompt: tuple[int, ...], scenario_vocab: int, model_vocab: int, offset: int = 0
) -> tuple[int, ...]:
    def one(position: int, t: int) -> int:
        if 0 <= t < scenario_vocab:
            return (t + offset + POSITION_SHIFT * position) % model_vocab
        return t if t < 0 else model_vocab + (t - scenario_vocab)  # still out of range

    return tuple(one(i, t) for i, t in enumerate(prompt))


def fit_scenario(scenario: Scenario, model_vocab: int, model_eos: int, greedy: Greedy) -> Scenario:
    cfg = scenario.config
    targets = {
        s.uid: s.continuation.index(cfg.eos_token_id)
        for s in scenario.requests
        if cfg.eos_token_id in s.continuation and not s.ignore_eos
    }
    best: tuple[tuple[int, int, int], Scenario] | None = None
    for k in range(OFFSETS if targets else 1):
        specs = tuple(
            replace(
                s,
                prompt=map_prompt(s.prompt, cfg.vocab_size, model_vocab, k * OFFSET_STEP),
                continuation=(),
            )
            for s in scenario.requests
        )
        fitted = replace(cfg, vocab_size=model_vocab, eos_token_id=model_eos % model_vocab)
        if not targets:
            return replace(scenario, config=fitted, requests=specs)
        outputs = _outputs(specs, fitted, greedy)
        eos = choose_eos(outputs, targets)
        if eos is not None:
            fitted = replace(fitted, eos_token_id=eos)
        score = _score(fitted.eos_token_id, outputs, targets)
        if best is None or score > best[0]:
            best = (score, replace(scenario, config=fitted, requests=specs))
        if score[0] == len(targets):
            break
    assert best is not None
    return best[1]


def _outputs(
    specs: tuple[RequestSpec, ...], config: SchedulerConfig, greedy: Greedy
) -> dict[int, list[int]]:
    return {s.uid: out for s in specs if not s.ignore_eos and (out := _generate(config, s, greedy))}


def _score(
    token: int, outputs: dict[int, list[int]], targets: dict[int, int]
) -> tuple[int, int, int]:
    """Scripted requests that stop exactly where their script says with `token` as EOS; then
    those that stop early at all; then (negated) the unscripted ones that stop."""
    exact = early = stray = 0
    for uid, out in outputs.items():
        first = out.index(token) if token in out else None
        if uid in targets:
            exact += first == targets[uid]
            early += first is not None
        else:
            stray += first is not None
    return exact, early, -stray


def choose_eos(outputs: dict[int, list[int]], targets: dict[int, int]) -> int | None:
    """The EOS id that scores best (`_score`) among the tokens at the scripted positions."""
    candidates = sorted(
        {outputs[u][k] for u, k in targets.items() if u in outputs and k < len(outputs[u])}
    )
    return max(candidates, key=lambda t: _score(t, outputs, targets)) if candidates else None


def _generate(config: SchedulerConfig, spec: RequestSpec, greedy: Greedy) -> list[int] | None:
    msg = user_msg(spec)
    if rejection(config, msg, live=False) is not None:
        return None
    return greedy(spec.prompt, max_output(config, msg))
