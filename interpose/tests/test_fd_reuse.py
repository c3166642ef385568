# SPDX-License-Identifier: Apache-2.0
"""c. fd numbers that held the dataset and were freed behind the interposer's back (close_range,
closefrom, dup2/dup3 over them, vfork children) serve the files they hold now.

Run with no agent and with the real agent (solar-agent --transparent) holding half the dataset:
its plan's buffer is smaller than the dataset and nothing reads in its order, so it fills its
slots with the plan's first steps and stays so (the steps' other samples are never read, so no
eviction is paced). The programs read sample k, resident, whose successor k+1 is not. The other
files' bytes differ from the dataset's there: a read of another file served from the buffer shows
as the dataset's bytes, and is counted as a hit."""
import hashlib
import os
import subprocess

import pytest

from conftest import N, PYTHON, S, file_sample, preload_env, run

PARTIAL = "1M"  # the plan's buffer: 16 of the 64 samples (the agent adds 2 steps of slots: 32)


HERE = os.path.dirname(os.path.abspath(__file__))


def fnv(data):
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@pytest.fixture(scope="module")
def prog(tmp_path_factory):
    exe = tmp_path_factory.mktemp("bin") / "fd_reuse"
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(exe), os.path.join(HERE, "fd_reuse.c")],
                   check=True)
    return exe


@pytest.fixture(scope="module")
def others(h5file, tmp_path_factory):
    dataset, _ = h5file
    size = os.path.getsize(dataset)
    d = tmp_path_factory.mktemp("others")
    other = d / "other.bin"
    other.write_bytes(os.urandom(size))
    (d / "sub").mkdir()
    same = d / "sub" / dataset.name  # the dataset's basename, another file
    same.write_bytes(os.urandom(size))
    return other, same


def half_resident_agent(start_agent, dataset):
    """The real agent, stalled with part of the dataset resident; returns it and a sample k that
    is resident while k+1 is not."""
    agent = start_agent(dataset, buffer=PARTIAL)
    resident = agent.wait_stalled()
    k = min(j for j in resident if j + 1 < N and j + 1 not in resident)
    return agent, resident, k


def fnv_at(path, offset, k, count=1):
    return fnv(file_sample(path, offset, k, count))


@pytest.mark.parametrize("with_agent", [False, True], ids=["no-agent", "agent"])
def test_freed_fd_numbers_read_their_new_files(lib, h5file, others, prog, tmp_path, start_agent,
                                               with_agent):
    dataset, offset = h5file
    other, same = others
    if with_agent:
        agent, resident, k = half_resident_agent(start_agent, dataset)
        sock = agent.sock
    else:
        k, sock = 1, tmp_path / "nobody.sock"
    ds = fnv_at(dataset, offset, k)
    oth, same_h = fnv_at(other, offset, k), fnv_at(same, offset, k)
    assert len({ds, oth, same_h}) == 3  # whose bytes a read returned is visible

    out = run([str(prog), str(dataset), str(other), str(same), str(offset + k * S), str(S)],
              preload_env(lib, dataset, sock))
    assert out.returncode == 0, out.stderr.decode()
    assert out.stderr == b""
    got = dict(line.split(" ", 1) for line in out.stdout.decode().splitlines())
    expected = {
        "dataset": ds,
        "close_range.dup": oth,
        "close_range.open": oth,
        "close_range.cloexec": ds,
        "closefrom.dup": oth,
        "dup2.over": oth,
        "dup3.over": oth,
        "dup2.copy": ds,
        "dup2.copy.after_close": ds,
        "dup2.copy.reuse": oth,
        "vfork.close_range.parent": ds,
        "vfork.close_range.reuse": oth,
        "vfork.dup2": oth,
        "vfork.open": oth,
        "fclose.fopen": oth,
        "same_name": same_h,
        # Samples k and k+1, k+1 not in the buffer: served whole on a plain fd (k from the
        # buffer, k+1 from the file: never a short count), from the file on an O_DIRECT fd.
        "span.plain": fnv_at(dataset, offset, k, 2),
        "span.o_direct": fnv_at(dataset, offset, k, 2),
        "o_direct.unaligned": "-1 errno 22",  # EINVAL, as the kernel says without solar
    }
    assert got == expected
    if with_agent:
        stats = agent.xstats()
        with agent.index() as ix:
            consumed, still = ix.consumed(), ix.resident()
        assert still == resident  # nothing was evicted or fetched meanwhile: the counts are exact
        assert stats["attached"] == 1
        # Served: dataset, close_range.cloexec, dup2.copy, dup2.copy.after_close,
        # vfork.close_range.parent (one sample each), span.plain (its resident sample). The
        # reused fd of fclose.fopen is seen to be another file and not counted at all.
        assert (stats["hit_reads"], stats["hit_bytes"]) == (6, 6 * S)
        # span.o_direct (two samples) and span.plain's rest (k+1, read from the file).
        assert (stats["miss_reads"], stats["miss_bytes"]) == (2, 3 * S)
        assert stats["torn"] == 0
        # Every read of the dataset started at sample k; both span reads brought in k+1 too (a
        # sample counts as consumed when a read brings its first byte).
        assert consumed == [7 if j == k else 2 if j == k + 1 else 0 for j in range(N)]


PY_SCRIPT = r'''
import hashlib, os, subprocess, sys
ds, other, at, S = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
h = lambda b: hashlib.sha256(b).hexdigest()[:16]
fd = os.open(ds, os.O_RDONLY)
print("dataset", h(os.pread(fd, S, at)))
subprocess.run(["true"], check=True)                 # vfork; the child close_range()s
print("after_subprocess", h(os.pread(fd, S, at)))
subprocess.run(["true"], check=True, stdin=fd)       # the child dup2()s it onto 0
print("stdin", h(os.pread(0, S, at)))
os.closerange(fd, fd + 1)
src = os.open(other, os.O_RDONLY)
assert src == fd
print("closerange.open", h(os.pread(src, S, at)))
os.close(src)
fd = os.open(ds, os.O_RDONLY)
os.closerange(fd, fd + 1)
r, w = os.pipe()                                     # not an open(): reuses fd as r
os.write(w, b"x")
assert r == fd
try:
    print("pipe", os.pread(r, S, at))
except OSError as e:
    print("pipe errno", e.errno)
'''


def test_python_subprocess_and_closerange(lib, h5file, others, start_agent):
    dataset, offset = h5file
    other, _ = others
    agent, resident, k = half_resident_agent(start_agent, dataset)
    out = subprocess.run([PYTHON, "-c", PY_SCRIPT, str(dataset), str(other), str(offset + k * S),
                          str(S)], env=preload_env(lib, dataset, agent.sock),
                         stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    h = lambda b: hashlib.sha256(b).hexdigest()[:16]
    ds, oth = h(file_sample(dataset, offset, k)), h(file_sample(other, offset, k))
    assert ds != oth
    got = dict(line.split(" ", 1) for line in out.stdout.decode().splitlines())
    assert got == {
        "dataset": ds,
        "after_subprocess": ds,
        "stdin": h(b""),  # /dev/null, not the dataset
        "closerange.open": oth,
        "pipe": "errno 29",  # ESPIPE: the pipe, not the buffer
    }
    stats = agent.xstats()
    with agent.index() as ix:
        consumed = ix.consumed()
    assert stats["attached"] == 1
    # The two reads through the dataset's fd were served; the others were not the dataset's.
    assert (stats["hit_reads"], stats["hit_bytes"], stats["miss_reads"]) == (2, 2 * S, 0)
    assert consumed == [2 if j == k else 0 for j in range(N)]
