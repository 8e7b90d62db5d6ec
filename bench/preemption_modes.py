"""The reference scheduler's preemption modes, as `bench --reliability --mode` names them: how it
makes room (none, recompute, swap) and when (vLLM's `allocation-failure`, SGLang's
`retract-decode`), pages taken on demand whenever it preempts.
"""

from __future__ import annotations

from typing import NamedTuple

from overlapcheck.core.config import PREEMPT_POLICIES, PreemptionKind, PreemptPolicy
from overlapcheck.core.errors import UserError
from overlapcheck.core.scenario import Scenario


class PreemptionMode(NamedTuple):
    preemption: PreemptionKind
    policy: PreemptPolicy = "allocation-failure"

    @property
    def name(self) -> str:
        return "none" if self.preemption == "none" else f"{self.preemption}/{self.policy}"

    def pin(self, scenario: Scenario) -> Scenario:
        """`scenario` with this mode, whatever the generator drew (speculation stays as drawn)."""
        if self.preemption == "none":
            return scenario.with_config(preemption="none", page_alloc="reserve")
        return scenario.with_config(
            preemption=self.preemption, page_alloc="on-demand", preempt_policy=self.policy
        )


KINDS: tuple[PreemptionKind, ...] = ("recompute", "swap")
MODES: tuple[PreemptionMode, ...] = (
    PreemptionMode("none"),
    *(PreemptionMode(kind, policy) for kind in KINDS for policy in PREEMPT_POLICIES),
)
ALL = "all"
NAMES = tuple(m.name for m in MODES)


def parse_modes(names: list[str]) -> list[PreemptionMode]:
    """The modes named (`all`: every one), in the order of `MODES`, each once."""
    unknown = sorted(set(names) - {*NAMES, ALL})
    if unknown:
        raise UserError(f"--mode {unknown[0]}: not a preemption mode ({', '.join(NAMES)}, all)")
    return [m for m in MODES if ALL in names or m.name in names]
