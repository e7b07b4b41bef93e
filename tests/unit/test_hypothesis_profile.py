"""The test suite's property tests draw the same examples on every run unless asked otherwise."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st


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


def test_draws_do_not_depend_on_the_modules_imported(request: pytest.FixtureRequest, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Hypothesis also draws literals it reads from every local module imported so far, so a test
    # run alone would draw other examples than beside files that import more of treeattn.
    chosen = request.config.getoption("--hypothesis-profile", default=None)
    if chosen not in (None, "ci"):
        pytest.skip(f"--hypothesis-profile={chosen}: an exploratory run")
    drawn: list[str] = []

    @settings(max_examples=300, deadline=None)
    @given(st.text(max_size=6))
    def draw(s: str) -> None:
        drawn.append(s)

    draw()
    before, drawn[:] = list(drawn), []
    (tmp_path / "audit_literals.py").write_text("WORDS = [" + ", ".join(f"'w{i}'" for i in range(200)) + "]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("audit_literals")
    try:
        draw()
    finally:
        del sys.modules["audit_literals"]
    assert drawn == before
