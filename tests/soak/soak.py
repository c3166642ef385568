#!/usr/bin/python3
"""The soak: many short multi-node `solar run` jobs under a chaos driver, every sample checked.

    scripts/soak --minutes N [--json OUT] [--seed S] [--min-faults F] [--keep]

Jobs (each 10-40 s, chosen at random): solar-example-train --verify over an HDF5 file, the same
over `solar-stored` (fabric://), and an unmodified h5py + DistributedSampler script
(slurm_examples/train_h5py_ddp.py) under `solar run --transparent`; 2-3 simulated nodes of 1-2
ranks, small to whole-dataset buffers, rings or --zero-copy. While a job runs, a fault comes every 0.7-3 s:

  agent_kill      SIGKILL of one of the job's agents (also    the job succeeds (ranks read directly)
                  before it is ready)
  agent_stop      SIGSTOP of an agent for 0.5-6 s, SIGCONT    the job succeeds (SOLAR_AGENT_TIMEOUT=3)
  rank_kill       SIGKILL of one rank (at most one per job)   that rank fails: `solar run` exits 137
  stored_kill     SIGKILL of solar-stored, restarted on the   the job succeeds (reconnection)
                  same port 0.2-4 s later (fabric jobs)
  stored_stop     SIGSTOP of solar-stored for 0.5-6 s         the job succeeds
  slow_storage    the storage reader (the agents; solar-stored for fabric jobs) moved into a
                  cgroup capping its disk reads (bench/slow_storage.py's Throttle: 2 MiB/s, 200
                  IOPS) with the dataset's pages evicted, for 1-5 s            the job succeeds
  memory_pressure a process touching min(1 GiB, 25% of MemAvailable) for 1-5 s: the job succeeds

What is checked after every job:

- Samples. Batch jobs: each rank's --record file (step and sample ids of every batch it got)
  against the plan (`solar plan-dump` of --plan-out); each rank's --report `wrong` (every sample's
  bytes and label checked against `solar gen`'s content). lost = planned samples a rank did not
  get; duplicated = samples a rank got beyond the plan (twice, or at a step the plan does not
  give them); wrong = samples whose bytes differ. A killed rank is held to a prefix of its plan:
  what it got must be its first steps in order, nothing twice, nothing wrong; the steps after its
  death are not lost. Transparent jobs: each rank's per-batch SHA-256 of inputs and labels
  against a reference run of the same script without solar (made once per configuration).
- The exit status: 0, or 137 when a rank was killed.
- Leaks: every process the job started (seen under `solar run` while it ran) gone within 10 s;
  no run folder left under the job's TMPDIR; no new /dev/shm entry with "solar" in its name;
  solar-stored back to its file descriptors and threads within 10 s; the soak's own file
  descriptors back to where they were; at the end, solar-stored's RSS growth since its last
  start under 64 MiB.

The summary: jobs, faults injected (by kind), faults survived (those in jobs that passed every
check), samples checked, lost, duplicated, wrong, the longest stall (the ranks' own longest wait
for one batch, --report max_load_seconds; the agents' stall_max_wait_seconds from --stats-out;
transparent ranks: the longest pause between two batches), leaks. Exits 1 if any sample was
wrong, lost or duplicated, a job hung or ended with an unexpected status, anything leaked, or
fewer than --min-faults faults were injected.

Everything it starts is stopped by PID (never by name), also on failure and Ctrl-C.
"""
import argparse
import csv
import io
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("SOLAR_BIN_DIR") or os.path.join(ROOT, "build")
SOLAR = os.environ.get("SOLAR_BIN") or os.path.join(BUILD, "cli", "solar")
TRAIN = os.environ.get("SOLAR_EXAMPLE_TRAIN") or os.path.join(BUILD, "slurm_examples",
                                                              "solar-example-train")
STORED = os.environ.get("SOLAR_STORED") or os.path.join(BUILD, "storage", "solar-stored")
SCRIPT = os.path.join(ROOT, "slurm_examples", "train_h5py_ddp.py")
PY = "/usr/bin/python3"
sys.path.insert(0, os.path.join(ROOT, "bench"))
import slow_storage  # noqa: E402  (bench/slow_storage.py: Throttle, evict)

SAMPLES = {"tiny": 600, "small": 96}  # 4 KiB and 256 KiB samples
JOB_TIMEOUT_S = 240        # a job still running after this is a hang
GRACE_S = 10               # processes, descriptors, threads: back within this after a job
AGENT_TIMEOUT_S = 3        # SOLAR_AGENT_TIMEOUT of the ranks: a longer SIGSTOP makes them go direct
STORED_RSS_LIMIT = 64 << 20
STOPPING = threading.Event()  # set on the way out: no fault or restart starts after it
FAULTS = ("agent_kill", "agent_stop", "rank_kill", "stored_kill", "stored_stop", "slow_storage",
          "memory_pressure")


