"""Shared pieces of the interposer's tests: the library, a dataset file, runners, and a stand-in
for the node agent's side of the transparent-mode handshake (solar/transparent.h).

The stand-in exists only because no agent implements SOLAR_OP_XHELLO yet: it serves a memfd laid
out as transparent.h describes, so the tests can reach the interposer's attached path. It is the
test's fixture, not the agent: what it checks is the reader side (libsolar_preload.so).
"""
import mmap
import os
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
PYTHON = "/usr/bin/python3"
LIB = os.environ.get("SOLAR_PRELOAD_LIB") or str(
    HERE.parents[1] / "build-interpose" / "interpose" / "libsolar_preload.so")

N, ROW = 64, (64, 1024)  # /data: 64 samples of 64 KiB, uint8
S = ROW[0] * ROW[1]


@pytest.fixture(scope="session")
def lib():
    if not os.path.exists(LIB):
        pytest.fail(f"{LIB} is not built (cmake --build ... --target solar_preload)")
    return LIB


def make_h5(path):
    """A contiguous /data (N, 64, 1024) uint8 and /label int64 (N). Returns /data's offset."""
    import h5py
    import numpy as np
    rng = np.random.default_rng(1234)
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


# ---- the stand-in agent -------------------------------------------------------------------------

MAGIC = 0x524C4F53
XINDEX_MAGIC = 0x5844495852414C53
XINDEX = struct.Struct("<QQQQQQQQqqQQ")  # solar_xindex up to stats
XSTATS = struct.Struct("<6Q")            # hit_reads hit_bytes miss_reads miss_bytes torn attached
XINDEX_SIZE = XINDEX.size + 16 * 8       # 224


class StandInAgent:
    """Answers XHELLO with a memfd holding `content(k)` for every k where `resident(k)`."""

    def __init__(self, sock_path, h5path, data_offset, resident, content,
                 file_size_delta=0, error_reply=False):
        st = os.stat(h5path)
        self.slot_bytes = S
        slots = [k for k in range(N) if resident(k)]
        index_at = -(-len(slots) * S // 4096) * 4096
        entries_at = index_at + 256
        consumed_at = entries_at + 8 * N
        self.size = consumed_at + 4 * N
        self.fd = os.memfd_create("solar-test-buffer", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size)
        for slot, k in enumerate(slots):
            self.map[slot * S:(slot + 1) * S] = content(k)
        XINDEX.pack_into(self.map, index_at, XINDEX_MAGIC, N, S, S, data_offset, st.st_dev,
                         st.st_ino, st.st_size + file_size_delta, int(st.st_mtime_ns // 10**9),
                         int(st.st_mtime_ns % 10**9), entries_at, consumed_at)
        for slot, k in enumerate(slots):
            struct.pack_into("<Q", self.map, entries_at + 8 * k, (1 << 32) | (slot + 1))
        self.index_at, self.consumed_at = index_at, consumed_at
        self.error_reply = error_reply
        self.hellos = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(sock_path))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.stopping = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(5)
                req = b""
                while len(req) < 24:
                    chunk = conn.recv(24 - len(req))
                    if not chunk:
                        break
                    req += chunk
                if len(req) < 24:
                    continue
                magic, version, op, length, _ = struct.unpack_from("<IHHII", req)
                pid, _ = struct.unpack_from("<II", req, 16)
                self.hellos.append((magic, version, op, length, pid))
                if self.error_reply:
                    text = b"no"
                    conn.sendall(struct.pack("<IHHII", MAGIC, 1, 10, len(text), 0) + text)
                    continue
                body = struct.pack("<QQ", self.size, self.index_at)
                head = struct.pack("<IHHII", MAGIC, 1, 12, len(body), 0)
                socket.send_fds(conn, [head + body], [self.fd])

    def stats(self):
        names = ("hit_reads", "hit_bytes", "miss_reads", "miss_bytes", "torn", "attached")
        return dict(zip(names, XSTATS.unpack_from(self.map, self.index_at + XINDEX.size)))

    def consumed(self):
        return list(struct.unpack_from(f"<{N}I", self.map, self.consumed_at))

    def close(self):
        self.stopping = True
        self.thread.join()
        self.sock.close()
        self.map.close()
        os.close(self.fd)


def file_sample(h5path, data_offset, k):
    with open(h5path, "rb") as f:
        f.seek(data_offset + k * S)
        return f.read(S)


def poison_sample(k):
    return bytes([(0xA5 + k) & 0xFF]) * S
