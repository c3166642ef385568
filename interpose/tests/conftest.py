# SPDX-License-Identifier: Apache-2.0
"""Shared pieces of the interposer's tests: the library, a dataset file, runners, and the real
node agent (solar-agent --transparent) with what the tests need to drive and observe it.

The agent is the built solar-agent (SOLAR_AGENT, set by CTest; the build tree otherwise), fed a
plan from the built CLI (SOLAR_BIN). It is started per test, checked ready by connecting to its
socket, and stopped by its pid (SIGTERM, then SIGKILL after a timeout) in the fixture's teardown.
What the tests observe of it: `solar stat SOCK --json`, its log, and its shared index, mapped
read-only through the same handshake the interposer uses (`BufferIndex`).
"""
import json
import mmap
import os
import re
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BUILD = HERE.parents[1] / "build"
PYTHON = "/usr/bin/python3"
LIB = os.environ.get("SOLAR_PRELOAD_LIB") or str(BUILD / "interpose" / "libsolar_preload.so")
AGENT = os.environ.get("SOLAR_AGENT") or str(BUILD / "agent" / "solar-agent")
SOLAR = os.environ.get("SOLAR_BIN") or str(BUILD / "cli" / "solar")

N, ROW = 64, (64, 1024)  # /data: 64 samples of 64 KiB, uint8
S = ROW[0] * ROW[1]
BATCH = 8  # the plans' per-rank batch (loader.py's too)


@pytest.fixture(scope="session")
def lib():
    if not os.path.exists(LIB):
        pytest.fail(f"{LIB} is not built (cmake --build ... --target solar_preload)")
    return LIB


def make_h5(path, seed=1234):
    """A contiguous /data (N, 64, 1024) uint8 and /label int64 (N). Returns /data's offset."""
    import h5py
    import numpy as np
    rng = np.random.default_rng(seed)
    # /data 4 KiB-aligned, so that O_DIRECT reads of whole samples are possible.
    with h5py.File(path, "w", alignment_threshold=4096, alignment_interval=4096) as f:
        f.create_dataset("data", data=rng.integers(0, 256, size=(N, *ROW), dtype=np.uint8))
        f.create_dataset("label", data=np.arange(N, dtype=np.int64) * 7 + 3)
    with h5py.File(path, "r") as f:
        return f["data"].id.get_offset()


@pytest.fixture(scope="session")
def h5file(tmp_path_factory):
    path = tmp_path_factory.mktemp("h5") / "train.h5"
    offset = make_h5(path)
    return path, offset


def preload_env(lib, dataset, sock, verbose=False, extra=None):
    env = dict(os.environ)
    env["LD_PRELOAD"] = lib
    env["SOLAR_DATASET"] = f"{dataset}:/data"
    env["SOLAR_SOCKET"] = str(sock)
    env.pop("SOLAR_VERBOSE", None)
    if verbose:
        env["SOLAR_VERBOSE"] = "1"
    env.update(extra or {})
    return env


def plain_env():
    env = dict(os.environ)
    for k in ("LD_PRELOAD", "SOLAR_DATASET", "SOLAR_SOCKET", "SOLAR_VERBOSE"):
        env.pop(k, None)
    return env


def run(cmd, env, cwd=None, timeout=300):
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, timeout=timeout)


def file_sample(path, data_offset, k, count=1):
    """`count` samples of `path` from sample k of a dataset at data_offset."""
    with open(path, "rb") as f:
        f.seek(data_offset + k * S)
        return f.read(count * S)


def wait_until(pred, timeout=30, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# ---- the real node agent ------------------------------------------------------------------------

PROTO_MAGIC, OP_ERROR, OP_XHELLO, OP_XHELLO_OK = 0x524C4F53, 10, 11, 12
# solar/transparent.h's SOLAR_PROTO_VERSION (= solar/protocol.h kVersion), read from the header.
PROTO_VERSION = int(re.search(
    r"#define SOLAR_PROTO_VERSION (\d+)",
    (Path(__file__).resolve().parents[2] / "protocol/include/solar/transparent.h").read_text()).group(1))
XINDEX_MAGIC = 0x5844495852414C53
XINDEX = struct.Struct("<12Q")  # solar_xindex up to lease_until_ns
XFILE = struct.Struct("<3Q4q4Q")  # solar_xfile


class BufferIndex:
    """The agent's shared index, as the interposer sees it: XHELLO on the agent's socket, the
    memfd that comes back mapped read-only. Observes the real state (entries, consumed[]); it
    adds to no counter (`attached` counts the interposer's attaches only)."""

    def __init__(self, sock):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(sock))
            s.sendall(struct.pack("<IHHII", PROTO_MAGIC, PROTO_VERSION, OP_XHELLO, 8, 0) +
                      struct.pack("<II", os.getpid(), 0))
            msg, fds, _, _ = socket.recv_fds(s, 4096, 4)
            while len(msg) < 16:
                more = s.recv(4096)
                if not more:
                    break
                msg += more
            magic, version, op, length, _ = struct.unpack_from("<IHHII", msg)
            while len(msg) < 16 + length:
                more = s.recv(4096)
                if not more:
                    break
                msg += more
        body = msg[16:16 + length]
        if op != OP_XHELLO_OK or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise AssertionError(f"the agent refused XHELLO (op {op}): {body!r}")
        map_bytes, index_offset = struct.unpack("<QQ", body)
        try:
            self.map = mmap.mmap(fds[0], map_bytes, prot=mmap.PROT_READ)
        finally:
            os.close(fds[0])
        self.index_at = index_offset
        f = XINDEX.unpack_from(self.map, index_offset)
        (magic, self.samples, self.sample_bytes, self.slot_bytes, self.nfiles, self.files_at,
         self.extents, self.extents_at, self.entries_at, self.consumed_at, _, _) = f
        assert magic == XINDEX_MAGIC

    def files(self):
        """The file table: one dict per solar_xfile, in the table's (dev, ino) order."""
        names = ("dev", "ino", "size", "mtime_sec", "mtime_nsec", "ctime_sec", "ctime_nsec",
                 "first", "count", "data_offset", "extents_first", "extents")
        return [dict(zip(names, XFILE.unpack_from(self.map, self.files_at + i * XFILE.size)))
                for i in range(self.nfiles)]

    def lease_until(self):
        """The agent's lease (solar_xindex::lease_until_ns, CLOCK_MONOTONIC ns)."""
        return XINDEX.unpack_from(self.map, self.index_at)[-1]

    def resident(self):
        entries = struct.unpack_from(f"<{self.samples}Q", self.map, self.entries_at)
        return {k for k, e in enumerate(entries) if e & 0xFFFFFFFF}  # in flight: not yet

    def consumed(self):
        return list(struct.unpack_from(f"<{self.samples}I", self.map, self.consumed_at))

    def close(self):
        self.map.close()


