# SPDX-License-Identifier: Apache-2.0
"""What the cluster tests share (test_cluster.py, test_cluster_isolation.py): the programs under
test, the test cluster on this host (scripts/test-cluster: a private munged, slurmctld and two
slurmd on loopback) as a `Cluster`, and the probes of what a job leaves behind. The fixtures
(one cluster and one dataset for the whole session) are in conftest.py."""
import os
import subprocess
import tempfile
import time

SPANK = os.environ["SOLAR_SPANK"]
AGENT = os.environ["SOLAR_AGENT"]
SOLAR = os.environ["SOLAR_BIN"]
TRAIN = os.environ["SOLAR_EXAMPLE_TRAIN"]
PRELOAD = os.environ["SOLAR_PRELOAD"]
DDP_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                          "slurm_examples", "train_h5py_ddp.py")
CLUSTER = os.environ["SOLAR_TEST_CLUSTER"]
SCRATCH_PARENT = os.environ.get("SOLAR_SCRATCH_PARENT") or tempfile.gettempdir()


def wait_until(pred, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Cluster:
    def __init__(self, root):
        self.root = root
        self.dir = os.path.join(root, "cluster")
        self.env = dict(os.environ, SOLAR_CLUSTER_DIR=self.dir, SOLAR_SPANK=SPANK,
                        SOLAR_AGENT=AGENT, SOLAR_BIN=SOLAR, SOLAR_PRELOAD=PRELOAD, SLURM_CONF=os.path.join(self.dir, "slurm.conf"))
        for k in list(self.env):
            if k.startswith(("SOLAR_DATASET", "SOLAR_BUFFER", "SOLAR_EPOCHS", "SOLAR_BATCH",
                             "SOLAR_STEP", "SOLAR_PLAN", "SLURM_JOB", "SLURM_STEP")):
                del self.env[k]
        self.plans = os.path.join(self.dir, "plans")
        self.run_dir = os.path.join(self.dir, "run")

    def script(self, *args, check=True):
        return subprocess.run([CLUSTER, *args], env=self.env, capture_output=True, text=True,
                              timeout=120, check=check)

    def plugstack(self, extra="", line="required"):
        """Rewrites plugstack.conf (srun and slurmstepd read it at every step)."""
        with open(os.path.join(self.dir, "plugstack.conf"), "w") as f:
            f.write(f"{line} {SPANK} agent={AGENT} solar={SOLAR} plan_dir={self.plans} "
                    f"runtime_dir={self.run_dir} preload={PRELOAD} {extra}\n")

    def run(self, *args, user=None, timeout=180, cwd=None):
        cmd = list(args)
        if user:
            cmd = ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.env['SLURM_CONF']}",
                   *cmd]
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=cwd or self.root)

    def popen(self, *args):
        return subprocess.Popen(list(args), env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=self.root)

    def jobs(self):
        out = self.run("squeue", "-h", "-o", "%i").stdout.split()
        return out

    def idle(self):
        out = self.run("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").stdout.split()
        return len(set(out)) == 2

    def settle(self):
        """No job left and both nodes idle again (nodes sit in `comp` for a moment)."""
        wait_until(lambda: not self.jobs() and self.idle(), what="an idle cluster")


def agents_running(agent=AGENT):
    """This module's clusters' processes of `agent` (an agent's socket, or a rank's working
    folder, lies under a spank-test- folder): other programs on this machine (a soak, `solar
    run` tests) may run the same binaries meanwhile."""
    ours = os.path.join(SCRATCH_PARENT, "spank-test-")
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{pid}/exe") != os.path.realpath(agent):
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = ""
            if cwd.startswith(ours) or any(a.startswith(ours) for a in argv):
                found.append(int(pid))
        except OSError:
            pass
    return found


def shm_entries():
    return set(os.listdir("/dev/shm"))


def solar_args(ds, *extra):
    return ["--solar-dataset=" + ds, "--solar-buffer=40%", "--solar-epochs=3",
            "--solar-batch=8", *extra]
