"""Shared fixtures: a seeded RNG whose seed is printed on failure (PYKERNEL_SEED replays)."""
import os
import secrets

import numpy as np
import pytest


@pytest.fixture
def seed(request):
    value = int(os.environ.get("PYKERNEL_SEED", secrets.randbelow(2**31)))
    request.node.user_properties.append(("seed", value))
    return value


@pytest.fixture
def rng(seed):
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seeds = [v for k, v in item.user_properties if k == "seed"]
        if seeds:
            report.sections.append(("seed", f"replay with PYKERNEL_SEED={seeds[0]}"))
