# SPDX-License-Identifier: Apache-2.0
"""The chaos driver (Soak's part): while a job runs, a fault every 0.7-3 s, chosen by weight among
those that fit the job (tests/soak/soak.py's docstring lists them and what each job must still
do). Mixed into Soak: uses its rng, undo, stored, throttles and injected."""
import os
import random
import signal
import subprocess
import sys
import time
from soak_env import PY, ROOT, STOPPING, log
from soak_jobs import rank_of
from soak_procs import (Pid, blkio_cgroup, descendants, move_to_cgroup, proc_stat,
                        proc_table)

sys.path.insert(0, os.path.join(ROOT, "bench"))
import slow_storage  # noqa: E402  (bench/slow_storage.py: Throttle, evict)


def evict(path):
    """The pages of a file, or of every file of a dataset's folder, out of the page cache."""
    if not os.path.isdir(path):
        slow_storage.evict(path)
        return
    for d, _, names in os.walk(path):
        for n in names:
            slow_storage.evict(os.path.join(d, n))


def agent_node(pid):
    """The --node of a solar-agent (None if it is gone)."""
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        return int(args[args.index(b"--node") + 1])
    except (OSError, ValueError, IndexError):
        return None


class Faults:
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
        node = agent_node(victim.pid)
        job.stopped_nodes.add(node)  # before: its ranks may time out while it is stopped
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
        evict(job.data)
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
