"""On a GPU: each named fault's counterexample (docs/gpu-replay) reproduces on the real engine
with the fault on and is clean with it off, and the calibrated simulator predicts the GPU.

    python -m pytest -m cuda tests/test_gpu_replay_cuda.py
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("flashinfer")

from overlapcheck.backends.gpu.backend import TorchBackend, make_torch_backend  # noqa: E402
from overlapcheck.backends.sim.timing import Profile  # noqa: E402
from overlapcheck.bench.gpu_replay import RACE_FAULTS, SPEC_RACE_FAULTS  # noqa: E402
from overlapcheck.calibrate.gpu import (  # noqa: E402
    calibrate,
    check,
    misses,
    verdict,
)
from overlapcheck.formats import counterexample  # noqa: E402
from overlapcheck.reference.faults import FAULTS  # noqa: E402
from overlapcheck.replay.gpu import (  # noqa: E402
    Verdict,
    replay_verdicts,
)

pytestmark = pytest.mark.cuda

COUNTEREXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "gpu-replay"
REPEATS = 20


@pytest.fixture(scope="module")
def cuda() -> TorchBackend:
    return make_torch_backend("cuda", preset="tiny")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_counterexample_reproduces_on_the_gpu_and_the_fix_holds(
    cuda: TorchBackend, fault: str
) -> None:
    """Fault on, every repeat reproduces; the fix, under the same plan, is clean in every repeat.
    Where the counterexample is a race, a gate forces its order in each repeat (the plan says
    so), so neither verdict depends on how the host's timing fell."""
    path = COUNTEREXAMPLES / f"{fault}.json"
    if not path.exists():
        pytest.skip(
            f"no GPU counterexample for {fault} in docs/gpu-replay (search: python -m "
            f"overlapcheck.bench.gpu_replay search --fault {fault}; keep it if it replays on the "
            "real engine)"
        )
    cex = counterexample.load(path)
    plan, on = replay_verdicts(cex, cuda, REPEATS)
    hits = sum(v.reproduced for v in on)
    _, off = replay_verdicts(cex, cuda, REPEATS, cex.without_faults())
    print(f"{fault}: " + "; ".join(plan.lines()))
    print(f"{fault}: fault on reproduced {hits}/{REPEATS}, gates {_states(on)}")
    print(f"{fault}: fault off clean {sum(v.clean for v in off)}/{REPEATS}, gates {_states(off)}")
    if fault in RACE_FAULTS or (fault in SPEC_RACE_FAULTS and plan.gates):
        assert plan.gates, plan.lines()  # the order is forced, not waited for
        assert all(g.forced for v in on for g in v.gates), [v.gate_line() for v in on][:3]
        assert hits == REPEATS, [v.to_json() for v in on if not v.reproduced][:3]
    else:
        assert hits >= REPEATS - 1, [v.to_json() for v in on if not v.reproduced][:3]
    assert all(v.missed == 0 for v in on)  # every planned sleep found its operation
    assert all(v.clean for v in off), [v.to_json() for v in off if not v.clean][:3]


def _states(verdicts: list[Verdict]) -> str:
    counts = Counter(g.state for v in verdicts for g in v.gates)
    return ", ".join(f"{state} {n}" for state, n in sorted(counts.items())) or "none"


@pytest.fixture(scope="module")
def calibrated(cuda: TorchBackend, tmp_path_factory: pytest.TempPathFactory) -> Profile:
    return calibrate(cuda, tmp_path_factory.mktemp("calibration") / "profile.json").profile


def test_the_calibrated_simulator_predicts_the_gpu(cuda: TorchBackend, calibrated: Profile) -> None:
    """Every figure within 15 % of the GPU's median or within the GPU's own run-to-run range in
    this very run, whichever is wider (`misses`), with the host as run; the speed-up with the
    calibrated profile too. Totals and the engine's idle share with the calibrated profile follow
    the host's drift (the idle share is a ratio of host phases that drift apart) and are
    reported, not judged (see docs/gpu-replay.md)."""
    rows = check(cuda, calibrated)
    assert not misses(rows), verdict(rows)


def test_the_fidelity_check_fails_a_wrong_model(cuda: TorchBackend, calibrated: Profile) -> None:
    """The judge has teeth: a profile whose forwards take twenty times what the GPU's do is caught
    even on two scenarios and three repeats, however noisy the host. (Four times is not wrong on
    the tiny model: its forwards still end inside the host's launch phase, as the GPU's do.)"""
    wrong = replace(
        calibrated,
        forward=20 * calibrated.forward,
        forward_per_token=20 * calibrated.forward_per_token,
        forward_per_context=20 * calibrated.forward_per_context,
    )
    rows = check(cuda, wrong, repeats=3, names=("basic", "chunked-long"))
    wrong_figures = {m.row.figure for m in misses(rows)}
    assert {"total ms", "engine idle %"} <= wrong_figures, verdict(rows)
