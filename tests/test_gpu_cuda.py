"""The real engine on CUDA (bf16, two streams, FlashInfer): the differential matrix within the logit
margin, PyTorch's CUDA sanitizer quiet on the default scheduler, and the two streams overlapping."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_cases import MATRIX, matrix_scenario, ok

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)
pytest.importorskip("flashinfer")

from overlapcheck.backends.gpu.backend import TorchBackend, make_torch_backend  # noqa: E402
from overlapcheck.backends.gpu.oracle import BF16_LOGIT_MARGIN  # noqa: E402
from overlapcheck.core.batch import BatchInput, SeqWork  # noqa: E402
from overlapcheck.core.errors import InvariantError  # noqa: E402
from overlapcheck.core.scenario import RequestSpec, Scenario  # noqa: E402
from overlapcheck.harness.runner import run_scenario  # noqa: E402
from overlapcheck.invariants.races import RaceDetector  # noqa: E402
from overlapcheck.scenarios.named import NAMED, named_scenario  # noqa: E402

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def cuda() -> TorchBackend:
    return make_torch_backend("cuda", preset="tiny")


@pytest.mark.parametrize(("loop", "cache", "page_size"), MATRIX)
def test_matrix_within_logit_margin(
    cuda: TorchBackend, loop: str, cache: str, page_size: int
) -> None:
    scenario = matrix_scenario(loop, cache, page_size)
    result = run_scenario(scenario, cuda)
    ok(result)
    print(f"largest logit deficit {cuda.max_deficit():.4f} (margin {BF16_LOGIT_MARGIN})")
    assert cuda.max_deficit() <= BF16_LOGIT_MARGIN


@pytest.mark.parametrize("name", list(NAMED))
def test_named_scenarios(cuda: TorchBackend, name: str) -> None:
    ok(run_scenario(named_scenario(name), cuda))


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_speculative_steps_within_logit_margin(cuda: TorchBackend, loop: str) -> None:
    # verify forwards through FlashInfer's paged prefill; placeholders only under overlap
    result = run_scenario(named_scenario("speculative").with_config(loop=loop), cuda)
    ok(result)
    assert cuda.max_deficit() <= BF16_LOGIT_MARGIN
    resolved = any(op.kind == "resolve" for op in result.trace.ops)
    assert resolved == (loop == "overlap")


def test_margin_holds_on_the_larger_preset() -> None:
    """28 layers accumulate more bf16 rounding than 2: the margin must still hold there."""
    backend = make_torch_backend("cuda", preset="qwen3-0.6b")
    for name in ("basic", "chunked-long"):
        ok(run_scenario(named_scenario(name), backend))
        print(f"qwen3-0.6b {name}: largest logit deficit {backend.max_deficit():.4f}")


@pytest.fixture
def sanitized() -> Iterator[TorchBackend]:
    backend = make_torch_backend("cuda", preset="tiny", sanitize=True)
    yield backend
    backend.close()  # CSAN is process-wide: switch it off before the next test


@pytest.mark.parametrize("loop", ["overlap", "normal"])
def test_sanitizer_finds_nothing_on_the_default_scheduler(
    sanitized: TorchBackend, loop: str
) -> None:
    for name in ("shared-prefix", "abort", "single-slot"):
        scenario = named_scenario(name).with_config(loop=loop, max_extend_tokens=8)
        ok(run_scenario(scenario, sanitized))
    assert sanitized.sanitizer is not None and sanitized.sanitizer.findings == []


def test_sanitizer_reports_an_unordered_forward(sanitized: TorchBackend) -> None:
    """Negative control: a forward not ordered after its metadata copy is a CSAN finding."""
    device = sanitized.make_device(named_scenario("basic"))
    seq = SeqWork(uid=0, slot=0, start=0, end=1, out_row=0, out_col=1, kv_cells=(0,))
    batch = BatchInput(1, "decode", (seq,))
    device.stage_metadata(batch, device.scheduler_stream)
    with pytest.raises(InvariantError, match="CUDA sanitizer"):
        device.forward(batch, device.engine_stream)  # no wait_stream: the bug
    torch.cuda.synchronize()


def test_streams_overlap() -> None:
    """Scheduler-stream work for batch N+1 starts before forward N ends (CUDA event times).

    Needs forwards that outlast the host's step: the ~0.6B preset with decode in a CUDA graph.
    """
    backend = make_torch_backend("cuda", preset="qwen3-0.6b", oracle=False, graph_sizes=range(1, 9))
    reqs = tuple(
        RequestSpec(u, tuple(range(10 + u, 42 + u)), max_tokens=48, ignore_eos=True)
        for u in range(8)
    )
    base = named_scenario("basic")
    scenario = Scenario("overlap", base.config, reqs).with_config(
        num_slots=8, num_pages=1024, max_extend_tokens=512, loop="overlap"
    )  # all 8 admitted
    # No online invariants: their host time would make the host, not the GPU, set the pace.
    result = run_scenario(scenario, backend, invariants=[])
    ok(result)
    assert RaceDetector().check(result.trace) is None  # the real footprints, checked afterwards
    assert all(o.finish_reason == "length" and len(o.tokens) == 48 for o in result.outcomes)
    ops = result.trace.ops
    forwards = {op.batch: op for op in ops if op.agent == "engine" and op.kind == "forward"}
    staged = {
        op.batch: op for op in ops if op.agent == "scheduler" and op.label.startswith("metadata")
    }
    pairs = [(forwards[b], staged[b + 1]) for b in forwards if b + 1 in staged]
    early = [
        (f, s) for f, s in pairs if s.start is not None and f.end is not None and s.start < f.end
    ]
    print(f"{len(early)}/{len(pairs)} batches: metadata of N+1 copied while forward N ran")
    assert len(early) >= len(pairs) // 2
    assert sum(len(f.uids) == 8 for f in forwards.values()) == len(forwards)
    busy = [f for f in forwards.values() if f.label.startswith("D")]
    assert all(f.start is not None and f.end is not None and f.end > f.start for f in busy)