def log(msg):
    print(f"soak {time.strftime('%H:%M:%S')}: {msg}", file=sys.stderr, flush=True)


# ---- processes, by PID ---------------------------------------------------------------------------

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


# ---- the long-lived solar-stored -----------------------------------------------------------------

class Stored:
    def __init__(self, workdir, exports):
        self.workdir, self.exports = workdir, exports
        self.proc, self.addr, self.starts, self.log_file = None, None, 0, None
        self.start("127.0.0.1:0")

    def start(self, listen):
        if STOPPING.is_set():
            raise RuntimeError("the soak is stopping: solar-stored is not restarted")
        self.starts += 1
        ready = os.path.join(self.workdir, f"stored-{self.starts}.ready")
        if self.log_file:
            self.log_file.close()
        self.log_path = os.path.join(self.workdir, "stored.log")
        self.log_file = open(self.log_path, "a")
        deadline = time.monotonic() + 15
        while True:
            args = [STORED, "--listen", listen, "--ready-file", ready]
            for name, path in self.exports.items():
                args += ["--export", f"{name}={path}"]
            self.proc = subprocess.Popen(args, stdout=self.log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True)
            ok = wait_until(lambda: self.proc.poll() is not None or
                            (os.path.exists(ready) and open(ready).read().strip()), 15)
            if ok and self.proc.poll() is None:
                break
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            if time.monotonic() > deadline:  # the port still taken, or it cannot start
                raise RuntimeError(f"solar-stored does not start on {listen}: see {self.log_path}")
            time.sleep(0.3)
        self.addr = open(ready).read().strip()
        st = proc_stat(self.proc.pid)
        self.pid = Pid(self.proc.pid, st[3], "solar-stored")
        time.sleep(0.2)
        self.base_fds = fd_count(self.proc.pid)
        self.base_threads = status_field(self.proc.pid, "Threads")
        self.base_rss = status_field(self.proc.pid, "VmRSS") * 1024
        self.max_rss_growth = 0

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def kill(self):
        self.pid.signal(signal.SIGCONT)
        self.pid.signal(signal.SIGKILL)
        self.proc.wait()

    def restart(self):
        self.start(self.addr)

    def idle_check(self):
        """(fds, threads) in excess of the baseline once every client has left, or None."""
        if not self.alive():
            return None
        ok = wait_until(lambda: (fd_count(self.proc.pid) or 0) <= self.base_fds and
                        (status_field(self.proc.pid, "Threads") or 0) <= self.base_threads, GRACE_S)
        rss = (status_field(self.proc.pid, "VmRSS") or 0) * 1024
        self.max_rss_growth = max(self.max_rss_growth, rss - self.base_rss)
        if ok:
            return None
        return (fd_count(self.proc.pid) - self.base_fds,
                status_field(self.proc.pid, "Threads") - self.base_threads)

    def stop(self):
        if self.alive():
            self.pid.signal(signal.SIGCONT)
            self.pid.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.pid.signal(signal.SIGKILL)
                self.proc.wait()
        if self.log_file:
            self.log_file.close()
            self.log_file = None


# ---- faults that last a while: undone however the soak ends ---------------------------------------

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


# ---- jobs ------------------------------------------------------------------------------------------

