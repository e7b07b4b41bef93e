"""Every plan the repository ships still matches the shipped topology it names: a plan made
for a topology whose costs changed since is refused by ``simulate`` and ``run`` (regenerate
with plans/make_search_plans.sh and plans/examples/make_examples.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli_helpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
PLANS = sorted(p for p in (ROOT / "plans").rglob("*") if p.suffix in (".yaml", ".json") and "local" not in p.parts)


def test_the_repository_ships_plans():
    assert len(PLANS) >= 8


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_shipped_plan_simulates_on_its_shipped_topology(plan):
    got = run_cli("simulate", str(plan), "--json")
    assert got.exit_code == 0, got.stderr
