"""The user docs' tables against the code they describe: the device contract (docs/contract.md,
the contract's one home) and the invariants (README). Each is stated once, in the code; the docs
name it, and these tests keep the two equal."""

from __future__ import annotations

import re
from pathlib import Path

from overlapcheck.core.device import Device
from overlapcheck.invariants.registry import INVARIANTS

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
CONTRACT = (ROOT / "docs" / "contract.md").read_text()
# The harness's, not the scheduler's: the contract table leaves them out.
HARNESS_ONLY = {"trace", "set_step", "close", "holds_program_tensors"}


def _section(title: str, text: str = README) -> str:
    start = text.index(f"\n{title}\n")
    end = text.find("\n#", start + len(title) + 2)
    return text[start:end]


def _first_cells(section: str) -> list[str]:
    return [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]


def test_the_device_table_names_every_call_of_the_contract_and_nothing_else() -> None:
    table = " ".join(_first_cells(_section("## The device contract", CONTRACT)))
    named = set(re.findall(r"`(?:[A-Za-z]+\.)?([a-z_]+)", table))
    members = {
        name
        for name in {*vars(Device), *Device.__annotations__}
        if not name.startswith("_") and name not in HARNESS_ONLY
    }
    assert members - named == set(), "calls of core/device.py missing from docs/contract.md's table"
    assert {n for n in named - members if n not in {"synchronize", "query", "tokens"}} == set()


def test_the_invariants_table_lists_every_registered_invariant() -> None:
    table = _first_cells(_section("## What is checked"))
    listed = {cell.strip().strip("`") for cell in table}
    assert set(INVARIANTS) - listed == set()
