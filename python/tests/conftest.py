# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the front-end tests: real `solar gen` files, real plans, real `solar run`.
Everything is written under one temporary directory that is removed at the end."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("SOLAR_BUILD_DIR", os.path.join(REPO, "build"))
SOLAR = os.environ.get("SOLAR_BIN") or os.path.join(BUILD, "cli", "solar")
sys.path.insert(0, os.path.join(HERE, ".."))  # the package from the source tree
sys.path.insert(0, HERE)

SEED = 5
SAMPLES = 300


def run(*args, check=True, timeout=300, env=None, cwd=None):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                       env=env, cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def workdir():
    d = tempfile.mkdtemp(prefix="solar-pytest-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def dataset(workdir):
    path = os.path.join(workdir, "tiny.h5")
    run(SOLAR, "gen", path, "--samples", SAMPLES, "--preset", "tiny", "--seed", SEED,
        "--no-progress")
    return path


def make_plan(workdir, name, *args, sample_bytes=4096):
    path = os.path.join(workdir, name)
    run(SOLAR, "plan", "--samples", SAMPLES, "--sample-bytes", sample_bytes, "--out", path, *args)
    return path


@pytest.fixture(scope="session")
def plan(workdir):
    """1 node × 2 ranks, batch 8, 2 epochs over the tiny dataset."""
    return make_plan(workdir, "p1", "--epochs", 2, "--nodes", 1, "--ranks-per-node", 2,
                     "--batch", 8, "--buffer", "50%")


@pytest.fixture
def clean_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith("SOLAR_") and k not in ("SOLAR_BIN", "SOLAR_LIBRARY", "SOLAR_BUILD_DIR"):
            monkeypatch.delenv(k)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return monkeypatch
