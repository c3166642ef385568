"""c. fd numbers that held the dataset and were freed behind the interposer's back (close_range,
closefrom, dup2/dup3 over them, vfork children) serve the files they hold now.

Run with no agent and with the stand-in agent, whose buffer holds poison (bytes that are not the
file's) for every sample but #2: a read served from the buffer is then visible in the output."""
import os
import subprocess

import pytest

from conftest import (N, PYTHON, S, StandInAgent, file_sample, poison_sample, preload_env,
                      run)

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


def sample_at(path, offset, count=1):
    with open(path, "rb") as f:
        f.seek(offset + S)
        return f.read(count * S)


@pytest.mark.parametrize("agent", [False, True])
def test_freed_fd_numbers_read_their_new_files(lib, h5file, others, prog, tmp_path, agent):
    dataset, offset = h5file
    other, same = others
    sock = tmp_path / "agent.sock"
    stand_in = StandInAgent(sock, dataset, offset, lambda k: k != 2, poison_sample) if agent \
        else None
    try:
        out = run([str(prog), str(dataset), str(other), str(same), str(offset), str(S)],
                  preload_env(lib, dataset, sock))
    finally:
        stats = stand_in.stats() if stand_in else None
        if stand_in:
            stand_in.close()
    assert out.returncode == 0, out.stderr.decode()
    assert out.stderr == b""
    got = dict(line.split(" ", 1) for line in out.stdout.decode().splitlines())

    ds = fnv(poison_sample(1) if agent else sample_at(dataset, offset))
    oth, same_h = fnv(sample_at(other, offset)), fnv(sample_at(same, offset))
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
        "same_name": same_h,
        # Samples 1-2, #2 not in the buffer: served short (a prefix) on a plain fd, whole from
        # the file on an O_DIRECT fd.
        "span.plain": f"short {S}" if agent else fnv(sample_at(dataset, offset, 2)),
        "span.o_direct": fnv(sample_at(dataset, offset, 2)),
    }
    assert got == expected
    if agent:
        assert stats["attached"] == 1
        assert stats["hit_reads"] == 6  # dataset, cloexec, dup2.copy x2, vfork parent, span
        assert stats["miss_reads"] == 1  # span.o_direct


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


def test_python_subprocess_and_closerange(lib, h5file, others, tmp_path):
    dataset, offset = h5file
    other, _ = others
    sock = tmp_path / "agent.sock"
    stand_in = StandInAgent(sock, dataset, offset, lambda k: True, poison_sample)
    try:
        out = subprocess.run([PYTHON, "-c", PY_SCRIPT, str(dataset), str(other), str(offset + S),
                              str(S)], env=preload_env(lib, dataset, sock),
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    finally:
        stand_in.close()
    assert out.returncode == 0, out.stderr.decode()
    import hashlib
    h = lambda b: hashlib.sha256(b).hexdigest()[:16]
    got = dict(line.split(" ", 1) for line in out.stdout.decode().splitlines())
    assert got == {
        "dataset": h(poison_sample(1)),
        "after_subprocess": h(poison_sample(1)),
        "stdin": h(b""),  # /dev/null, not the dataset
        "closerange.open": h(sample_at(other, offset)),
        "pipe": "errno 29",  # ESPIPE: the pipe, not the buffer
    }
