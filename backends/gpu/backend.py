"""The real engine as a runner backend.

`overlapcheck run --backend cpu|cuda [--model PATH | --preset NAME] [--sanitize]`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from typing import Any

import torch
from transformers import PretrainedConfig

from overlapcheck.backends.gpu.device import DevicePlan, TorchDevice
from overlapcheck.backends.gpu.engine import Engine
from overlapcheck.backends.gpu.model import DecoderModel
from overlapcheck.backends.gpu.oracle import BF16_LOGIT_MARGIN, HFOracle, TeacherForcing
from overlapcheck.backends.gpu.prepare import fit_scenario
from overlapcheck.backends.gpu.sanitizer import Sanitizer
from overlapcheck.backends.gpu.sleep import sleep_cycles_per_second
from overlapcheck.backends.gpu.weights import (
    ModelSpec,
    load_checkpoint,
    preset_config,
    random_weights,
)
from overlapcheck.core.errors import UserError
from overlapcheck.core.expected import ExactTokens, Expected
from overlapcheck.core.messages import SamplingParams
from overlapcheck.core.scenario import RequestSpec, Scenario

DEFAULT_PRESET = "tiny"


class _AnyToken:
    """No oracle (benchmarks): every token matches."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def matches(self, position: int, token: int) -> bool:
        return True


class _WithinMargin:
    """bf16: each token within a logit margin of the oracle's argmax under teacher forcing."""

    def __init__(self, tokens: list[int], forcing: TeacherForcing, margin: float) -> None:
        self.tokens = tokens
        self.forcing = forcing
        self.margin = margin

    def matches(self, position: int, token: int) -> bool:
        if position != len(self.forcing.deficits):
            return False  # tokens arrive in order; a gap is a lost or repeated message
        return self.forcing.accept(token) <= self.margin


class TorchBackend:
    """One model (weights loaded once), a fresh device per run, HF as the oracle.

    `oracle=False` skips the oracle (benchmarks): `expected` is then empty and every token
    matches, so run without the `oracle` invariant. `graph_sizes` captures CUDA graphs for greedy
    decode batches of those sizes on every new device.
    """

    # A real engine: its timing is real (checks after the run), its first forward compiles (no
    # watchdog unless asked), its runs hold device memory (harness/runner.py).
    checks_online = False
    watchdog_by_default = False
    small_run_objects = False

    def __init__(
        self,
        name: str,
        hf_config: PretrainedConfig,
        tensors: dict[str, torch.Tensor],
        device: torch.device,
        dtype: torch.dtype,
        *,
        sanitize: bool = False,
        oracle: bool = True,
        graph_sizes: Iterable[int] = (),
        margin: float = BF16_LOGIT_MARGIN,
    ) -> None:
        self.name = name
        self.spec = ModelSpec.from_config(hf_config)
        self.model = DecoderModel(self.spec, tensors, device, dtype)
        self.exact = dtype == torch.float32
        self.margin = margin
        self.oracle = HFOracle(hf_config, tensors, device) if oracle else None
        self.sanitizer = Sanitizer() if sanitize else None
        self.graph_sizes = tuple(graph_sizes)
        self.sampling: dict[int, SamplingParams] = {}
        self._no_gates: str | None = None  # why this backend cannot gate, once tried
        # torch.cuda._sleep cycles per second, for delays given in seconds (measured once)
        self.sleep_rate = sleep_cycles_per_second() if device.type == "cuda" else 0.0
        self.device: TorchDevice | None = None
        self._forcing: list[TeacherForcing] = []  # this run's, for `max_deficit`
        self._eos = self.spec.eos_token_id

    def prepare(self, scenario: Scenario) -> Scenario:
        greedy = self.oracle.greedy if self.oracle is not None else (lambda prompt, n: [])
        return fit_scenario(scenario, self.spec.vocab_size, self.spec.eos_token_id, greedy)

    def make_device(self, scenario: Scenario, plan: DevicePlan | None = None) -> TorchDevice:
        """A fresh device for one run of `scenario`, running `plan` (delays, gates, holds)."""
        cfg = scenario.config
        if self.sanitizer is not None:
            self.sanitizer.enable()  # before the pools exist, so CSAN sees their allocation
        engine = Engine(self.model, cfg, flashinfer=self.model.device.type == "cuda", seed=cfg.seed)
        if self.graph_sizes and self.sanitizer is None:  # CSAN cannot see inside a graph replay
            engine.capture(self.graph_sizes)
        self.device = TorchDevice(cfg, engine, self.sanitizer, self.sampling, plan, self.sleep_rate)
        self._forcing = []
        self._eos = cfg.eos_token_id
        return self.device

    def planned(self, plan: DevicePlan) -> PlannedBackend:
        """This backend (the same model, loaded once) making every device with `plan`."""
        return PlannedBackend(self, plan)

    def gates_unavailable(self) -> str | None:
        """Why this backend cannot hold a stream behind a gate (None: it can). On CUDA the spin
        kernel is compiled and run once here, so that a replay knows before its first run."""
        if self._no_gates is None:
            self._no_gates = ""
            if self.model.device.type == "cuda":
                try:
                    from overlapcheck.backends.gpu.spin_gates import SpinGates

                    SpinGates(1, {}, 1e-3)
                except Exception as err:  # no Triton, or its kernel does not build here
                    self._no_gates = f"no gate on this device: {type(err).__name__}: {err}"
        return self._no_gates or None

    def expected(self, spec: RequestSpec, max_tokens: int) -> Expected:
        if self.oracle is None:
            return _AnyToken()
        ref = list(self.oracle.greedy(spec.prompt, max_tokens))
        # Exact (CPU): the request ends where the oracle says EOS. bf16 (CUDA): tokens are
        # judged one by one under teacher forcing, so the engine may end elsewhere (within margin).
        if self.exact:
            if not spec.ignore_eos and self._eos in ref:
                ref = ref[: ref.index(self._eos) + 1]
            return ExactTokens(ref)
        forcing = self.oracle.forcing(spec.prompt)
        self._forcing.append(forcing)
        return _WithinMargin(ref, forcing, self.margin)

    def max_deficit(self) -> float:
        """The largest logit deficit seen under teacher forcing in the last run (CUDA)."""
        return max((max(f.deficits, default=0.0) for f in self._forcing), default=0.0)

    def close(self) -> None:
        if self.sanitizer is not None:
            self.sanitizer.disable()


