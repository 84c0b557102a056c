"""Tests marked ``slow`` run only when asked for (``pytest -m slow``): the default run, which
CI makes, stays within its time budget."""

import os

import pytest

# The cache of optimized networks (flowrt.network_cache) stays out of the tests' way: each
# test optimizes what it loads, and none writes to the user's cache. Its own tests turn it on.
os.environ.setdefault("FLOWRT_NETWORK_CACHE", "0")


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