class Agent:
    """One real solar-agent for one node of a one-node plan over `dataset` (N samples of S)."""

    def __init__(self, workdir, dataset, buffer="100%", epochs=2, seed=0, transparent=True,
                 extra=(), preexec=None):
        workdir.mkdir(parents=True, exist_ok=True)
        self.plan = workdir / "plan"
        self.sock = workdir / "agent.sock"
        self.log = workdir / "agent.log"
        p = run([SOLAR, "plan", "--samples", str(N), "--sample-bytes", str(S), "--epochs",
                 str(epochs), "--batch", str(BATCH), "--ranks-per-node", "1", "--buffer", buffer,
                 "--order", "torch", "--seed", str(seed), "--policy", "lru", "--out",
                 str(self.plan), "--no-progress"], plain_env())
        assert p.returncode == 0, p.stdout.decode() + p.stderr.decode()
        cmd = [AGENT, "--plan", str(self.plan), "--node", "0", "--dataset", f"{dataset}:/data",
               "--labels", "/label", "--socket", str(self.sock)]
        if transparent:
            cmd.append("--transparent")
        cmd += list(extra)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=plain_env(),
                                         preexec_fn=preexec)
        try:
            wait_until(self._listening, timeout=30, what=f"solar-agent on {self.sock}")
        except BaseException:
            self.stop()
            raise

    def _listening(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"solar-agent exited ({self.proc.returncode}):\n"
                                 f"{self.log.read_text()}")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            try:
                s.connect(str(self.sock))
                return True
            except OSError:
                return False

    def stat(self):
        p = run([SOLAR, "stat", str(self.sock), "--json"], plain_env(), timeout=30)
        assert p.returncode == 0, p.stderr.decode()
        return json.loads(p.stdout)

    def xstats(self):
        """The transparent block: hit_reads, hit_bytes, miss_reads, miss_bytes, torn, attached
        (the interposers' counters), consumed_steps (the agent's pacing)."""
        return self.stat()["transparent"]

    def wait_all_resident(self):
        """A buffer holding every sample: the agent has read them all, in plan order, and keeps
        them (the plan evicts nothing)."""
        def done():
            s = self.stat()
            return s["ready_steps"] == s["total_steps"]
        wait_until(done, timeout=60, what="every step read")
        with self.index() as ix:
            assert ix.resident() == set(range(N))

    def wait_stalled(self):
        """A buffer smaller than the dataset and no reader yet: the agent fills every cache slot
        with the plan's first steps, publishes them, and waits for a slot that only consumption
        can free (the plan's evictions wait for the samples' uses). Returns the resident set,
        which stays as it is until the readers complete one of those steps."""
        def stalled():
            s = self.stat()
            return (s["free_slots"] == 0 and s["fetched_samples"] > 0 and
                    s["bytes_read"] == s["fetched_samples"] * S and
                    s["ready_steps"] < s["total_steps"]) and s
        s = wait_until(stalled, timeout=60, what="the agent to fill its buffer")
        with self.index() as ix:
            resident = ix.resident()
        assert len(resident) == s["fetched_samples"] < N, (len(resident), s)
        self.stalled_steps = s["ready_steps"]
        return resident

    def index(self):
        return _Closing(BufferIndex(self.sock))

    def log_text(self):
        return self.log.read_text(errors="replace")

    def stop(self, timeout=10):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class _Closing:
    def __init__(self, ix):
        self.ix = ix

    def __enter__(self):
        return self.ix

    def __exit__(self, *exc):
        self.ix.close()


@pytest.fixture
def start_agent(tmp_path):
    """start_agent(dataset, **Agent options) -> a running Agent; every one is stopped (by pid)
    at the test's end, and must not have failed."""
    if not os.path.exists(AGENT) or not os.path.exists(SOLAR):
        pytest.fail(f"{AGENT} or {SOLAR} is not built (--target solar-agent solar_cli)")
    started = []

    def start(dataset, **kw):
        a = Agent(tmp_path / f"agent{len(started)}", dataset, **kw)
        started.append(a)
        return a

    yield start
    for a in started:
        rc = a.stop()
        assert rc == 0, f"solar-agent exited {rc}:\n{a.log_text()}"
