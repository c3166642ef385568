# SPDX-License-Identifier: Apache-2.0
import os
import shutil
import sys

import pytest

# The shared helpers, tests/testlib.py: its folder on sys.path before the test files import.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import testlib  # noqa: E402


def solar_bin():
    """SOLAR_BIN, else an installed `solar`, else the build's (testlib.SOLAR's default)."""
    return os.path.abspath(os.environ.get("SOLAR_BIN") or shutil.which("solar") or testlib.SOLAR)


@pytest.fixture(scope="session")
def solar():
    path = solar_bin()
    assert os.access(path, os.X_OK), f"solar binary not found at {path}: build first (scripts/build)"

    def run(*args, check=True):
        return testlib.run(path, *args, check=check, timeout=600)

    return run
