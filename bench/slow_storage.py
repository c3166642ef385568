#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Emulated shared storage: run a command with reads of the disk that holds the data capped by
the kernel, and count what it read from that disk.

    scripts/slow-storage --bandwidth 400M --iops 2000 --data d.h5 --evict -- CMD ARGS...

CMD and everything it starts run in a fresh cgroup whose reads of the disk holding --data are
capped (cgroup v1 blkio.throttle.read_{bps,iops}_device, or cgroup v2 io.max: whichever this
machine has). Page-cache hits are not throttled: --evict drops --data's
cached pages first, so the first read of every byte comes from the "storage". At the end it
prints the bytes and requests the cgroup read from that disk (the kernel's own counter, an
independent check of what a loader says it read) and, with --json FILE, writes them.

Needs root and one of the two controllers; otherwise it says which is missing and exits 2,
unless --unthrottled asks to run CMD without a cap (then nothing is counted either).

Also a module: bench/pytorch_io.py and bench/sweep use Throttle directly.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

V1_ROOT = "/sys/fs/cgroup/blkio"
V2_ROOTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class Unavailable(RuntimeError):
    """No way to cap reads here (not root, or no blkio/io controller)."""


def parse_size(text, what):
    """400M, 1.5G, 2000, 4K -> bytes (K/M/G are powers of 1024; a plain number is bytes)."""
    t = str(text).strip()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    try:
        if t and t[-1].upper() in mult:
            v = float(t[:-1]) * mult[t[-1].upper()]
        else:
            v = float(t)
    except ValueError:
        raise ValueError(f"{what}: '{text}' is not a size (e.g. 400M, 1.5G, 65536)") from None
    if v < 1 or v != v or v > 2**62:
        raise ValueError(f"{what}: '{text}' must be at least 1")
    return int(v)


def disk_of(path):
    """MAJ:MIN of the whole disk holding `path` (a partition's parent: throttles apply to disks)."""
    dev = os.stat(path).st_dev
    majmin = f"{os.major(dev)}:{os.minor(dev)}"
    sysdev = f"/sys/dev/block/{majmin}"
    if not os.path.exists(sysdev):
        raise Unavailable(f"{path} is on device {majmin}, which is not a block device (tmpfs, "
                          "overlay or network file system?): its reads cannot be capped; put the "
                          "data on a local disk")
    if os.path.exists(os.path.join(sysdev, "partition")):
        with open(os.path.join(os.path.realpath(os.path.join(sysdev, "..")), "dev")) as f:
            majmin = f.read().strip()
    return majmin


