#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The soak: many short multi-node `solar run` jobs under a chaos driver, every sample checked.

    scripts/soak --minutes N [--json OUT] [--seed S] [--min-faults F] [--keep]

Jobs (each 10-40 s; the first ones take every kind in turn, so a soak of any length runs each
at least once, then chosen at random by weight), 2-3 simulated nodes of 1-2 ranks, small to
whole-dataset buffers, rings or --zero-copy:

  hdf5         solar-example-train --verify over an HDF5 file (600 x 4 KiB or 96 x 256 KiB)
  fabric       the same over `solar-stored` (fabric://)
  transparent  an unmodified h5py + DistributedSampler script (slurm_examples/train_h5py_ddp.py)
               under `solar run --transparent` (one file: the script reads one file's /data)
  files        solar-example-train --verify over a dataset of many files in the SOLAR
               artifact's layout (solar gen --layout per-sample-files: 256 files of one 2x16x16
               int16 sample, DIR/:/split --labels /unitPar)
  dlio         the same over a DLIO-like one (--layout dlio: 8 files of 50 rows of 64x64 uint8,
               the last of 40, DIR/:/records[] --labels /labels)
  peers        hdf5's job with --peers (the agents read each other's buffers over libfabric)
  peers_files  files' or dlio's job with --peers

Every job's solar run keeps its index cache (SOLAR_INDEX_CACHE) in the soak's folder. While a
job runs, a fault comes every 0.7-3 s:

  agent_kill      SIGKILL of one of the job's agents (also    the job succeeds (ranks read directly)
                  before it is ready)
  agent_stop      SIGSTOP of an agent for 0.5-6 s, SIGCONT    the job succeeds (SOLAR_AGENT_TIMEOUT=3)
  rank_kill       SIGKILL of one rank (at most one per job)   that rank fails: `solar run` exits 137
  stored_kill     SIGKILL of solar-stored, restarted on the   the job succeeds (reconnection)
                  same port 0.2-4 s later (fabric jobs)
  stored_stop     SIGSTOP of solar-stored for 0.5-6 s         the job succeeds
  slow_storage    the storage reader (the agents; solar-stored for fabric jobs) moved into a
                  cgroup capping its disk reads (bench/slow_storage.py's Throttle: 2 MiB/s, 200
                  IOPS) with the dataset's pages (every file's) evicted, for 1-5 s
                                                                the job succeeds
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

The summary: jobs (by kind), faults injected (by kind), faults survived (those in jobs that
passed every check), samples checked, lost, duplicated, wrong, samples read from peers' buffers
and those read from storage instead (the agents' --stats-out `peers`), the longest stall (the ranks' own longest wait
for one batch, --report max_load_seconds; the agents' stall_max_wait_seconds from --stats-out;
transparent ranks: the longest pause between two batches), the ranks that gave up on an agent
(SOLAR_AGENT_TIMEOUT) never SIGSTOPped in their job (reported, not failed: see
Checks.silent_agents), leaks. Exits 1 if any sample was
wrong, lost or duplicated, a job hung or ended with an unexpected status, anything leaked, or
fewer than --min-faults faults were injected.

