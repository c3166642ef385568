import os
import shutil
import subprocess

import pytest


def solar_bin():
    path = os.environ.get("SOLAR_BIN") or shutil.which("solar")
    if not path:
        here = os.path.dirname(os.path.abspath(__file__))
        path = os.path.join(here, "..", "..", "build", "cli", "solar")
    return os.path.abspath(path)


@pytest.fixture(scope="session")
def solar():
    path = solar_bin()
    assert os.access(path, os.X_OK), f"solar binary not found at {path}: build first (scripts/build)"

    def run(*args, check=True):
        p = subprocess.run([path, *map(str, args)], capture_output=True, text=True, timeout=600)
        if check and p.returncode != 0:
            raise AssertionError(f"solar {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
        return p

    return run
