"""Tests marked ``slow`` run only when asked for (``pytest -m slow``): the default run, which
CI makes, stays within its time budget."""

import pytest


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