def evict(path):
    """Drops `path`'s pages from the page cache (written pages are flushed first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _v2_root():
    for root in V2_ROOTS:
        ctl = os.path.join(root, "cgroup.controllers")
        if os.path.exists(ctl):
            with open(ctl) as f:
                if "io" in f.read().split():
                    return root
    return None


class Throttle:
    """A cgroup capping reads of one disk at `bps` bytes/s (and `iops` requests/s).

    enter() (a preexec_fn) puts the calling process in it; counters() reads what its processes
    read from the disk; close() removes it once its processes are gone."""

    def __init__(self, data_path, bps, iops=None):
        if os.geteuid() != 0:
            raise Unavailable("capping reads needs root (it creates a cgroup)")
        self.majmin = disk_of(data_path)
        self.bps, self.iops = int(bps), (int(iops) if iops else None)
        if os.path.isfile(os.path.join(V1_ROOT, "blkio.throttle.read_bps_device")):
            self.kind = "cgroup v1 blkio"
            self.dir = tempfile.mkdtemp(prefix="solar-slow-", dir=V1_ROOT)
            self._write("blkio.throttle.read_bps_device", f"{self.majmin} {self.bps}")
            if self.iops:
                self._write("blkio.throttle.read_iops_device", f"{self.majmin} {self.iops}")
        else:
            root = _v2_root()
            if root is None:
                raise Unavailable(f"no cgroup controller can cap reads here: neither cgroup v1 "
                                  f"blkio ({V1_ROOT}) nor cgroup v2 io (cgroup.controllers under "
                                  f"{' or '.join(V2_ROOTS)}) is available")
            self.kind = "cgroup v2 io.max"
            with open(os.path.join(root, "cgroup.subtree_control"), "w") as f:
                f.write("+io")
            self.dir = tempfile.mkdtemp(prefix="solar-slow-", dir=root)
            limits = f"rbps={self.bps}" + (f" riops={self.iops}" if self.iops else "")
            self._write("io.max", f"{self.majmin} {limits}")
        self.start = self.counters()

    def add_device(self, majmin, rbps, wbps=None):
        """Caps a second disk too (the local tier's emulated NVMe): reads at `rbps`, writes at
        `wbps` bytes/s."""
        if self.kind.startswith("cgroup v1"):
            self._write("blkio.throttle.read_bps_device", f"{majmin} {int(rbps)}")
            if wbps:
                self._write("blkio.throttle.write_bps_device", f"{majmin} {int(wbps)}")
        else:
            self._write("io.max", f"{majmin} rbps={int(rbps)}"
                        + (f" wbps={int(wbps)}" if wbps else ""))

    def device_counters(self, majmin):
        """{read_bytes, write_bytes} of the cgroup's processes on disk `majmin` so far."""
        out = {"read_bytes": 0, "write_bytes": 0}
        if self.kind.startswith("cgroup v1"):
            with open(os.path.join(self.dir, "blkio.throttle.io_service_bytes_recursive")) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) == 3 and parts[0] == majmin and parts[1] in ("Read", "Write"):
                        out[f"{parts[1].lower()}_bytes"] = int(parts[2])
            return out
        with open(os.path.join(self.dir, "io.stat")) as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] == majmin:
                    kv = dict(p.split("=", 1) for p in parts[1:])
                    out = {"read_bytes": int(kv.get("rbytes", 0)),
                           "write_bytes": int(kv.get("wbytes", 0))}
        return out

    def _write(self, name, text):
        with open(os.path.join(self.dir, name), "w") as f:
            f.write(text)

    def describe(self):
        return (f"reads of disk {self.majmin} capped at {self.bps / 2**20:.0f} MiB/s"
                + (f", {self.iops} IOPS" if self.iops else "") + f" ({self.kind})")

    def enter(self):
        """preexec_fn: the child (and all it starts) joins the cgroup."""
        with open(os.path.join(self.dir, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def counters(self):
        """(bytes, requests) read from the disk by the cgroup's processes so far."""
        if self.kind.startswith("cgroup v1"):
            def read_stat(name):
                with open(os.path.join(self.dir, name)) as f:
                    for line in f:
                        parts = line.split()
                        if len(parts) == 3 and parts[0] == self.majmin and parts[1] == "Read":
                            return int(parts[2])
                return 0
            return (read_stat("blkio.throttle.io_service_bytes_recursive"),
                    read_stat("blkio.throttle.io_serviced_recursive"))
        with open(os.path.join(self.dir, "io.stat")) as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] == self.majmin:
                    kv = dict(p.split("=", 1) for p in parts[1:])
                    return int(kv.get("rbytes", 0)), int(kv.get("rios", 0))
        return 0, 0

    def read_since_start(self):
        b, n = self.counters()
        return b - self.start[0], n - self.start[1]

    def pids(self):
        with open(os.path.join(self.dir, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]

    def close(self):
        """Removes the cgroup. Processes CMD left behind in it are ours: after 2 s SIGTERM, after
        5 s SIGKILL."""
        if not self.dir:
            return
        t0 = time.monotonic()
        while self.pids():
            waited = time.monotonic() - t0
            if waited > 10:
                raise RuntimeError(f"slow-storage: processes {self.pids()} do not leave {self.dir}")
            if waited > 2:
                for pid in self.pids():
                    try:
                        os.kill(pid, signal.SIGKILL if waited > 5 else signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            time.sleep(0.05)
        os.rmdir(self.dir)
        self.dir = None


class LocalDisk:
    """An emulated node-local disk (the local tier's NVMe) of its own, apart from the storage's:
    an ext4 file system on a loop device whose image lies in memory (/dev/shm), so that what it
    reads and writes never touches the storage's disk, mounted on `mountpoint` (created, mode
    1777 like a site's local_dir). Its own cap is set on the cgroup with Throttle.add_device.
    close() unmounts it and removes the device and the image."""

    def __init__(self, mountpoint, size):
        if os.geteuid() != 0:
            raise Unavailable("an emulated local disk needs root (losetup, mount)")
        self.mountpoint, self.dev, self.image, self.mounted = str(mountpoint), None, None, False
        try:
            fd, self.image = tempfile.mkstemp(prefix="solar-local-disk-", dir="/dev/shm")
            os.ftruncate(fd, int(size))
            os.close(fd)
            self.dev = self._run("losetup", "--find", "--show", self.image).strip()
            self._run("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                      self.dev)
            os.makedirs(self.mountpoint, exist_ok=True)
            self._run("mount", self.dev, self.mountpoint)
            self.mounted = True
            os.chmod(self.mountpoint, 0o1777)
            st = os.stat(self.dev)
            self.majmin = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _run(*cmd):
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise Unavailable(f"{' '.join(cmd)}: {p.stderr.strip() or p.returncode}")
        return p.stdout

    def close(self):
        if self.mounted:
            subprocess.run(["umount", self.mountpoint], capture_output=True)
            self.mounted = False
        if self.dev:
            subprocess.run(["losetup", "-d", self.dev], capture_output=True)
            self.dev = None
        if self.image:
            try:
                os.unlink(self.image)
            except FileNotFoundError:
                pass
            self.image = None


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="slow-storage",
        description="Run CMD with reads of the disk holding --data capped by the kernel "
                    "(emulated shared storage) and report what it read from that disk.",
        epilog="Example: scripts/slow-storage --bandwidth 400M --iops 2000 --data d.h5 --evict "
               "-- solar run -n 4 --dataset d.h5 --buffer 64%% --epochs 3 --batch 16 -- "
               "solar-example-train")
    ap.add_argument("--bandwidth", metavar="BYTES/S", help="read bandwidth cap, e.g. 400M")
    ap.add_argument("--iops", metavar="N", type=int, help="read requests per second cap, e.g. 2000")
    ap.add_argument("--data", metavar="PATH", default=".",
                    help="a file on the disk to cap (the dataset) [the current folder's disk]")
    ap.add_argument("--evict", action="store_true",
                    help="drop --data's pages from the page cache first (cold start)")
    ap.add_argument("--json", metavar="FILE", help="also write the counts as JSON here")
    ap.add_argument("--local-dir", metavar="DIR",
                    help="also emulate a node-local disk (NVMe) of its own, mounted on DIR: ext4 "
                         "on a loop device whose image is in /dev/shm, reads and writes capped "
                         "by --local-bandwidth; for --local-dir of solar run")
    ap.add_argument("--local-size", metavar="BYTES", default="1G",
                    help="the emulated local disk's size [1G]")
    ap.add_argument("--local-bandwidth", metavar="BYTES/S", default="2G",
                    help="its read and write cap [2G]")
    ap.add_argument("--unthrottled", action="store_true",
                    help="run CMD without a cap (where no controller exists); nothing is counted")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("give the command to run after --")
    if not os.path.exists(a.data):
        ap.error(f"--data {a.data}: no such file or folder")
    try:
        bps = parse_size(a.bandwidth, "--bandwidth") if a.bandwidth else None
    except ValueError as e:
        ap.error(str(e))
    if a.iops is not None and a.iops < 1:
        ap.error("--iops must be at least 1")
    if not a.unthrottled and bps is None and a.iops is None:
        ap.error("give --bandwidth and/or --iops (or --unthrottled)")
    try:
        local_size = parse_size(a.local_size, "--local-size")
        local_bps = parse_size(a.local_bandwidth, "--local-bandwidth")
    except ValueError as e:
        ap.error(str(e))
    if a.local_dir and a.unthrottled:
        ap.error("--local-dir emulates a capped local disk: drop --unthrottled")
    if a.local_dir and os.path.exists(a.local_dir) and os.listdir(a.local_dir):
        ap.error(f"--local-dir {a.local_dir}: not empty; give a new or empty folder to mount on")
    if a.evict and os.path.isfile(a.data):
        evict(a.data)

    throttle = None
    if not a.unthrottled:
        try:
            # A bandwidth cap is needed by both controllers' syntax; IOPS alone gets a huge one.
            throttle = Throttle(a.data, bps or 2**50, a.iops)
        except Unavailable as e:
            print(f"slow-storage: {e}; run with --unthrottled to go on without a cap",
                  file=sys.stderr)
            return 2
        print(f"slow-storage: {throttle.describe()}", file=sys.stderr, flush=True)
    local = None
    if a.local_dir:
        try:
            local = LocalDisk(a.local_dir, local_size)
            throttle.add_device(local.majmin, local_bps, local_bps)
        except Unavailable as e:
            if local:
                local.close()
            throttle.close()
            print(f"slow-storage: {e}", file=sys.stderr)
            return 2
        print(f"slow-storage: local disk {local.dev} ({local_size / 2**20:.0f} MiB) on "
              f"{a.local_dir}, reads and writes capped at {local_bps / 2**20:.0f} MiB/s",
              file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, preexec_fn=throttle.enter if throttle else None)
    except OSError as e:
        if throttle:
            throttle.close()
        if local:
            local.close()
        print(f"slow-storage: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
        return 127
    # Ctrl-C / SIGTERM go to CMD; we wait for it and clean up.
    forward = lambda sig, _frame: proc.send_signal(sig)  # noqa: E731
    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc = proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    wall = time.monotonic() - t0
    result = {"command": cmd, "returncode": rc, "wall_s": round(wall, 4)}
    if throttle:
        nbytes, nreq = throttle.read_since_start()
        if local:
            result["local"] = dict(throttle.device_counters(local.majmin), disk=local.majmin,
                                   cap_bytes_per_s=local_bps)
            print(f"slow-storage: local disk {local.majmin}: read "
                  f"{result['local']['read_bytes'] / 2**20:.1f} MiB, wrote "
                  f"{result['local']['write_bytes'] / 2**20:.1f} MiB", file=sys.stderr)
            local.close()
        throttle.close()
        result.update(disk=throttle.majmin, controller=throttle.kind, cap_bytes_per_s=bps,
                      cap_iops=a.iops, read_bytes=nbytes, read_requests=nreq)
        print(f"slow-storage: read {nbytes / 2**20:.1f} MiB in {nreq} requests from disk "
              f"{throttle.majmin} in {wall:.2f} s", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main())
