"""The test suite's property tests draw the same examples on every run unless asked otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import settings


def test_default_profile_is_derandomized_without_a_database(request: pytest.FixtureRequest) -> None:
    chosen = request.config.getoption("--hypothesis-profile", default=None)
    if chosen not in (None, "ci"):
        pytest.skip(f"--hypothesis-profile={chosen}: an exploratory run")
    assert settings.default.derandomize is True
    assert settings.default.database is None
    # A test's own @settings keeps the pinned behaviour for what it does not set.
    assert settings(max_examples=5).derandomize is True


def test_explore_profile_is_random() -> None:
    assert settings.get_profile("explore").derandomize is False


@pytest.mark.parametrize("ci", ["", "true"])
def test_profiles_hold_with_and_without_a_ci_variable(ci: str) -> None:
    # Hypothesis picks its own default profile from the CI variable; ours must not depend on it.
    probe = (
        "import conftest; from hypothesis import settings; "
        "print(settings.default.derandomize, settings.default.database, "
        "settings.get_profile('explore').derandomize, settings.get_profile('explore').database is None)"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TF_BUILD", "GITHUB_ACTIONS")}
    if ci:
        env["CI"] = ci
    tests_dir = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", probe], cwd=tests_dir, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "None", "False", "False"]
