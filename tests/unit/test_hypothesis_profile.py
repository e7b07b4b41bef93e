"""The test suite's property tests draw the same examples on every run unless asked otherwise."""

from __future__ import annotations

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
