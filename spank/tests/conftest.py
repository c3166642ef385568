# SPDX-License-Identifier: Apache-2.0
"""The cluster tests' fixtures: one test cluster and one dataset for the whole session (starting
a cluster takes a while), and after every test the check that nothing of it is left (no agent,
no run or plan folder, nothing of solar's in /dev/shm)."""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

# The shared helpers, tests/testlib.py (proc_status): its folder on sys.path before the test
# files import.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests"))
from slurm_cluster import SCRATCH_PARENT, SOLAR, Cluster, agents_running, shm_entries  # noqa: E402


@pytest.fixture(scope="session")
def cluster():
    root = tempfile.mkdtemp(prefix="spank-test-", dir=SCRATCH_PARENT)
    os.chmod(root, 0o755)  # jobs of `nobody` reach the dataset and the folders below
    c = Cluster(root)
    try:
        up = c.script("up", check=False)
        assert up.returncode == 0, up.stdout + up.stderr
        yield c
    finally:
        c.script("down", check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def dataset(cluster):
    path = os.path.join(cluster.root, "tiny.h5")
    subprocess.run([SOLAR, "gen", path, "--samples", "512", "--preset", "tiny", "--seed", "11",
                    "--no-progress"], check=True, capture_output=True, timeout=120)
    os.chmod(path, 0o644)
    return path + ":/data"


@pytest.fixture(autouse=True)
def clean_after(cluster):
    shm_before = shm_entries()
    cluster.plugstack()
    yield
    cluster.settle()
    assert not agents_running(), "an agent outlived its job"
    assert os.listdir(cluster.run_dir) == [], os.listdir(cluster.run_dir)
    assert os.listdir(cluster.plans) == [], os.listdir(cluster.plans)
    # Other programs on this machine may come and go in /dev/shm; none of solar's may appear.
    assert not [n for n in shm_entries() - shm_before if "solar" in n.lower()]
