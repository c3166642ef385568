# SPDX-License-Identifier: Apache-2.0
"""Processes, by PID and start time (a recycled PID is never signalled), the counts the leak checks
compare, the faults that last a while (`Undo`: undone however the soak ends) and the blkio
cgroups the slow_storage fault moves readers into."""
import os
import subprocess
import threading
import time
from collections import defaultdict
from soak_env import log


def proc_stat(pid):
    """(ppid, comm, state, starttime) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except OSError:
        return None
    comm = s[s.index("(") + 1:s.rindex(")")]
    rest = s[s.rindex(")") + 2:].split()
    return int(rest[1]), comm, rest[0], int(rest[19])


def proc_table():
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st:
                out[int(d)] = st
    return out


def descendants(root, table):
    kids = defaultdict(list)
    for pid, st in table.items():
        kids[st[0]].append(pid)
    out, todo = [], [root]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class Pid:
    """A process known by PID and start time, so a recycled PID is never signalled."""

    def __init__(self, pid, start, comm):
        self.pid, self.start, self.comm = pid, start, comm

    def alive(self):
        st = proc_stat(self.pid)
        return st is not None and st[3] == self.start and st[2] != "Z"

    def signal(self, sig):
        if not self.alive():
            return False
        try:
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def __repr__(self):
        return f"{self.comm}[{self.pid}]"


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def status_field(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def wait_until(pred, timeout, step=0.05):
    end = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(step)


def shm_solar():
    try:
        return {e for e in os.listdir("/dev/shm") if "solar" in e.lower()}
    except OSError:
        return set()


def run(*args, timeout=600, **kw):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout}\n"
                           f"{p.stderr}")
    return p



class Undo:
    """Restorations pending (SIGCONT of a stopped process, a hog to stop, a cgroup to empty)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items = {}
        self.next = 0

    def push(self, fn):
        with self.lock:
            self.next += 1
            self.items[self.next] = fn
            return self.next

    def pop(self, key):
        with self.lock:
            fn = self.items.pop(key, None)
        if fn:
            fn()

    def all(self):
        with self.lock:
            keys = list(self.items)
        for k in keys:
            try:
                self.pop(k)
            except Exception as e:  # noqa: BLE001 - clean-up goes on
                log(f"clean-up: {e}")


BLKIO_ROOT = "/sys/fs/cgroup/blkio/cgroup.procs"


def blkio_cgroup(pid):
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, ctl, path = line.strip().split(":", 2)
                if "blkio" in ctl.split(","):
                    return path
    except OSError:
        pass
    return None


def move_to_cgroup(procs_file, pids):
    for p in pids:
        if not p.alive():
            continue
        try:
            with open(procs_file, "w") as f:
                f.write(str(p.pid))
        except OSError:
            pass