Everything it starts is stopped by PID (never by name), also on failure and Ctrl-C.
"""
import argparse
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
from collections import Counter

from soak_checks import Checks
from soak_env import (AGENT_TIMEOUT_S, FAULTS, JOB_TIMEOUT_S, KIND_WEIGHTS, KINDS, PY, SAMPLES,
                      SCRIPT, SOLAR, STOPPING, STORED, STORED_RSS_LIMIT, TRAIN, log)
from soak_faults import Faults
from soak_jobs import Job, count_lines, read_digests
from soak_procs import (Pid, Undo, descendants, fd_count, proc_stat, proc_table, run, shm_solar,
                        status_field, wait_until)
from soak_stored import Stored


class Soak(Faults, Checks):
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.pending = list(KINDS)   # kinds not run yet: the first jobs take them in turn
        self.rng.shuffle(self.pending)
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
        self.silent = []             # ranks that gave up on an agent not stopped (Checks)
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
        # solar-stored exports the single files (its --labels is one name for every export).
        self.stored = Stored(self.workdir, dict(self.datasets))
        # Datasets of many files, in the layouts of real workloads (tests/soak/soak_env.py's
        # MANY: the spec and labels each is read with).
        n = SAMPLES["files"]
        self.datasets["files"] = os.path.join(self.workdir, "files")
        run(SOLAR, "gen", self.datasets["files"], "--layout", "per-sample-files", "--samples", n,
            "--shape", "2,16,16", "--seed", "7", "--no-progress")
        self.datasets["dlio"] = os.path.join(self.workdir, "dlio")
        run(SOLAR, "gen", self.datasets["dlio"], "--layout", "dlio", "--files", 8,
            "--samples-per-file", 50, "--samples", SAMPLES["dlio"], "--shape", "64,64",
            "--seed", "7", "--no-progress")
        # The index cache of solar run: in the soak's folder, not the user's ~/.cache.
        self.index_cache = os.path.join(self.workdir, "index-cache")
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
        if self.pending:
            kind = self.pending.pop()
        else:
            kind = self.rng.choices(KINDS, weights=KIND_WEIGHTS)[0]
        job = Job(jid, kind, self.workdir, self.rng, self.datasets, self.stored)
        if kind == "transparent":
            self.reference(job)
        if kind == "fabric" and not self.stored.alive():
            self.stored.restart()
        env = dict(os.environ, TMPDIR=job.tmp, SOLAR_AGENT_TIMEOUT=str(AGENT_TIMEOUT_S),
                   SOLAR_INDEX_CACHE=self.index_cache)
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


    def record(self, job, c):
        self.totals["jobs"] += 1
        self.totals[f"jobs_{job.kind}"] += 1
        for k in ("checked", "lost", "duplicated", "wrong", "not_received_killed",
                  "peer_samples", "peer_fallbacks"):
            self.totals[k] += c[k]
        ok = not job.problems
        for kind, _, _ in job.faults:
            if ok:
                self.survived[kind] += 1
        status = "ok" if ok else "FAILED"
        faults = ", ".join(f"{k}@{t}s" for k, t, _ in job.faults) or "none"
        peers = (f", {c['peer_samples']} from peers ({c['peer_fallbacks']} from storage instead)"
                 if job.peers else "")
        log(f"{job.describe()}: {job.seconds:.1f} s, rc {job.rc}, {c['checked']} samples checked"
            f"{peers}, faults {faults}: {status}")
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
        # Until the time is up, and at least one job of every kind.
        while time.monotonic() - start < self.args.minutes * 60 or self.pending:
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
            "jobs_by_kind": {k: t[f"jobs_{k}"] for k in KINDS},
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
            "samples_from_peers": t["peer_samples"],
            "peer_fallbacks_to_storage": t["peer_fallbacks"],
            "longest_stall": {k: (round(v, 4) if isinstance(v, float) else v)
                              for k, v in self.longest.items()},
            "solar_stored_rss_growth_mib": round(self.stored.max_rss_growth / 2**20, 1)
            if self.stored else None,
            "ranks_giving_up_on_an_agent_not_stopped": len(self.silent),
            "silent_agent_details": self.silent[:50],
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
    L(f"peers: {s['samples_from_peers']} samples read from another node's buffer, "
      f"{s['peer_fallbacks_to_storage']} from storage instead")
    if s["ranks_giving_up_on_an_agent_not_stopped"]:
        L(f"ranks that gave up on an agent not stopped (SOLAR_AGENT_TIMEOUT; reported, not "
          f"failed): {s['ranks_giving_up_on_an_agent_not_stopped']} (" +
          "; ".join(f"job {d['job']} rank {d['rank']} node {d['node']}"
                    for d in s["silent_agent_details"][:10]) + ")")
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