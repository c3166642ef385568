# SPDX-License-Identifier: Apache-2.0
"""One soak job (its kind, dataset, shape and `solar run` command line, chosen at random) and what is read
back after it: the ranks' --record and --digests files (the plan's own sequences come from
testlib.plan_sequences)."""
import math
import os
from soak_env import MANY, PY, SAMPLES, SCRIPT, SOLAR, TRAIN


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
        self.stopped_nodes = set()  # nodes whose agent was SIGSTOPped (agent_stop)
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
            # Batch jobs: one file (hdf5, fabric, peers), or a dataset of many (files: a file a
            # sample; dlio: files of rows; peers_files: either), --peers for peers*.
            self.nodes, self.rpn = rng.choice([(2, 1), (2, 2), (3, 1), (3, 2)])
            if kind in ("files", "dlio"):
                name = kind
            elif kind == "peers_files":
                name = rng.choice(["files", "dlio"])
            else:
                name = rng.choice(["tiny", "tiny", "small"])
            self.name = name
            self.peers = kind.startswith("peers")
            self.data = datasets[name]  # a file, or the folder of a dataset of many
            self.labels = None
            if kind == "fabric":
                self.spec = f"fabric://{stored.addr}/{name}"
            elif name in MANY:
                suffix, self.labels = MANY[name]
                self.spec = self.data.rstrip("/") + "/" + suffix
            else:
                self.spec = self.data
            self.epochs = rng.choice([2, 3, 4])
            self.batch = rng.choice([2, 3]) if name == "small" else rng.choice([4, 6, 8])
            self.seed = rng.randrange(1000)
            # 10% of the small set (9 samples of 256 KiB) is less than some shapes' rings need;
            # so is 10% of the tiny set with --peers (its staging slots come out of --buffer),
            # and of the 256 one-sample files.
            small_ok = name == "tiny" and not self.peers
            self.zero_copy = rng.random() < 0.3  # cache slots pinned by the ranks, no rings
            samples = SAMPLES[name]
            # What an agent needs at least, in steps of its node's ranks (core/agent_budget.h):
            # one resident, two staging, with rings one look-ahead, with rings and peers one
            # for handovers; labels take a little more of the budget.
            steps_needed = 3 + (0 if self.zero_copy else 1 + self.peers)
            need = steps_needed * self.rpn * self.batch
            buffers = [b for b in (["10%", "25%", "50%", "100%"] if small_ok else
                                   ["25%", "50%", "100%"])
                       if int(b[:-1]) * samples / 100 >= need * 1.1]
            self.buffer = rng.choice(buffers or ["100%"])
            n = self.nodes * self.rpn
            steps = self.epochs * math.ceil(samples / (n * self.batch))
            target = rng.uniform(8, 28)
            self.compute_ms = max(5, int(target * 1000 / steps))
        self.world = self.nodes * self.rpn
        self.zero_copy = getattr(self, "zero_copy", False)
        self.peers = getattr(self, "peers", False)
        self.name = getattr(self, "name", "tiny")

    def describe(self):
        return (f"job {self.id} {self.kind} {self.name} {self.nodes}x{self.rpn} epochs "
                f"{self.epochs} batch {self.batch} buffer {self.buffer}" +
                (" zero-copy" if self.zero_copy else "") + (" peers" if self.peers else "") +
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
                *(["--labels", self.labels] if self.labels else []),
                *(["--zero-copy"] if self.zero_copy else []),
                *(["--peers"] if self.peers else []),
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
