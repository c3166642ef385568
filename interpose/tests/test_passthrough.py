# SPDX-License-Identifier: Apache-2.0
"""b. An unmodified h5py + DataLoader job gives identical batches with the preload when no agent
answers (the socket path has no listener): every read falls through to the file."""
import pytest

from conftest import HERE, PYTHON, plain_env, preload_env, run

LOADER = str(HERE / "loader.py")


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("mode", ["init", "lazy"])
def test_digests_identical_without_agent(lib, h5file, tmp_path, workers, mode):
    dataset, _ = h5file
    cmd = [PYTHON, LOADER, str(dataset), str(workers), mode, "1", "2"]
    base = run(cmd, plain_env())
    assert base.returncode == 0, base.stderr.decode()[-2000:]
    assert len(base.stdout.splitlines()) == 2 * 8
    pre = run(cmd, preload_env(lib, dataset, tmp_path / "nobody.sock"))
    assert pre.returncode == 0, pre.stderr.decode()[-2000:]
    assert pre.stdout == base.stdout
    assert pre.stderr == base.stderr


def test_verbose_says_why_once_per_process(lib, h5file, tmp_path):
    dataset, _ = h5file
    cmd = [PYTHON, LOADER, str(dataset), "0", "init"]
    pre = run(cmd, preload_env(lib, dataset, tmp_path / "nobody.sock", verbose=True))
    assert pre.returncode == 0
    lines = [l for l in pre.stderr.decode().splitlines() if l.startswith("solar:")]
    assert len(lines) == 1 and "no buffer from the node agent" in lines[0], lines
