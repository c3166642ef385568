# SPDX-License-Identifier: Apache-2.0
"""Changed or failing storage under a running job (issue 14 item 5), on the libsolar path
(agents serving batches, ranks falling back to direct reads): the dataset file rewritten in
place, truncated, replaced by a rename, deleted, or failing with a real kernel EIO. Every
sample a rank receives is checked against solar gen's content (--verify): no rank may ever get
a stale or torn byte. The behaviour chosen: the agent notices (after each read, and every
0.2 s by re-checking the open file and its path), stops serving, tells its ranks why, and
exits; the ranks fall back to direct reads, whose own checks refuse the file with an error
naming it (I/O errors: after bounded retries, naming the file and the offset). Nothing hangs.
"""
import os
import shutil
import subprocess
import time

import pytest

from test_data_path import (agents_up, at_line, dataset, interrupt,  # noqa: F401
                            other_dataset, rewrite_in_place, solar_run)
from testlib import SOLAR, run

NOT_THE_PLANS = "not the dataset the plan was computed for"


def run_with_fault(tmp_path, dataset_path, fault, *extra):
    p = solar_run(tmp_path, dataset_path, *extra, train_args=["--compute-ms", "15"], popen=True)
    t0 = time.monotonic()
    rc, out, err = interrupt(p, fault, agents_up(p), at_line(tmp_path / "rank-0.txt", 10),
                             timeout=120)
    return rc, out + err, time.monotonic() - t0


def assert_no_wrong_bytes(out):
    # --verify reports a sample whose bytes are not the dataset's ("has wrong content") and
    # prints "verified (N wrong)" for a rank that finished.
    assert "wrong content" not in out, out
    for line in out.splitlines():
        if "verified (" in line:
            assert "verified (0 wrong)" in line, out


def failed_ranks(out):
    return [l for l in out.splitlines() if l.startswith("solar-example-train: ")]


def check_stopped(out, path, *agent_says):
    """The agents stopped, saying why (relayed to their ranks), and every rank that did not
    finish stopped with an error naming the file."""
    assert any(s in out for s in agent_says), out
    assert "this agent stops serving it" in out or "the agent stopped:" in out, out
    fails = failed_ranks(out)
    assert fails, out
    for line in fails:
        assert str(path) in line, line
    assert len(fails) + out.count("verified (0 wrong)") == 4, out


def test_dataset_rewritten_in_place_mid_run(tmp_path, dataset):
    other = other_dataset(tmp_path)
    rc, out, secs = run_with_fault(tmp_path, dataset, lambda p: rewrite_in_place(dataset, other))
    assert rc != 0, out
    assert_no_wrong_bytes(out)
    check_stopped(out, dataset, "changed while solar was reading it")
    assert secs < 100


def test_dataset_truncated_mid_run(tmp_path, dataset):
    size = os.path.getsize(dataset)
    rc, out, secs = run_with_fault(tmp_path, dataset, lambda p: os.truncate(dataset, size // 2))
    assert rc != 0, out
    assert_no_wrong_bytes(out)
    check_stopped(out, dataset, "changed while solar was reading it", "truncated?")


def test_dataset_replaced_by_a_rename_mid_run(tmp_path, dataset):
    """`mv other.h5 d.h5`: the agents keep the old file open but re-check the path, stop, and
    their ranks refuse the new file."""
    other = other_dataset(tmp_path)
    rc, out, secs = run_with_fault(tmp_path, dataset, lambda p: os.replace(other, dataset))
    assert rc != 0, out
    assert_no_wrong_bytes(out)
    check_stopped(out, dataset, "another file was moved over its path")
    assert NOT_THE_PLANS in out, out


def test_dataset_deleted_mid_run(tmp_path, dataset):
    rc, out, secs = run_with_fault(tmp_path, dataset, lambda p: os.unlink(dataset))
    assert rc != 0, out
    assert_no_wrong_bytes(out)
    check_stopped(out, dataset, "was deleted", "deleted or renamed")


def test_dataset_renamed_away_mid_run(tmp_path, dataset):
    rc, out, secs = run_with_fault(tmp_path, dataset,
                                   lambda p: os.rename(dataset, tmp_path / "elsewhere.h5"))
    assert rc != 0, out
    assert_no_wrong_bytes(out)
    check_stopped(out, dataset, "deleted or renamed")


# ---- a real kernel EIO: the file on ext4 over a loop device that shrinks under it ----------

def _sh(*args):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True)


@pytest.fixture(params=["file", "many-files"])
def failing_disk(tmp_path, request):
    """An ext4 file system on a loop device holding the dataset: one file, or (many-files) the
    SOLAR artifact's layout of a file per sample. `fail()` drops the files' cached pages and
    shrinks the device to 1 MiB: every read of blocks past it then fails in the block layer with
    EIO ("attempt to access beyond end of device")."""
    if os.geteuid() != 0:
        pytest.skip("EIO emulation needs root (a loop device and a mount)")
    for tool in ("losetup", "mkfs.ext4", "mount", "umount"):
        if not shutil.which(tool):
            pytest.skip(f"EIO emulation needs {tool}")
    img, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    if _sh("mkfs.ext4", "-q", img).returncode != 0:
        pytest.skip("mkfs.ext4 failed")
    loop = _sh("losetup", "-f", "--show", img)
    if loop.returncode != 0:
        pytest.skip(f"no loop device here: {loop.stderr.strip()}")
    dev = loop.stdout.strip()
    m = _sh("mount", dev, mnt)
    if m.returncode != 0:
        _sh("losetup", "-d", dev)
        pytest.skip(f"cannot mount a loop device here: {m.stderr.strip()}")
    many = request.param == "many-files"
    path = mnt / ("d" if many else "d.h5")

    def fail():
        for f in ([p for p in path.rglob("*.hdf5")] if many else [path]):
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        os.truncate(img, 1 << 20)
        assert _sh("losetup", "-c", dev).returncode == 0

    try:  # from the mount on: a failure setting up unmounts too
        if many:  # 600 files of 4 KiB: most of them lie past the first MiB
            run(SOLAR, "gen", path, "--layout", "per-sample-files", "--samples", "600",
                "--preset", "tiny", "--seed", "7", "--no-progress")
        else:
            run(SOLAR, "gen", path, "--samples", "600", "--preset", "tiny", "--seed", "7",
                "--no-progress")
        os.sync()
        yield path, fail
    finally:
        _sh("umount", "-l", mnt)
        _sh("losetup", "-d", dev)


def test_dataset_read_fails_with_eio_mid_run(tmp_path, failing_disk):
    path, fail = failing_disk
    many = path.suffix != ".h5"
    if many:  # the files' whole arrays are the samples, their unitPar the labels
        rc, out, secs = run_with_fault(tmp_path, f"{path}/:/split", lambda p: fail(),
                                       "--labels", "/unitPar")
    else:
        rc, out, secs = run_with_fault(tmp_path, path, lambda p: fail())
    assert rc != 0, out
    assert_no_wrong_bytes(out)
    assert "Input/output error" in out, out
    # The agent's error names the file (one of the dataset's) and where in it, after its bounded
    # retries.
    where = "samples [" if many else "offset"
    said = [l for l in out.splitlines() if "Input/output error" in l and where in l]
    assert said and str(path) in said[0] and "(4 attempts)" in said[0], out
    for line in failed_ranks(out):
        assert str(path) in line, line
    assert secs < 100, secs  # nothing hangs