class PlannedBackend:
    """A `TorchBackend` whose devices run a fixed `DevicePlan`: a replay's delays and gates, or
    calibration's holds, given at construction instead of set on the shared backend between
    runs. `backend.device` is the device of its latest run."""

    def __init__(self, backend: TorchBackend, plan: DevicePlan) -> None:
        self.backend, self.plan = backend, plan
        self.name = backend.name
        self.checks_online = backend.checks_online
        self.watchdog_by_default = backend.watchdog_by_default
        self.small_run_objects = backend.small_run_objects

    def prepare(self, scenario: Scenario) -> Scenario:
        return self.backend.prepare(scenario)

    def make_device(self, scenario: Scenario) -> TorchDevice:
        return self.backend.make_device(scenario, self.plan)

    def expected(self, spec: RequestSpec, max_tokens: int) -> Expected:
        return self.backend.expected(spec, max_tokens)

    @property
    def device(self) -> TorchDevice | None:
        return self.backend.device


def make_torch_backend(
    name: str,
    model: str | None = None,
    preset: str | None = None,
    sanitize: bool = False,
    **options: Any,
) -> TorchBackend:
    """The `cpu` or `cuda` backend; bad options and missing pieces are one-line UserErrors."""
    if name not in ("cpu", "cuda"):
        raise UserError(f"unknown torch backend {name!r}")
    if model and preset:
        raise UserError("give --model or --preset, not both")
    if sanitize and name != "cuda":
        raise UserError("--sanitize needs --backend cuda (it checks CUDA streams)")
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UserError(
                f"backend cuda: no CUDA device is available to torch "
                f"{torch.__version__} (use --backend cpu)"
            )
        if importlib.util.find_spec("flashinfer") is None:
            raise UserError("backend cuda needs FlashInfer: pip install 'overlapcheck[cuda]'")
        try:
            import flashinfer  # noqa: F401
        except Exception as err:  # a broken install fails here, not in the middle of a run
            raise UserError(f"backend cuda: FlashInfer does not import: {err}") from None
    device = torch.device("cuda" if name == "cuda" else "cpu")
    dtype = torch.bfloat16 if name == "cuda" else torch.float32
    if model:
        hf_config, tensors = load_checkpoint(model)
    else:
        hf_config = preset_config(preset or DEFAULT_PRESET)
        tensors = random_weights(
            ModelSpec.from_config(hf_config), seed=0, device=device, dtype=torch.float32
        )
    tensors = {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}
    return TorchBackend(name, hf_config, tensors, device, dtype, sanitize=sanitize, **options)