class Job:
    def __init__(self, jid, kind, workdir, rng, datasets, stored):
        self.id, self.kind = jid, kind
        self.dir = os.path.join(workdir, f"job-{jid:04d}")
        self.tmp = os.path.join(self.dir, "tmp")
        os.makedirs(self.tmp)
        self.faults = []          # (kind, seconds into the job, detail)
        self.killed_rank = None   # (rank, Pid)
        self.seen = {}            # (pid, start) -> Pid of everything under solar run
        self.problems = []
        self.stalls = []          # ranks' longest waits
        self.gaps = {}            # rank -> longest pause between two record lines (transparent)
        if kind == "transparent":
            self.nodes, self.rpn = rng.choice([(2, 2), (2, 1), (3, 1)])
            self.data = datasets["tiny"]
            # The script has no compute of its own: 6 epochs make a job of 10-30 s here. One
            # seed, so that the reference runs without solar are few (one per shape).
            self.epochs, self.batch = 6, rng.choice([4, 6])
            self.seed = 3
            self.buffer = rng.choice(["30%", "60%", "100%"])
            self.compute_ms = 0
        else:
            self.nodes, self.rpn = rng.choice([(2, 1), (2, 2), (3, 1), (3, 2)])
            name = rng.choice(["tiny", "tiny", "small"])
            self.data = datasets[name]
            self.spec = self.data if kind == "hdf5" else f"fabric://{stored.addr}/{name}"
            self.epochs = rng.choice([2, 3, 4])
            self.batch = rng.choice([4, 6, 8]) if name == "tiny" else rng.choice([2, 3])
            self.seed = rng.randrange(1000)
            # 10% of the small set (9 samples of 256 KiB) is less than some shapes' rings need.
            self.buffer = rng.choice(["10%", "25%", "50%", "100%"] if name == "tiny" else
                                     ["25%", "50%", "100%"])
            self.zero_copy = rng.random() < 0.3  # cache slots pinned by the ranks, no rings
            n = self.nodes * self.rpn
            samples = SAMPLES[name]
            steps = self.epochs * math.ceil(samples / (n * self.batch))
            target = rng.uniform(8, 28)
            self.compute_ms = max(5, int(target * 1000 / steps))
        self.world = self.nodes * self.rpn
        self.zero_copy = getattr(self, "zero_copy", False)

    def describe(self):
        return (f"job {self.id} {self.kind} {self.nodes}x{self.rpn} epochs {self.epochs} batch "
                f"{self.batch} buffer {self.buffer}" + (" zero-copy" if self.zero_copy else "") +
                (f" compute {self.compute_ms} ms" if self.compute_ms else ""))

    def command(self):
        common = ["-n", self.world, "--nodes", self.nodes, "--buffer", self.buffer,
                  "--epochs", self.epochs, "--batch", self.batch, "--seed", self.seed]
        if self.kind == "transparent":
            return [SOLAR, "run", *common, "--dataset", self.data, "--transparent",
                    "--stats-out", os.path.join(self.dir, "stats.json"), "--",
                    PY, SCRIPT, self.data, "--epochs", self.epochs, "--batch", self.batch,
                    "--seed", self.seed, "--digests", os.path.join(self.dir, "digests-%r.txt")]
        return [SOLAR, "run", *common, "--dataset", self.spec,
                *(["--zero-copy"] if self.zero_copy else []),
                "--plan-out", os.path.join(self.dir, "plan"),
                "--stats-out", os.path.join(self.dir, "stats.json"), "--",
                TRAIN, "--verify", "--compute-ms", self.compute_ms,
                "--record", os.path.join(self.dir, "rank-%r.txt"),
                "--report", os.path.join(self.dir, "report-%r.json")]

    def progress_file(self, rank):
        name = f"digests-{rank}.txt" if self.kind == "transparent" else f"rank-{rank}.txt"
        return os.path.join(self.dir, name)


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for kv in f.read().split(b"\0"):
                if kv.startswith(b"RANK="):
                    return int(kv[5:])
    except (OSError, ValueError):
        pass
    return None


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.undo = Undo()
        self.stored = None
        self.current = None          # the running solar run (Popen)
        self.current_job = None
        self.throttles = []
        self.threads = None
        self.started = None
        self.references = {}
        self.totals = Counter()
        self.injected = Counter()
        self.survived = Counter()
        self.leaks = []
        self.failed_jobs = []
        self.longest = {"rank_wait_s": 0.0, "rank_wait_job": None,
                        "agent_stall_max_wait_s": 0.0, "agent_stall_job": None,
                        "transparent_gap_s": 0.0, "transparent_gap_job": None}

    # -- set-up --
    def setup(self):
        base = os.environ.get("TMPDIR") or "/tmp"
        self.workdir = tempfile.mkdtemp(prefix="solar-soak-", dir=base)
        log(f"working in {self.workdir}")
        self.datasets = {}
        for name, preset in (("tiny", "tiny"), ("small", "small")):
            n = SAMPLES[name]
            path = os.path.join(self.workdir, f"{name}.h5")
            run(SOLAR, "gen", path, "--samples", n, "--preset", preset, "--seed", "7",
                "--no-progress")
            self.datasets[name] = path
        self.stored = Stored(self.workdir, self.datasets)
        self.base_fds = fd_count(os.getpid())
        self.shm_before = shm_solar()

    def reference(self, job):
        """Per-rank digests of the transparent script run without solar (no agent, no
        interposer), computed once per configuration."""
        key = (job.world, job.nodes, job.epochs, job.batch, job.seed)
        if key in self.references:
            return self.references[key]
        d = os.path.join(self.workdir, "ref-" + "-".join(map(str, key)))
        os.makedirs(os.path.join(d, "tmp"))
        env = dict(os.environ, TMPDIR=os.path.join(d, "tmp"))
        run(SOLAR, "run", "-n", job.world, "--nodes", job.nodes, "--dataset", job.data,
            "--buffer", "100%", "--epochs", job.epochs, "--batch", job.batch, "--seed",
            job.seed, "--no-agent", "--", PY, SCRIPT, job.data, "--epochs", job.epochs,
            "--batch", job.batch, "--seed", job.seed, "--digests",
            os.path.join(d, "digests-%r.txt"), env=env)
        ref = {}
        per_rank = math.ceil(SAMPLES["tiny"] / job.world)  # DistributedSampler pads to this
        sizes = [min(job.batch, per_rank - i) for i in range(0, per_rank, job.batch)]
        for r in range(job.world):
            lines = read_digests(os.path.join(d, f"digests-{r}.txt"))
            if len(lines) != job.epochs * len(sizes):
                raise RuntimeError(f"the reference run wrote {len(lines)} batches for rank {r}, "
                                   f"not {job.epochs * len(sizes)}")
            ref[r] = [(k, v, sizes[k[1] - 1]) for k, v, _ in lines]
        self.references[key] = ref
        return ref

    # -- one job --
    def run_job(self, jid):
        kind = self.rng.choices(["hdf5", "fabric", "transparent"], weights=[4, 4, 2])[0]
        job = Job(jid, kind, self.workdir, self.rng, self.datasets, self.stored)
        if kind == "transparent":
            self.reference(job)
        if kind == "fabric" and not self.stored.alive():
            self.stored.restart()
        env = dict(os.environ, TMPDIR=job.tmp, SOLAR_AGENT_TIMEOUT=str(AGENT_TIMEOUT_S))
        shm0 = shm_solar()
        out = open(os.path.join(job.dir, "out.txt"), "w")
        err = open(os.path.join(job.dir, "err.txt"), "w")
        t0 = time.monotonic()
        self.current_job = job
        self.current = subprocess.Popen([str(c) for c in job.command()], stdout=out, stderr=err,
                                        env=env, start_new_session=True)
        root = self.current
        st = proc_stat(root.pid)
        job.root = Pid(root.pid, st[3] if st else -1, "solar")
        done = threading.Event()
        chaos = threading.Thread(target=self.chaos, args=(job, done, t0), daemon=True)
        monitor = threading.Thread(target=self.monitor, args=(job, done), daemon=True)
        self.threads = (done, chaos, monitor)
        monitor.start()
        chaos.start()
        hung = False
        try:
            rc = root.wait(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            hung = True
            job.problems.append(f"hung: still running after {JOB_TIMEOUT_S} s; processes: " +
                                self.process_states(job))
            self.stop_job(job)
            rc = root.wait()
        job.seconds = time.monotonic() - t0
        done.set()
        chaos.join()
        monitor.join()
        self.current = None
        out.close()
        err.close()
        self.undo.all()  # nothing of the chaos outlives its job
        job.rc = rc
        expected = 128 + signal.SIGKILL if job.killed_rank else 0
        if not hung and rc != expected:
            job.problems.append(f"exit status {rc}, expected {expected}")
        counts = self.check_samples(job)
        self.check_leaks(job, shm0)
        self.record(job, counts)
        self.current_job = None
        return job

    def stop_job(self, job):
        """A hung or interrupted job: solar run gets SIGTERM (it stops its ranks and agents),
        then everything seen under it SIGKILL, by PID."""
        for p in list(job.seen.values()):
            p.signal(signal.SIGCONT)
        job.root.signal(signal.SIGTERM)
        if self.current and not wait_until(lambda: self.current.poll() is not None, 10):
            job.root.signal(signal.SIGKILL)
        for p in list(job.seen.values()):
            p.signal(signal.SIGKILL)

    def process_states(self, job):
        out = []
        for p in job.seen.values():
            st = proc_stat(p.pid)
            if st and st[3] == p.start:
                try:
                    wchan = open(f"/proc/{p.pid}/wchan").read()
                except OSError:
                    wchan = "?"
                out.append(f"{p} state {st[2]} wchan {wchan}")
        return "; ".join(out) or "none"

    def monitor(self, job, done):
        """Everything under solar run, and the pauses of the ranks' progress."""
        last = {}
        while not done.is_set():
            table = proc_table()
            for pid in descendants(job.root.pid, table):
                st = table[pid]
                job.seen.setdefault((pid, st[3]), Pid(pid, st[3], st[1]))
            if job.kind == "transparent":
                now = time.monotonic()
                for r in range(job.world):
                    n = count_lines(job.progress_file(r))
                    if n == 0:
                        continue
                    prev = last.get(r)
                    if prev is None or n != prev[0]:
                        if prev is not None:
                            job.gaps[r] = max(job.gaps.get(r, 0), now - prev[1])
                        last[r] = (n, now)
            done.wait(0.1)

    def job_procs(self, job, name):
        table = proc_table()
        out = []
        for pid in descendants(job.root.pid, table):
            st = table[pid]
            if st[1].startswith(name[:15]) and st[2] != "Z":
                out.append(Pid(pid, st[3], st[1]))
        return out

    # -- the chaos driver --
    def chaos(self, job, done, t0):
        rng = random.Random(self.rng.random())
        kinds = ["agent_kill", "agent_stop", "rank_kill", "slow_storage", "memory_pressure"]
        weights = [3, 3, 1, 2, 1]
        if job.kind == "fabric":
            kinds += ["stored_kill", "stored_stop"]
            weights += [3, 2]
        while not done.wait(rng.uniform(0.7, 3.0)) and not STOPPING.is_set():
            kind = rng.choices(kinds, weights=weights)[0]
            try:
                detail = getattr(self, "fault_" + kind)(job, rng, done)
            except Exception as e:  # noqa: BLE001 - a fault that cannot be injected is skipped
                detail = None
                log(f"job {job.id}: {kind} not injected: {e}")
            if detail is not None:
                job.faults.append((kind, round(time.monotonic() - t0, 1), detail))
                self.injected[kind] += 1

    def fault_agent_kill(self, job, rng, done):
        # At any moment, also before the agent is ready: `solar run` then starts its ranks
        # reading directly (it failed the whole job until the 30-minute soak of 1 Dec 2026 found
        # it: "the agent of node N exited (137) before it was ready").
        agents = self.job_procs(job, "solar-agent")
        if not agents:
            return None
        victim = rng.choice(agents)
        return str(victim) if victim.signal(signal.SIGKILL) else None

    def fault_agent_stop(self, job, rng, done):
        agents = self.job_procs(job, "solar-agent")
        if not agents:
            return None
        victim = rng.choice(agents)
        secs = self.pause(victim, rng)
        return f"{victim} {secs:.1f} s" if secs else None

    def pause(self, victim, rng):
        """SIGSTOP for 0.5-6 s, then SIGCONT (also if the soak is stopped meanwhile): the
        seconds, or None if it was already gone."""
        secs = rng.uniform(0.5, 6)
        if not victim.signal(signal.SIGSTOP):
            return None
        key = self.undo.push(lambda: victim.signal(signal.SIGCONT))
        time.sleep(secs)
        self.undo.pop(key)
        return secs

    def fault_rank_kill(self, job, rng, done):
        if job.killed_rank:
            return None
        name = "python3" if job.kind == "transparent" else "solar-example-train"
        # Ranks are solar run's own children (a DataLoader worker would be a grandchild).
        ranks = [p for p in self.job_procs(job, name) if proc_stat(p.pid)[0] == job.root.pid]
        if len(ranks) < 2:  # one rank left: killing it tells nothing about the others
            return None
        victim = rng.choice(ranks)
        rank = rank_of(victim.pid)
        if rank is None or not victim.signal(signal.SIGKILL):
            return None
        job.killed_rank = (rank, victim)
        return f"rank {rank} {victim}"

    def ranks_started(self, job):
        """solar run has planned (from the server) and launched its ranks: before that, a server
        away is solar run's own start-up error, which is not what is tested here."""
        name = "python3" if job.kind == "transparent" else "solar-example-train"
        return bool(self.job_procs(job, name))

    def fault_stored_kill(self, job, rng, done):
        if not self.stored.alive() or not self.ranks_started(job):
            return None
        self.stored.kill()
        away = rng.uniform(0.2, 4)
        time.sleep(away)
        self.stored.restart()
        return f"away {away:.1f} s"

    def fault_stored_stop(self, job, rng, done):
        if not self.stored.alive() or not self.ranks_started(job):
            return None
        secs = self.pause(self.stored.pid, rng)
        return f"{secs:.1f} s" if secs else None

    def fault_slow_storage(self, job, rng, done):
        if job.kind == "fabric":
            if not self.stored.alive():
                return None
            readers = [self.stored.pid]
        else:
            readers = self.job_procs(job, "solar-agent")
        if not readers:
            return None
        secs = rng.uniform(1, 5)
        throttle = slow_storage.Throttle(job.data, 2 << 20, 200)
        self.throttles.append(throttle.dir)
        origin = {p.pid: blkio_cgroup(p.pid) for p in readers}

        def restore():
            for p in readers:
                path = origin.get(p.pid) or "/"
                move_to_cgroup(os.path.join("/sys/fs/cgroup/blkio", path.lstrip("/"),
                                            "cgroup.procs"), [p])
            throttle.close()

        key = self.undo.push(restore)
        move_to_cgroup(os.path.join(throttle.dir, "cgroup.procs"), readers)
        slow_storage.evict(job.data)
        time.sleep(secs)
        self.undo.pop(key)
        return f"{'+'.join(map(str, readers))} {secs:.1f} s"

    def fault_memory_pressure(self, job, rng, done):
        avail = 0
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
        size = min(1 << 30, avail // 4)
        secs = rng.uniform(1, 5)
        code = ("import mmap,sys,time\nn=int(sys.argv[1])\nm=mmap.mmap(-1,n)\nc=b'\\1'*(1<<24)\n"
                "for o in range(0,n,len(c)): m[o:o+min(len(c),n-o)]=c[:min(len(c),n-o)]\n"
                "sys.stdout.write('x\\n'); sys.stdout.flush(); time.sleep(float(sys.argv[2]))\n")
        hog = subprocess.Popen([PY, "-c", code, str(size), str(secs)], stdout=subprocess.PIPE,
                               start_new_session=True)
        hp = Pid(hog.pid, proc_stat(hog.pid)[3], "hog")

        def stop():
            hp.signal(signal.SIGKILL)
            hog.wait()
            hog.stdout.close()

        key = self.undo.push(stop)
        hog.stdout.readline()  # touched
        hog.wait(timeout=secs + 30)
        self.undo.pop(key)
        return f"{size >> 20} MiB {secs:.1f} s"

    # -- checks --
    def check_samples(self, job):
        c = Counter()
        killed = job.killed_rank[0] if job.killed_rank else None
        err = open(os.path.join(job.dir, "err.txt")).read()
        if job.kind == "transparent":
            ref = self.reference(job)
            for r in range(job.world):
                got = read_digests(job.progress_file(r))
                self.compare_digests(job, r, ref[r], got, r == killed, c)
            for r, g in job.gaps.items():
                if g > self.longest["transparent_gap_s"]:
                    self.longest["transparent_gap_s"], self.longest["transparent_gap_job"] = g, job.id
            return c
        if not os.path.exists(os.path.join(job.dir, "plan")):
            job.problems.append("solar run wrote no plan: " + " | ".join(err.splitlines()[-3:]))
            return c
        plan = plan_sequences(os.path.join(job.dir, "plan"))
        for r in range(job.world):
            got = read_record(job.progress_file(r))
            expected = plan.get(r, {})
            self.compare_record(job, r, expected, got, r == killed, c)
            report = os.path.join(job.dir, f"report-{r}.json")
            if os.path.exists(report):
                rep = json.load(open(report))
                c["wrong"] += rep["wrong"]
                if rep["samples"] != sum(len(s) for _, s in got):
                    job.problems.append(f"rank {r}: report says {rep['samples']} samples, its "
                                        f"record {sum(len(s) for _, s in got)}")
                if rep["max_load_seconds"] > self.longest["rank_wait_s"]:
                    self.longest["rank_wait_s"] = rep["max_load_seconds"]
                    self.longest["rank_wait_job"] = job.id
            else:
                # No report (the rank died): its own complaints are all there is.
                c["wrong"] += sum(1 for line in err.splitlines()
                                  if line.startswith(f"rank {r}: ") and
                                  ("wrong content" in line or "differs" in line))
                if r != killed:
                    job.problems.append(f"rank {r} wrote no report")
        try:
            stats = json.load(open(os.path.join(job.dir, "stats.json")))
            for n in stats.get("nodes", []):
                w = (n.get("totals") or {}).get("stall_max_wait_seconds") or 0
                if w > self.longest["agent_stall_max_wait_s"]:
                    self.longest["agent_stall_max_wait_s"], self.longest["agent_stall_job"] = w, job.id
        except (OSError, ValueError):
            pass  # a killed agent writes none; solar run may write none then
        return c

    def compare_record(self, job, rank, expected, got, killed, c):
        got_steps = defaultdict(list)
        order = []
        for step, samples in got:
            got_steps[step].extend(samples)
            order.append(step)
        c["checked"] += sum(len(s) for _, s in got)
        last = max(order) if order else -1
        for step, samples in expected.items():
            want, have = Counter(samples), Counter(got_steps.get(step, []))
            missing = sum((want - have).values())
            if killed and step > last:
                c["not_received_killed"] += missing
                continue
            if missing:
                c["lost"] += missing
                job.problems.append(f"rank {rank}: {missing} samples of step {step} lost")
        for step, samples in got_steps.items():
            extra = sum((Counter(samples) - Counter(expected.get(step, []))).values())
            if extra:
                c["duplicated"] += extra
                job.problems.append(f"rank {rank}: {extra} samples at step {step} beyond the plan")
        if order != sorted(order):
            job.problems.append(f"rank {rank}: steps out of order")

    def compare_digests(self, job, rank, ref, got, killed, c):
        ref_map = {k: v for k, v, _ in ref}
        size = {k: n for k, _, n in ref}
        seen = Counter()
        for k, v, _ in got:
            seen[k] += 1
            n = size.get(k, job.batch)
            if k not in ref_map or seen[k] > 1:
                c["duplicated"] += n
                job.problems.append(f"rank {rank}: batch {k} beyond the reference")
                continue
            c["checked"] += n
            if v != ref_map[k]:
                c["wrong"] += n
                job.problems.append(f"rank {rank}: batch {k} differs from the run without solar")
        last = max((i for i, (k, _, _) in enumerate(ref) if seen[k]), default=-1)
        for i, (k, _, n) in enumerate(ref):
            if seen[k]:
                continue
            if killed and i > last:
                c["not_received_killed"] += n
            else:
                c["lost"] += n
                job.problems.append(f"rank {rank}: batch {k} lost")

    def check_leaks(self, job, shm0):
        def leak(what):
            self.leaks.append({"job": job.id, "leak": what})
            job.problems.append("leak: " + what)

        # Every process seen under solar run (agents, ranks, their workers) gone.
        if not wait_until(lambda: not any(p.alive() for p in job.seen.values()), GRACE_S):
            left = [p for p in job.seen.values() if p.alive()]
            leak(f"processes left after the job: {left} ({self.process_states(job)})")
            for p in left:
                p.signal(signal.SIGCONT)
                p.signal(signal.SIGKILL)
        # No run folder under the job's TMPDIR.
        if not wait_until(lambda: not os.listdir(job.tmp), 2):
            leak(f"left under TMPDIR: {sorted(os.listdir(job.tmp))}")
        new_shm = shm_solar() - shm0 - self.shm_before
        if new_shm and wait_until(lambda: not (shm_solar() & new_shm), 2) is False:
            leak(f"/dev/shm entries left: {sorted(shm_solar() & new_shm)}")
        # solar-stored back to its descriptors and threads once its clients left.
        if self.stored.alive():
            extra = self.stored.idle_check()
            if extra:
                leak(f"solar-stored holds {extra[0]} more file descriptors and {extra[1]} more "
                     f"threads than when idle, {GRACE_S} s after the job")
        # The soak's own descriptors (it holds pipes to nothing between jobs).
        if not wait_until(lambda: fd_count(os.getpid()) <= self.base_fds, 2):
            leak(f"the soak holds {fd_count(os.getpid()) - self.base_fds} more file descriptors")
        left = [d for d in self.throttles if os.path.exists(d)]
        if left:
            leak(f"throttle cgroups left: {left}")

    def record(self, job, c):
        self.totals["jobs"] += 1
        self.totals[f"jobs_{job.kind}"] += 1
        for k in ("checked", "lost", "duplicated", "wrong", "not_received_killed"):
            self.totals[k] += c[k]
        ok = not job.problems
        for kind, _, _ in job.faults:
            if ok:
                self.survived[kind] += 1
        status = "ok" if ok else "FAILED"
        faults = ", ".join(f"{k}@{t}s" for k, t, _ in job.faults) or "none"
        log(f"{job.describe()}: {job.seconds:.1f} s, rc {job.rc}, {c['checked']} samples checked, "
            f"faults {faults}: {status}")
        if not ok:
            self.failed_jobs.append({"job": job.id, "what": job.describe(), "dir": job.dir,
                                     "faults": job.faults, "problems": job.problems[:20]})
            for p in job.problems[:10]:
                log(f"  job {job.id}: {p}")
        else:
            shutil.rmtree(job.dir, ignore_errors=True)

    # -- the whole soak --
    def main(self):
        self.setup()
        self.started = start = time.monotonic()
        jid = 0
        while time.monotonic() - start < self.args.minutes * 60:
            jid += 1
            self.run_job(jid)
        if self.stored.alive():
            rss = (status_field(self.stored.proc.pid, "VmRSS") or 0) * 1024
            self.stored.max_rss_growth = max(self.stored.max_rss_growth, rss - self.stored.base_rss)
            if self.stored.max_rss_growth > STORED_RSS_LIMIT:
                self.leaks.append({"job": None, "leak": f"solar-stored's RSS grew by "
                                   f"{self.stored.max_rss_growth >> 20} MiB since its last start"})

    def cleanup(self):
        STOPPING.set()
        if self.current_job is not None and self.current is not None and self.current.poll() is None:
            log("stopping the running job")
            self.stop_job(self.current_job)
            try:
                self.current.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        if self.threads:
            done, chaos, monitor = self.threads
            done.set()
            chaos.join(timeout=60)  # it finishes the fault under way (at most a few seconds)
        self.undo.all()
        if self.stored:
            self.stored.stop()

    def summary(self):
        t = self.totals
        bad = t["lost"] + t["duplicated"] + t["wrong"]
        return {
            "minutes": round((time.monotonic() - self.started) / 60, 1) if self.started else 0,
            "jobs": t["jobs"],
            "jobs_by_kind": {k: t[f"jobs_{k}"] for k in ("hdf5", "fabric", "transparent")},
            "jobs_failed": len(self.failed_jobs),
            "faults_injected": sum(self.injected.values()),
            "faults_by_kind": {k: self.injected[k] for k in FAULTS},
            "faults_survived": sum(self.survived.values()),
            "faults_survived_by_kind": {k: self.survived[k] for k in FAULTS},
            "samples_checked": t["checked"],
            "samples_lost": t["lost"],
            "samples_duplicated": t["duplicated"],
            "samples_wrong": t["wrong"],
            "samples_not_received_by_killed_ranks": t["not_received_killed"],
            "longest_stall": {k: (round(v, 4) if isinstance(v, float) else v)
                              for k, v in self.longest.items()},
            "solar_stored_rss_growth_mib": round(self.stored.max_rss_growth / 2**20, 1)
            if self.stored else None,
            "leaks": len(self.leaks),
            "leak_details": self.leaks[:50],
            "failures": self.failed_jobs[:50],
            "ok": (bad == 0 and not self.leaks and not self.failed_jobs and
                   sum(self.injected.values()) >= self.args.min_faults),
        }


def print_summary(s):
    L = print
    L(f"soak: {s['minutes']} min, {s['jobs']} jobs ({', '.join(f'{k} {v}' for k, v in s['jobs_by_kind'].items())}), "
      f"{s['jobs_failed']} failed")
    L(f"faults injected: {s['faults_injected']} (" +
      ", ".join(f"{k} {v}" for k, v in s["faults_by_kind"].items()) + ")")
    L(f"faults survived: {s['faults_survived']} (" +
      ", ".join(f"{k} {v}" for k, v in s["faults_survived_by_kind"].items()) + ")")
    L(f"samples checked: {s['samples_checked']}, lost: {s['samples_lost']}, duplicated: "
      f"{s['samples_duplicated']}, wrong: {s['samples_wrong']} (not received by killed ranks "
      f"after their death: {s['samples_not_received_by_killed_ranks']})")
    ls = s["longest_stall"]
    L(f"longest stall: a rank's wait for one batch {ls['rank_wait_s']} s (job {ls['rank_wait_job']}), "
      f"agents' stall_max_wait {ls['agent_stall_max_wait_s']} s (job {ls['agent_stall_job']}), "
      f"transparent rank's pause between batches {ls['transparent_gap_s']} s (job "
      f"{ls['transparent_gap_job']})")
    L(f"leaks: {s['leaks']}" + (f" ({'; '.join(l['leak'] for l in s['leak_details'][:5])})"
                                if s["leaks"] else "") +
      f"; solar-stored RSS growth {s['solar_stored_rss_growth_mib']} MiB")
    for f in s["failures"][:10]:
        L(f"FAILED job {f['job']} ({f['what']}, kept in {f['dir']}): faults "
          f"{[(k, t) for k, t, _ in f['faults']]}; " + "; ".join(f["problems"][:5]))
    L("soak: " + ("PASS" if s["ok"] else "FAIL"))


# ---- plan, records, digests ----------------------------------------------------------------------

def plan_sequences(plan):
    """rank -> step -> samples, from plan-dump."""
    rows = csv.DictReader(io.StringIO(run(SOLAR, "plan-dump", plan).stdout))
    seq = defaultdict(lambda: defaultdict(list))
    for r in rows:
        seq[int(r["rank"])][int(r["global_step"])].append(int(r["sample"]))
    return seq


def read_record(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                if line.endswith("\n"):  # a line cut by a kill is not a received batch
                    step, *samples = map(int, line.split())
                    out.append((step, samples))
    except OSError:
        pass
    return out


def read_digests(path):
    """[((epoch, batch), (x digest, y digest), None)] (Soak.reference fills in the sizes)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                if not line.endswith("\n"):
                    continue
                e, b, x, y, _ = line.split()
                out.append(((int(e), int(b)), (x, y), None))
    except OSError:
        pass
    return out


def count_lines(path):
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


def main():
    ap = argparse.ArgumentParser(prog="soak", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, required=True, help="start jobs for this long")
    ap.add_argument("--json", metavar="OUT", help="also write the summary as JSON here")
    ap.add_argument("--seed", type=int, default=None, help="the chaos's seed [random]")
    ap.add_argument("--min-faults", type=int, default=0,
                    help="fail if fewer faults than this were injected")
    ap.add_argument("--keep", action="store_true", help="keep the working folder")
    a = ap.parse_args()
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 31)
    for prog in (SOLAR, TRAIN, STORED):
        if not os.access(prog, os.X_OK):
            ap.error(f"{prog} is not built (set SOLAR_BIN_DIR, or SOLAR_BIN, SOLAR_EXAMPLE_TRAIN, "
                     "SOLAR_STORED)")
    if os.geteuid() != 0:
        print("soak: skipped: the slow_storage fault needs root (a blkio cgroup)", file=sys.stderr)
        sys.exit(77)  # ctest's SKIP_RETURN_CODE
    log(f"seed {a.seed}, {a.minutes} minutes")
    soak = Soak(a)

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    failed = False
    try:
        soak.main()
    except KeyboardInterrupt:
        log("interrupted: stopping everything")
        failed = True
    except Exception:
        failed = True
        import traceback
        traceback.print_exc()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        soak.cleanup()
        s = soak.summary()
        s["seed"] = a.seed
        if failed:
            s["ok"] = False
        print_summary(s)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(s, f, indent=1)
        if hasattr(soak, "workdir"):
            if s["ok"] and not a.keep:
                shutil.rmtree(soak.workdir, ignore_errors=True)
            else:
                log(f"kept {soak.workdir}")
    sys.exit(0 if s["ok"] else 1)


if __name__ == "__main__":
    main()
