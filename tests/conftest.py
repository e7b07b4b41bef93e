import pytest
from hypothesis import settings

# CI and `bash scripts/test.sh` draw the same examples on every run (derandomized, no example
# database), so a red run is reproducible and a green one stays green. Exploratory runs, with
# fresh random examples and a database of past failures:
#     bash scripts/test.sh --hypothesis-profile=explore
settings.register_profile("ci", derandomize=True, database=None)
# Hypothesis loads its own "ci" profile (derandomized) where a CI variable is set; "explore"
# starts from hypothesis's "default" profile, so it is random wherever it runs.
settings.register_profile("explore", parent=settings.get_profile("default"))
settings.load_profile("ci")  # the hypothesis plugin's --hypothesis-profile, read later, overrides it


def pytest_sessionstart(session):
    # Hypothesis also draws literals it reads from every local module imported so far
    # (treeattn's, a benchmark a test loads), so a test run alone would draw other examples than
    # beside files that import more. The pinned profile draws from each test's seed alone; the
    # hook is Hypothesis-internal: test_hypothesis_profile.py fails if it stops taking effect.
    if settings.default.derandomize:
        from hypothesis.internal.conjecture import providers

        if hasattr(providers, "_get_local_constants"):
            none = providers.Constants()
            providers._get_local_constants = lambda: none


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
