# SPDX-License-Identifier: Apache-2.0
"""An unmodified rank for the transparent mode's probe findings (issue 32): plain os.pread and
libc stdio through ctypes, no solar import; run under `solar run --transparent` once the agent
holds the whole dataset. Prints 'ok NAME' or 'WRONG NAME: ...' per check and exits 1 on any
WRONG. Bytes "from the file" are read through a read-write fd, which the interposer never serves.

usage: transparent_probe.py MODE DATASET OTHER DATA_OFFSET SAMPLE_BYTES
  agent-killed  read sample 5; SIGKILL the node agent; rewrite the sample in place (the mtime
                put back); read it through the same fd, a new fd and a forked child; then delete
                the file, write another under its name (ext4 often reuses the inode number) and
                read it
  fclose        fdopen + fclose the dataset's fd (glibc closes it inside, unseen by the
                interposer); fopen OTHER takes the number; pread it at three resident samples
"""
import ctypes
import os
import signal
import socket
import struct
import sys
import time

mode, data, other = sys.argv[1], sys.argv[2], sys.argv[3]
offset, S = int(sys.argv[4]), int(sys.argv[5])
wrong = 0


def check(name, got, want):
    global wrong
    if got == want:
        print(f"ok {name}", flush=True)
    else:
        wrong += 1
        how = "the old bytes" if got == check.old else "other bytes"
        print(f"WRONG {name}: {how} ({len(got)} of {len(want)} bytes)", flush=True)


check.old = None


def at(k):
    return offset + k * S


def file_bytes(path, k):
    fd = os.open(path, os.O_RDWR)  # read-write: never tracked, so never served
    try:
        return os.pread(fd, S, at(k))
    finally:
        os.close(fd)


def agent_pid():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(os.environ["SOLAR_SOCKET"])
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        return pid
    finally:
        s.close()


def dead(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):  # reaped before the open, or the read
        return True


def read_in_child(fd, k):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a DataLoader worker would be forked like this
        os.close(r)
        os.write(w, os.pread(fd, S, at(k)))
        os._exit(0)
    os.close(w)
    got = b""
    while chunk := os.read(r, S):
        got += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return got


def agent_killed():
    k = 5
    fd = os.open(data, os.O_RDONLY)
    check.old = file_bytes(data, k)
    check("before: sample 5", os.pread(fd, S, at(k)), check.old)
    pid = agent_pid()
    os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 30
    while not dead(pid):
        if time.monotonic() > end:
            sys.exit("transparent_probe: the agent did not die within 30 s")
        time.sleep(0.01)
    print(f"killed agent {pid}", flush=True)
    # In place: the same inode and size; the mtime put back, so only the ctime tells.
    st = os.stat(data)
    new = bytes(b ^ 0xFF for b in check.old)
    raw = os.open(data, os.O_RDWR)
    os.pwrite(raw, new, at(k))
    os.fsync(raw)
    os.close(raw)
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    check("rewritten: same fd", os.pread(fd, S, at(k)), new)
    fd2 = os.open(data, os.O_RDONLY)
    check("rewritten: new fd", os.pread(fd2, S, at(k)), new)
    check("rewritten: forked child", read_in_child(fd, k), new)
    check("rewritten: sample 6 (unchanged)", os.pread(fd2, S, at(6)), file_bytes(data, 6))
    # A new file under the name, on the inode number the old one leaves.
    raw = os.open(data, os.O_RDWR)
    whole = bytearray(os.pread(raw, st.st_size, 0))
    os.close(raw)
    os.close(fd)
    os.close(fd2)
    ino = os.stat(data).st_ino
    os.unlink(data)
    whole[at(k):at(k) + S] = bytes(b ^ 0x55 for b in whole[at(k):at(k) + S])
    with open(data, "wb") as f:
        f.write(whole)
    print(f"new file: inode {'reused' if os.stat(data).st_ino == ino else 'not reused'}",
          flush=True)
    fd3 = os.open(data, os.O_RDONLY)
    check("new file: sample 5", os.pread(fd3, S, at(k)), bytes(whole[at(k):at(k) + S]))
    os.close(fd3)


def fclose():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fdopen.restype = libc.fopen.restype = ctypes.c_void_p
    libc.fdopen.argtypes = [ctypes.c_int, ctypes.c_char_p]
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = libc.fileno.argtypes = [ctypes.c_void_p]
    fd = os.open(data, os.O_RDONLY)
    check("dataset through its fd", os.pread(fd, S, at(5)), file_bytes(data, 5))
    f = libc.fdopen(fd, b"rb")
    if not f or libc.fclose(ctypes.c_void_p(f)) != 0:
        sys.exit("transparent_probe: fdopen/fclose failed")
    g = libc.fopen(other.encode(), b"rb")
    if not g:
        sys.exit("transparent_probe: fopen of OTHER failed")
    fd2 = libc.fileno(ctypes.c_void_p(g))
    if fd2 != fd:
        sys.exit(f"transparent_probe: fopen took fd {fd2}, not the freed {fd}")
    for k in (5, 6, 7):
        check.old = file_bytes(data, k)
        check(f"other file through the reused fd, sample {k}", os.pread(fd2, S, at(k)),
              file_bytes(other, k))
    libc.fclose(ctypes.c_void_p(g))


{"agent-killed": agent_killed, "fclose": fclose}[mode]()
sys.exit(1 if wrong else 0)
