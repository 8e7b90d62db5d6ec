"""On a GPU: mini-sglang's own scheduler (the 20fcd7f snapshot) replays the counterexamples kept
in docs/gpu-replay with the race's order forced by a gate: each reproduces in every repeat on the
tree as shipped (a token unlike the reference's, or a device-side assert where the racy order
put an index out of bounds), and the tree with its fix, under the same plan, is clean in every
repeat.

    MINISGL_SNAPSHOT=<the .tar.gz> python -m pytest -m cuda tests/test_minisgl_gpu_cuda.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from test_minisgl import FIX_1, FIX_2, FIX_3, FIX_6, SNAPSHOT, SPEC, Edit, unpack  # noqa: E402
from upstream_cli import run_cli  # noqa: E402

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not SNAPSHOT.is_file(), reason=f"no mini-sglang snapshot at {SNAPSHOT}"),
]

KEPT = Path(__file__).resolve().parent.parent / "docs" / "gpu-replay"
REPEATS = 20

# (counterexample, the edits it is found on, the edits that fix it)
CASES = {
    "minisgl-record-stream": ([], FIX_6),
    "minisgl-row-freed": (FIX_6 + FIX_1 + FIX_2, FIX_6 + FIX_1 + FIX_2 + FIX_3),
}


def replay(tmp: Path, name: str, edits: list[Edit], cex: Path) -> tuple[int, str]:
    tree = unpack(tmp / name, edits)
    args = ["replay", str(cex), "--backend", "cuda", "--repeat", str(REPEATS)]
    done = run_cli("MINISGL_PATH", tree, [*args, "--scheduler", SPEC], tmp, timeout=500)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("case", list(CASES))
def test_the_race_reproduces_forced_on_the_gpu_and_the_fix_holds(tmp_path: Path, case: str) -> None:
    cex = tmp_path / f"{case}.json"
    shutil.copy(KEPT / f"{case}.json", cex)  # its plan is written beside it, by the buggy tree
    buggy, fixed = CASES[case]
    code, out = replay(tmp_path, "buggy", buggy, cex)
    assert code == 1, out
    assert f"manifested {REPEATS}/{REPEATS}" in out, out
    # each repeat either ran the racy order (the gate opened) or the device stopped it there
    repeats = [line for line in out.splitlines() if line.startswith("repeat ")]
    assert len(repeats) == REPEATS and all("forced" in r or "failed" in r for r in repeats), out
    code, out = replay(tmp_path, "fixed", fixed, cex)
    assert code == 0, out
    assert f"clean {REPEATS}/{REPEATS}" in out and "(kept)" in out, out
