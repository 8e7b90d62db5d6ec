"""The simulator as a backend: a SimDevice, and the toy model run on each request alone as the
oracle."""

from __future__ import annotations

from overlapcheck.backends.sim.device import SimDevice
from overlapcheck.backends.sim.timing import Timing
from overlapcheck.backends.sim.toy_model import ToyModel
from overlapcheck.core.expected import ExactTokens
from overlapcheck.core.kv_shadow import KvShadow
from overlapcheck.core.scenario import RequestSpec, Scenario


class SimBackend:
    """The simulated GPU: simulated time, so the checks run online and a step is watched."""

    name = "sim"
    checks_online = True
    watchdog_by_default = True
    small_run_objects = True

    def __init__(self, timing: Timing | None = None) -> None:
        self.timing = timing if timing is not None else Timing()
        self.model: ToyModel | None = None
        self.device: SimDevice | None = None

    def prepare(self, scenario: Scenario) -> Scenario:
        return scenario  # the toy model runs any scenario as written

    def make_device(self, scenario: Scenario) -> SimDevice:
        return self._device(scenario, None)

    def make_shadowed_device(self, scenario: Scenario, shadow: KvShadow) -> SimDevice:
        return self._device(scenario, shadow)

    def _device(self, scenario: Scenario, shadow: KvShadow | None) -> SimDevice:
        cfg = scenario.config
        self.model = ToyModel(
            cfg.vocab_size,
            cfg.eos_token_id,
            seed=cfg.seed,
            eos_probability=scenario.eos_probability,
        )
        for spec in scenario.requests:
            if spec.continuation:
                self.model.add_script(spec.prompt, spec.continuation)
        self.device = SimDevice(cfg, self.model, self.timing, shadow)
        return self.device

    def expected(self, spec: RequestSpec, max_tokens: int) -> ExactTokens:
        assert self.model is not None, "make_device first"
        return ExactTokens(self.model.generate(spec.prompt, max_tokens, spec.ignore_eos))
