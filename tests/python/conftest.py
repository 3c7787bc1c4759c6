"""Shared multi-rank worker pools for the Python suite (see harness.py)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import RankPool  # noqa: E402


@pytest.fixture(scope="session")
def pool1():
    pool = RankPool(1, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20})
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def pool2():
    pool = RankPool(2, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20})
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def pool3():
    pool = RankPool(3, extra_env={"HORA_STALL_SHUTDOWN_TIME_S": 20})
    yield pool
    pool.close()
