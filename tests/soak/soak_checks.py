# SPDX-License-Identifier: Apache-2.0
"""What is checked after every job (Soak's part): samples against the plan or the reference run
(lost, duplicated, wrong), the longest stalls, and leaks (processes, run folders, /dev/shm,
solar-stored's descriptors and threads, the soak's own descriptors, throttle cgroups). Mixed into
Soak: uses its reference(), process_states(), stored, longest, leaks, shm_before and base_fds."""
import json
import os
import re
import signal
import sys
from collections import Counter, defaultdict
from soak_env import GRACE_S, ROOT
from soak_jobs import read_digests, read_record
from soak_procs import fd_count, shm_solar, wait_until

sys.path.insert(0, os.path.join(ROOT, "tests"))
from testlib import plan_sequences  # noqa: E402  (tests/testlib.py: plan-dump's sequences)


SILENT = re.compile(r"rank (\d+): the agent did not answer within")


class Checks:
    def silent_agents(self, job, err):
        """Ranks that gave up on an agent (SOLAR_AGENT_TIMEOUT) that was never SIGSTOPped in
        their job, where nothing else the chaos does should hold one up that long (a stopped
        or killed solar-stored may: fabric jobs with those faults are not counted). Reported,
        not failed: the 4-minute soak of 4 Dec 2026 found --peers jobs where a peer agent's
        SIGKILL leaves another agent never serving a step (agent/src/peer_sharing.cpp)."""
        if any(k in ("stored_stop", "stored_kill") for k, _, _ in job.faults):
            return
        for m in SILENT.finditer(err):
            rank = int(m.group(1))
            if rank // job.rpn not in job.stopped_nodes:
                self.silent.append({"job": job.id, "what": job.describe(), "rank": rank,
                                    "node": rank // job.rpn,
                                    "faults": [(k, t) for k, t, _ in job.faults]})

    def check_samples(self, job):
        c = Counter()
        killed = job.killed_rank[0] if job.killed_rank else None
        err = open(os.path.join(job.dir, "err.txt")).read()
        self.silent_agents(job, err)
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
                peers = n.get("peers") or {}
                c["peer_samples"] += peers.get("samples") or 0
                c["peer_fallbacks"] += peers.get("fallbacks") or 0
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
