"""solar_spank.so on a real Slurm cluster on this host (scripts/test-cluster: a private munged,
slurmctld and two slurmd on loopback), real HDF5 files from `solar gen`, real agents. Every
wait polls (sinfo, squeue, files); every daemon is stopped by its recorded PID, even when a
test fails."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

SPANK = os.environ["SOLAR_SPANK"]
AGENT = os.environ["SOLAR_AGENT"]
SOLAR = os.environ["SOLAR_BIN"]
TRAIN = os.environ["SOLAR_EXAMPLE_TRAIN"]
PRELOAD = os.environ["SOLAR_PRELOAD"]
DDP_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                          "slurm_examples", "train_h5py_ddp.py")
CLUSTER = os.environ["SOLAR_TEST_CLUSTER"]
SCRATCH_PARENT = os.environ.get("SOLAR_SCRATCH_PARENT") or tempfile.gettempdir()

if os.geteuid() != 0:
    pytest.skip("the test cluster needs root (slurmd starts jobs as their users)",
                allow_module_level=True)


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


@pytest.fixture(scope="module")
def cluster():
    root = tempfile.mkdtemp(prefix="spank-test-", dir=SCRATCH_PARENT)
    os.chmod(root, 0o755)  # jobs of `nobody` reach the dataset and the folders below
    c = Cluster(root)
    try:
        up = c.script("up", check=False)
        assert up.returncode == 0, up.stdout + up.stderr
        yield c
    finally:
        c.script("down", check=False)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def dataset(cluster):
    path = os.path.join(cluster.root, "tiny.h5")
    subprocess.run([SOLAR, "gen", path, "--samples", "512", "--preset", "tiny", "--seed", "11",
                    "--no-progress"], check=True, capture_output=True, timeout=120)
    os.chmod(path, 0o644)
    return path + ":/data"


@pytest.fixture(autouse=True)
def clean_after(cluster):
    shm_before = shm_entries()
    cluster.plugstack()
    yield
    cluster.settle()
    assert not agents_running(), "an agent outlived its job"
    assert os.listdir(cluster.run_dir) == [], os.listdir(cluster.run_dir)
    assert os.listdir(cluster.plans) == [], os.listdir(cluster.plans)
    # Other programs on this machine may come and go in /dev/shm; none of solar's may appear.
    assert not [n for n in shm_entries() - shm_before if "solar" in n.lower()]


def solar_args(ds, *extra):
    return ["--solar-dataset=" + ds, "--solar-buffer=40%", "--solar-epochs=3",
            "--solar-batch=8", *extra]


def test_srun_help_lists_every_option(cluster):
    out = cluster.run("srun", "--help").stdout
    for opt in ["--solar-dataset", "--solar-labels", "--solar-buffer", "--solar-epochs",
                "--solar-batch", "--solar-seed", "--solar-order", "--solar-imbalance",
                "--solar-transparent", "--solar-start-epoch", "--solar-start-step",
                "--solar-verbose", "--solar-stats", "--solar=off"]:
        assert opt in out, opt
    assert "per-rank batch size" in out


def test_two_nodes_two_ranks_each_verified_from_the_agents(cluster, dataset):
    p = cluster.run("srun", "-N2", "--ntasks-per-node=2",
                    *solar_args(dataset, "--solar-verbose"), TRAIN, "--verify")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count("verified (0 wrong), from the node agent") == 4, out
    assert "DataLoading time SOLAR each epoch: [" in out
    for rank in range(4):
        assert f"rank {rank}: " in out
    hits = {int(n): int(h) for n, h in re.findall(r"solar: node (\d): (\d+) hits", out)}
    assert set(hits) == {0, 1} and all(h > 0 for h in hits.values()), out
    assert out.count("agent ready in") == 2, out


def test_solar_stats_writes_every_nodes_epochs(cluster, dataset):
    """--solar-stats: srun merges the agents' measured per-epoch statistics into one file (%j,
    %s: job and step ids); a folder that does not exist is refused before submission."""
    import glob
    import json
    p = cluster.run("srun", "-N2", "--ntasks-per-node=2",
                    *solar_args(dataset, "--solar-stats=stats-%j.%s.json"), TRAIN, "--verify")
    assert p.returncode == 0, p.stdout + p.stderr
    files = glob.glob(os.path.join(cluster.root, "stats-*.*.json"))
    assert len(files) == 1 and re.search(r"stats-\d+\.\d+\.json$", files[0]), files
    with open(files[0]) as f:
        st = json.load(f)
    os.unlink(files[0])
    assert [n["node"] for n in st["nodes"]] == [0, 1], st
    for n in st["nodes"]:
        assert "missing" not in n, n
        assert len(n["epochs"]) == 3, n
        served = sum(e["samples_served"] for e in n["epochs"])
        assert served == sum(e["hits"] + e["fetched_samples"] for e in n["epochs"]) > 0, n
        assert all(e["fetched_bytes"] == e["fetched_samples"] * n["sample_bytes"]
                   for e in n["epochs"]), n
    # 512 samples, 3 epochs, each served once per epoch across the two nodes.
    assert sum(e["samples_served"] for n in st["nodes"] for e in n["epochs"]) == 3 * 512
    bad = cluster.run("srun", "-N1", *solar_args(dataset, "--solar-stats=/nonexistent/s.json"),
                      "true")
    assert bad.returncode != 0
    lines = [l for l in bad.stderr.splitlines() if "error: solar: " in l]
    assert len(lines) == 1 and "--solar-stats" in lines[0] and "/nonexistent" in lines[0], bad.stderr


def test_start_epoch_and_step_resume_the_step_at_its_agents(cluster, dataset):
    """--solar-start-epoch/--solar-start-step (a requeued job): the ranks get exactly the full
    step's batches from that step on, every byte verified, and the agents start there (they
    serve nothing earlier); a start beyond the plan stops srun naming its length."""
    import glob
    import json

    def step(name, *extra):
        rec = os.path.join(cluster.root, f"{name}-%r.txt")
        p = cluster.run("srun", "-N2", "--ntasks-per-node=2",
                        *solar_args(dataset, f"--solar-stats={name}.json", *extra), TRAIN,
                        "--verify", "--record", rec)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert out.count("verified (0 wrong), from the node agent") == 4, out
        records = {}
        for r in range(4):
            with open(rec.replace("%r", str(r))) as f:
                records[r] = {int(l.split()[0]): l.split()[1:] for l in f}
        with open(os.path.join(cluster.root, f"{name}.json")) as f:
            stats = json.load(f)
        return records, stats

    try:
        full, fstats = step("full")
        spe = fstats["nodes"][0]["steps_per_epoch"]
        G = spe + 3
        rest, stats = step("resumed", "--solar-start-epoch=1", "--solar-start-step=3")
        for r in range(4):
            assert rest[r] == {s: v for s, v in full[r].items() if s >= G}, r
        for n in stats["nodes"]:
            assert n["start_step"] == G, n
            assert n["epochs"][0]["samples_served"] == 0 and not n["epochs"][0]["started"], n
            assert n["epochs"][1]["batches_served"] == (spe - 3) * 2, n
        bad = cluster.run("srun", "-N2", "--ntasks-per-node=2",
                          *solar_args(dataset, "--solar-start-epoch=3", "--solar-start-step=1"),
                          "true")
        assert bad.returncode != 0
        lines = [l for l in bad.stderr.splitlines() if "error: solar: " in l]
        assert lines and "--solar-start-epoch" in lines[0] and \
            f"the plan has {3 * spe} steps: 3 epochs of {spe}" in lines[0], bad.stderr
    finally:
        for f in glob.glob(os.path.join(cluster.root, "full*")) + \
                glob.glob(os.path.join(cluster.root, "resumed*")):
            os.unlink(f)


def test_same_step_without_solar_reads_nothing_from_agents(cluster, dataset):
    p = cluster.run("srun", "-N2", "--ntasks-per-node=2", *solar_args(dataset), "--solar=off",
                    "env")
    assert p.returncode == 0, p.stderr
    assert "SOLAR_SOCKET" not in p.stdout and "SOLAR_PLAN" not in p.stdout


@pytest.mark.parametrize("bad,named", [
    (["--solar-buffer=lots"], "--solar-buffer"),
    (["--solar-dataset=/nonexistent/x.h5"], "--solar-dataset"),
    (["--solar-batch=100000"], "--solar-batch"),
    (["--solar-order=random"], "--solar-order"),
])
def test_bad_option_fails_before_launch_with_one_line(cluster, dataset, bad, named):
    args = solar_args(dataset)
    key = bad[0].split("=")[0]
    args = [a for a in args if not a.startswith(key + "=")] + bad
    p = cluster.run("srun", "-N2", "--ntasks-per-node=2", *args, TRAIN, "--verify")
    assert p.returncode != 0
    # Our one line; Slurm adds its own ("spank: required plugin ... failed").
    lines = [l for l in p.stderr.splitlines() if "error: solar: " in l]
    assert len(lines) == 1 and named in lines[0], p.stderr
    assert "rank" not in p.stdout, p.stdout


def test_step_shape_errors_name_the_cause(cluster, dataset):
    # 3 tasks on 2 nodes cannot follow one plan with equal ranks per node.
    p = cluster.run("srun", "-N2", "-n3", *solar_args(dataset), TRAIN)
    assert p.returncode != 0
    assert "--ntasks-per-node" in p.stderr, p.stderr


def test_sbatch_with_solar_lines(cluster, dataset):
    script = os.path.join(cluster.root, "job.sbatch")
    out = os.path.join(cluster.root, "job.out")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N2 --ntasks-per-node=2
#SBATCH --solar-dataset={dataset}
#SBATCH --solar-buffer=40%
#SBATCH --solar-epochs=3
#SBATCH --solar-batch=8
#SBATCH --solar-verbose
srun {TRAIN} --verify
""")
    p = cluster.run("sbatch", "-W", "-o", out, script)
    assert p.returncode == 0, p.stdout + p.stderr + open(out).read()
    text = open(out).read()
    assert text.count("verified (0 wrong), from the node agent") == 4, text
    assert len(re.findall(r"solar: node \d: [1-9]\d* hits", text)) == 2, text
    os.unlink(out)


def test_sbatch_bad_option_refused_at_submission(cluster, dataset):
    p = cluster.run("sbatch", "-N1", "--solar-dataset=" + dataset, "--solar-buffer=lots",
                    "--solar-epochs=1", "--solar-batch=8", "--wrap", "true")
    assert p.returncode != 0
    assert "--solar-buffer" in p.stderr, p.stderr
    assert not cluster.jobs()


def test_scancel_mid_step_leaves_nothing(cluster, dataset):
    p = cluster.popen("srun", "-N2", "--ntasks-per-node=2", *solar_args(dataset), TRAIN,
                      "--compute-ms=50", "--quiet")
    try:
        socks = lambda: [d for d in os.listdir(cluster.run_dir)
                         if os.path.exists(os.path.join(cluster.run_dir, d, "agent.sock"))]
        wait_until(lambda: len(socks()) == 2, what="two agents serving")
        assert len(agents_running()) == 2
        job = cluster.jobs()[0]
        assert cluster.run("scancel", job).returncode == 0
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # clean_after checks: no agent, no folder, no plan, nothing in /dev/shm.


def test_two_jobs_isolated_and_a_job_of_nobody(cluster, dataset):
    slow = cluster.popen("srun", "-N2", "--ntasks-per-node=2", *solar_args(dataset), TRAIN,
                         "--compute-ms=20", "--verify")
    try:
        dirs = lambda: os.listdir(cluster.run_dir)
        wait_until(lambda: len(dirs()) == 2 and all(
            os.path.exists(os.path.join(cluster.run_dir, d, "agent.sock")) for d in dirs()),
            what="the first job's agents")
        root_sock = os.path.join(cluster.run_dir, dirs()[0], "agent.sock")
        # Another user cannot reach root's agent (its folder is 0700), so not its buffer either.
        probe = cluster.run("runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c",
                            "import socket,sys; s=socket.socket(socket.AF_UNIX);"
                            f"s.connect({root_sock!r})")
        assert probe.returncode != 0 and "PermissionError" in probe.stderr, probe.stderr
        p = cluster.run("srun", "-N2", "--ntasks-per-node=2",
                        *solar_args(dataset, "--solar-seed=5", "--solar-verbose"),
                        TRAIN, "--verify", user="nobody")
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert out.count("verified (0 wrong), from the node agent") == 4, out
        assert len(re.findall(r"solar: node \d: [1-9]\d* hits", out)) == 2, out
        assert slow.poll() is None or slow.returncode == 0
    finally:
        o, e = slow.communicate(timeout=180)
    assert slow.returncode == 0, o + e
    assert o.count("verified (0 wrong), from the node agent") == 4, o + e


def test_broken_agent_falls_back_to_direct_reads(cluster, dataset):
    cluster.plugstack("on_error=fallback agent=/nonexistent/solar-agent")
    p = cluster.run("srun", "-N2", "--ntasks-per-node=2", *solar_args(dataset), TRAIN,
                    "--verify")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count("verified (0 wrong), read directly") == 4, out
    told = [l for l in p.stderr.splitlines() if "ranks read directly" in l]
    assert len(told) == 2 and "/nonexistent/solar-agent" in told[0], p.stderr


def test_broken_agent_fails_the_step_with_on_error_fail(cluster, dataset):
    cluster.plugstack("on_error=fail agent=/nonexistent/solar-agent")
    p = cluster.run("srun", "-N2", "--ntasks-per-node=2", *solar_args(dataset), TRAIN,
                    "--verify")
    assert p.returncode != 0
    assert "/nonexistent/solar-agent" in p.stderr and "on_error=fail" in p.stderr, p.stderr
    assert "verified" not in p.stdout


def test_job_epilog_sweeps_leftovers_and_kills_only_agents(cluster, dataset):
    """What a crashed slurmstepd would leave (a step folder, a plan, a log) goes with the job;
    a pid file pointing at a process that is not that step's agent is not trusted. The plan
    folder's files are left to srun for a while first: an srun that made its own allocation
    reads the agents' logs after slurmctld has ended the job (and started this epilog)."""
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        p = cluster.run("sbatch", "--parsable", "-N1", "-o", "/dev/null", "--wrap",
                        "sleep 300")
        assert p.returncode == 0, p.stderr
        job = p.stdout.strip().split(";")[0]
        wait_until(lambda: cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()
                   == "RUNNING", what="the job running")
        leftover = os.path.join(cluster.run_dir, f"solar-{job}.7.0")
        os.mkdir(leftover, 0o700)
        with open(os.path.join(leftover, "agent.pid"), "w") as f:
            f.write(f"{bystander.pid}\n")
        # Two steps' folders in plan_dir (the job's user's, 0700), one of which srun removes.
        steps = {}
        for st in (7, 8):
            steps[st] = tempfile.mkdtemp(prefix=f"solar-{job}.{st}.", dir=cluster.plans)
            for name in ("plan", "node0.log"):
                open(os.path.join(steps[st], name), "w").close()
        assert cluster.run("scancel", job).returncode == 0
        wait_until(lambda: not os.path.exists(leftover), what="the epilog's sweep of run_dir")
        # The epilog is now leaving the plan folder to srun (for about 15 s): the step folders
        # are still there, and one srun removes itself is not waited for again.
        assert sorted(os.listdir(cluster.plans)) == sorted(os.path.basename(d)
                                                           for d in steps.values())
        shutil.rmtree(steps[8])
        wait_until(lambda: not os.listdir(cluster.plans), what="the epilog's sweep of plan_dir")
        assert bystander.poll() is None, "the sweep killed a process that is not an agent"
    finally:
        bystander.kill()
        bystander.wait()


def ddp_plain_then_transparent(cluster, dataset, name, epochs, tasks_per_node, script_args,
                               solar_args):
    """The unmodified DDP script on 2 nodes under plain srun, then under srun
    --solar-transparent (with `solar_args`); asserts both succeed and every rank got the same
    batches, and returns the solar run's output."""
    data = dataset.split(":")[0]
    script = [sys.executable if sys.executable.startswith("/usr/bin/") else "/usr/bin/python3",
              DDP_SCRIPT, data, "--epochs", str(epochs), "--batch", "4", "--seed", "3",
              *script_args]
    out_dir = os.path.join(cluster.root, name)
    os.makedirs(out_dir, exist_ok=True)
    tasks = f"--ntasks-per-node={tasks_per_node}"
    plain = cluster.run("srun", "-N2", tasks, *script, "--digests",
                        os.path.join(out_dir, "plain-%r.txt"), timeout=600)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    p = cluster.run("srun", "-N2", tasks, "--solar-dataset=" + dataset, *solar_args,
                    f"--solar-epochs={epochs}", "--solar-batch=4", "--solar-seed=3",
                    "--solar-transparent", "--solar-verbose", *script, "--digests",
                    os.path.join(out_dir, "solar-%r.txt"), timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(2 * tasks_per_node):
        with open(os.path.join(out_dir, f"plain-{r}.txt")) as a, \
                open(os.path.join(out_dir, f"solar-{r}.txt")) as b:
            want, got = a.read(), b.read()
        assert want and got == want, f"rank {r}: batches differ"
    return out


@pytest.mark.parametrize("workers,lazy", [(0, False), (2, True)])
def test_unmodified_ddp_script_transparent_same_bytes(cluster, dataset, workers, lazy):
    """srun --solar-transparent: an h5py + DistributedSampler + DataLoader script that knows
    nothing of solar gets the same batches and losses, bit for bit, as under plain srun, with
    its reads served from the agents' buffers."""
    out = ddp_plain_then_transparent(cluster, dataset, f"ddp-{workers}", 2, 2,
                                     ["--workers", str(workers)] + (["--lazy"] if lazy else []),
                                     ["--solar-buffer=64%"])
    served = [int(n) for n in re.findall(r"file reads served from the buffer (\d+)", out)]
    assert len(served) == 2 and sum(served) > 0, out
    assert "consumed as planned (" not in out, out  # the script's order matched the plan


def test_peers_unmodified_script_same_bytes_and_nothing_left(cluster, dataset):
    """srun --solar-peers --solar-transparent on 2 nodes with a small buffer: the agents read
    from each other's buffers (their cards in a 0700 folder of plan_dir, removed at the end) and
    the unmodified script gets the plain run's batches."""
    out = ddp_plain_then_transparent(cluster, dataset, "ddp-peers", 3, 1, [],
                                     ["--solar-buffer=40%", "--solar-peers"])
    peers = [int(n) for n in re.findall(r"(\d+) samples read from peers' buffers", out)]
    assert len(peers) == 2 and sum(peers) > 0, out
    assert not [n for n in os.listdir(cluster.plans) if n.endswith(".peers")], \
        os.listdir(cluster.plans)


def test_site_can_forbid_transparent(cluster, dataset):
    cluster.plugstack("transparent=no")
    p = cluster.run("srun", "-N1", *solar_args(dataset, "--solar-transparent"), "true")
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if "error: solar: " in l]
    assert len(lines) == 1 and "--solar-transparent" in lines[0] and "transparent=no" in lines[0], \
        p.stderr


@pytest.mark.parametrize("line", ["optional", "required"])
@pytest.mark.parametrize("command", ["srun", "sbatch", "salloc"])
@pytest.mark.parametrize("bad,named", [
    (["--solar-buffer=lots"], "--solar-buffer"),
    (["--solar-dataset=/nonexistent/x.h5"], "--solar-dataset"),
    (["--solar-buffer="], "--solar-buffer"),  # dropped below: a missing --solar-buffer
])
def test_bad_settings_stop_the_job_under_either_plugstack_line(cluster, dataset, line, command,
                                                               bad, named):
    """With `optional` Slurm itself would report the plugin's failure and go on: solar stops
    srun, sbatch and salloc anyway, before anything is allocated, with one line naming the
    option."""
    cluster.plugstack(line=line)
    key = bad[0].split("=")[0]
    args = [a for a in solar_args(dataset) if not a.startswith(key + "=")]
    if bad[0] != "--solar-buffer=":
        args += bad
    if command == "srun":
        p = cluster.run("srun", "-N1", *args, "echo", "RAN")
    elif command == "sbatch":
        p = cluster.run("sbatch", "-N1", *args, "--wrap", "echo RAN")
    else:
        p = cluster.run("salloc", "-N1", *args, "echo", "RAN")
    assert p.returncode != 0, p.stdout + p.stderr
    assert "RAN" not in p.stdout and "Submitted batch job" not in p.stdout, p.stdout
    assert "Granted job allocation" not in p.stderr, p.stderr
    lines = [l for l in p.stderr.splitlines() if "error: solar: " in l]
    assert len(lines) == 1 and named in lines[0], p.stderr
    assert not cluster.jobs()


@pytest.mark.parametrize("line", ["optional", "required"])
def test_step_shape_error_stops_the_step_under_either_line(cluster, dataset, line):
    cluster.plugstack(line=line)
    p = cluster.run("srun", "-N2", "-n3", *solar_args(dataset), "echo", "RAN")
    assert p.returncode != 0, p.stdout + p.stderr
    assert "RAN" not in p.stdout and "--ntasks-per-node" in p.stderr, p.stdout + p.stderr


def test_installed_package_runs_the_example_job(cluster, dataset):
    """The Debian package unpacked into a staging root, the plugstack line of the docs with no
    agent=/solar= paths (the plugin finds them beside itself), and the documented example job
    (train-example.sbatch) with only the staging root's programs on PATH."""
    deb = os.environ.get("SOLAR_DEB")
    assert deb and os.path.isfile(deb), f"no package at {deb}: ctest runs package.deb first"
    stage = os.path.join(cluster.root, "stage")
    subprocess.run(["dpkg-deb", "-x", deb, stage], check=True, timeout=120)
    plugin = os.path.join(stage, "usr", "lib", "slurm-wlm", "solar_spank.so")
    with open(os.path.join(cluster.dir, "plugstack.conf"), "w") as f:
        f.write(f"required {plugin} plan_dir={cluster.plans} runtime_dir={cluster.run_dir}\n")
    bindir = os.path.join(stage, "usr", "bin")
    env = {k: v for k, v in cluster.env.items() if not k.startswith("SOLAR_")}
    env["PATH"] = f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin"
    out = os.path.join(cluster.root, "example.out")
    script = os.path.join(stage, "usr", "share", "doc", "solar", "examples", "train-example.sbatch")
    p = subprocess.run(["sbatch", "-W", "-o", out, f"--solar-dataset={dataset}", script], env=env, capture_output=True,
                       text=True, timeout=240, cwd=cluster.root)
    text = open(out).read() if os.path.exists(out) else ""
    assert p.returncode == 0, p.stdout + p.stderr + text
    assert text.count("verified (0 wrong), from the node agent") == 4, text
    assert len(re.findall(r"solar: node \d: [1-9]\d* hits", text)) == 2, text
    # Agents served every rank, so the plugin found solar-agent beside itself: the staging root
    # holds the only one on a default path (this build's prefix has none: checked below).
    assert text.count("agent ready in") == 2, text
    assert not os.path.exists("/usr/local/bin/solar-agent")
    os.unlink(out)
    cluster.settle()
    left = agents_running(os.path.join(bindir, "solar-agent"))
    assert not left, f"staged agents outlived the job: {left}"


ISOLATION_PROBE = r"""
import json, os, socket, sys
out = {}
def attempt(name, fn):
    try:
        fn()
        out[name] = "open"
    except PermissionError:
        out[name] = "denied"
    except OSError as e:
        out[name] = f"error {e.errno}"
for path in json.loads(sys.argv[1]):
    def read(p=path):
        with open(p, "rb") as f:
            f.read(1)
    attempt(path, read)
for path in json.loads(sys.argv[2]):
    attempt(path, lambda p=path: os.listdir(p))
for path in json.loads(sys.argv[3]):
    def connect(p=path):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(p)
        finally:
            s.close()
    attempt(path, connect)
print(json.dumps(out))
"""


def proc_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            fields[k] = v.split()
    return fields


def test_another_user_cannot_read_a_jobs_buffer(cluster, dataset):
    """Issue 14, isolation: a job of `nobody`; the agents run as nobody with no privilege left
    (all four uids and gids, no supplementary groups, no capabilities), and another
    unprivileged user (`daemon`) can reach the buffer through none of: the agent's or a rank's
    /proc/PID/fd (the memfd itself), /proc/PID/mem, /proc/PID/map_files, the socket, a file in
    the run folder or /dev/shm. After the job nothing of it is left (clean_after)."""
    import json
    import pwd
    nobody, daemon = pwd.getpwnam("nobody"), pwd.getpwnam("daemon")
    job = subprocess.Popen(
        ["runuser", "-u", "nobody", "--", "env", f"SLURM_CONF={cluster.env['SLURM_CONF']}",
         "srun", "-N2", "--ntasks-per-node=2", *solar_args(dataset), TRAIN, "--compute-ms=40",
         "--verify"], env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=cluster.root)
    try:
        def buffer_fds(pid, where="fd"):
            """The agent's descriptor of the buffer (fd), or a rank's mapping (map_files)."""
            fds = []
            try:
                for fd in os.listdir(f"/proc/{pid}/{where}"):
                    if os.readlink(f"/proc/{pid}/{where}/{fd}").startswith("/memfd:solar-buffer"):
                        fds.append(f"/proc/{pid}/{where}/{fd}")
            except OSError:
                pass
            return fds

        def ready():
            agents, rs = agents_running(), agents_running(TRAIN)
            return (len(agents) == 2 and len(rs) == 4 and all(buffer_fds(p) for p in agents)
                    and all(buffer_fds(p, "map_files") for p in rs) and agents + rs)
        procs = wait_until(ready, timeout=120, what="the job's agents and ranks holding the buffer")
        agents = agents_running()
        # The agents run as the job's user, never root, and keep no privilege.
        for pid in agents:
            st = proc_status(pid)
            assert st["Uid"] == [str(nobody.pw_uid)] * 4, st["Uid"]
            assert st["Gid"] == [str(nobody.pw_gid)] * 4, st["Gid"]
            assert set(st.get("Groups", [])) <= {str(nobody.pw_gid)}, st.get("Groups")
            assert int(st["CapEff"][0], 16) == 0 and int(st["CapPrm"][0], 16) == 0, st
        files = [fd for p in procs for fd in buffer_fds(p) + buffer_fds(p, "map_files")]
        files += [f"/proc/{p}/mem" for p in procs] + [f"/proc/{p}/environ" for p in procs]
        dirs = [f"/proc/{p}/fd" for p in procs] + [f"/proc/{p}/map_files" for p in procs]
        socks = []
        for root, ds, fs in os.walk(cluster.run_dir):
            dirs += [os.path.join(root, d) for d in ds]
            for name in fs:
                (socks if name.endswith(".sock") else files).append(os.path.join(root, name))
        for name in os.listdir("/dev/shm"):
            path = os.path.join("/dev/shm", name)
            if os.stat(path).st_uid == nobody.pw_uid:
                files.append(path)
        assert socks, "no agent socket found under the run folder"
        probe = subprocess.run(
            ["setpriv", f"--reuid={daemon.pw_uid}", f"--regid={daemon.pw_gid}", "--clear-groups",
             "/usr/bin/python3", "-c", ISOLATION_PROBE, json.dumps(files), json.dumps(dirs),
             json.dumps(socks)], capture_output=True, text=True, timeout=60)
        assert probe.returncode == 0, probe.stderr
        seen = json.loads(probe.stdout)
        # Paths of processes that ended meanwhile ("error 2") prove nothing either way; the
        # buffer's own descriptors of live processes must be among the denied.
        opened = {p: r for p, r in seen.items() if r == "open"}
        assert not opened, opened
        alive = [f for f in files if ("/fd/" in f or "/map_files/" in f) and os.path.exists(f)]
        assert alive and all(seen[f] == "denied" for f in alive), (alive, seen)
        assert all(seen[s] == "denied" for s in socks), seen
    finally:
        out, err = job.communicate(timeout=240)
    assert job.returncode == 0, out + err
    assert out.count("verified (0 wrong), from the node agent") == 4, out + err


# Issue 32: what a job's user, or another user, can place where the plugin's root side and
# slurmstepd look.

def slurmd_open_file_limit(cluster):
    """The soft open-file limit slurmd (so its epilog) runs with."""
    with open(os.path.join(cluster.dir, "pids", "slurmd.n1.pid")) as f:
        pid = int(f.read())
    with open(f"/proc/{pid}/limits") as f:
        for line in f:
            if line.startswith("Max open files"):
                return int(line.split()[3])
    raise AssertionError("no open-file limit for slurmd")


def make_deep_tree(top, depth, uid, gid):
    """top/d/d/.../d, `depth` folders deep, made without one descriptor (or path) per level:
    each new folder is made at the top and the tree so far moved into it."""
    cur = os.path.join(top, "d")
    os.mkdir(cur)
    os.chown(cur, uid, gid)
    for _ in range(depth - 1):
        new = os.path.join(top, "n")
        os.mkdir(new)
        os.chown(new, uid, gid)
        os.rename(cur, os.path.join(new, "d"))
        os.rename(new, cur)


def remove_deep_tree(top):
    """Undoes make_deep_tree (and removes `top`): lifts the second level to the top, one level
    at a time (rmtree would need one descriptor and one stack frame per level)."""
    cur = os.path.join(top, "d")
    while os.path.isdir(cur) and not os.path.islink(cur):
        inner = os.path.join(cur, "d")
        if os.path.lexists(inner):
            os.rename(inner, os.path.join(top, "lifted"))
            shutil.rmtree(cur)
            os.rename(os.path.join(top, "lifted"), cur)
        else:
            shutil.rmtree(cur)
    shutil.rmtree(top, ignore_errors=True)


def job_state(cluster, job):
    return cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip()


@pytest.mark.parametrize("trap", ["fifo", "deep_tree"])
def test_job_epilog_survives_what_the_user_leaves_in_a_run_folder(cluster, trap):
    """Finding 5: a step's folder in runtime_dir is the user's to fill, and the root epilog
    sweeps it. A FIFO as agent.pid (a plain open waits for a writer for good: the node stayed
    COMPLETING) and a tree deeper than the open-file limit (std::filesystem::remove_all holds
    one descriptor per level: EMFILE, the folder stayed) neither hold nor defeat it: the folder
    goes and the node is idle again."""
    import pwd
    nobody = pwd.getpwnam("nobody")
    p = cluster.run("sbatch", "--parsable", "-N1", "-w", "n1", "-o", "/dev/null", "--wrap",
                    "sleep 300", user="nobody")
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    folder = os.path.join(cluster.run_dir, f"solar-{job}.7.0")
    fifo = os.path.join(folder, "agent.pid")
    try:
        wait_until(lambda: job_state(cluster, job) == "RUNNING", what="the job running")
        os.mkdir(folder, 0o700)
        os.chown(folder, nobody.pw_uid, nobody.pw_gid)
        if trap == "fifo":
            os.mkfifo(fifo, 0o600)
            os.chown(fifo, nobody.pw_uid, nobody.pw_gid)
        else:
            make_deep_tree(folder, slurmd_open_file_limit(cluster) + 64, nobody.pw_uid,
                           nobody.pw_gid)
        assert cluster.run("scancel", job).returncode == 0
        wait_until(lambda: not os.path.lexists(folder), timeout=60,
                   what="the epilog's removal of the run folder")
        wait_until(cluster.idle, timeout=60, what="the node idle after the epilog")
    finally:
        cluster.run("scancel", job)
        if os.path.exists(fifo) and trap == "fifo":
            try:  # an epilog blocked opening it gets its end of file
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        if os.path.lexists(folder):
            remove_deep_tree(folder)


@pytest.mark.parametrize("squat", ["fifo_log", "shared_log", "plan"])
def test_names_another_user_takes_in_plan_dir_do_not_touch_the_step(cluster, dataset, squat):
    """Finding 6: plan_dir is 1777 and job ids are predictable. Another user (daemon) takes
    the step's names before it runs: the agent's log as a FIFO (user_init waited for a reader
    for good), as a 0666 file (the squatter read the log and could forge srun's stats lines),
    the plan's name (srun failed), and a folder named like a step folder. The step runs from its
    own private folder anyway, every byte verified through the agents, srun prints both nodes'
    stats, and the squatter's files stay as they were: empty."""
    import pwd
    nobody, daemon = pwd.getpwnam("nobody"), pwd.getpwnam("daemon")
    out_dir = os.path.join(cluster.root, f"squat-{squat}")
    os.mkdir(out_dir)
    os.chown(out_dir, nobody.pw_uid, nobody.pw_gid)
    script = os.path.join(out_dir, "job.sbatch")
    with open(script, "w") as f:
        f.write(f"""#!/bin/bash
#SBATCH -N2 --ntasks-per-node=1
#SBATCH --solar-dataset={dataset}
#SBATCH --solar-buffer=40%
#SBATCH --solar-epochs=2
#SBATCH --solar-batch=8
#SBATCH --solar-verbose
srun {TRAIN} --verify
""")
    os.chmod(script, 0o644)
    out = os.path.join(out_dir, "job.out")
    p = cluster.run("sbatch", "--parsable", "--hold", "-o", out, script, user="nobody")
    assert p.returncode == 0, p.stderr
    job = p.stdout.strip().split(";")[0]
    squats = []

    def take(name, kind):
        path = os.path.join(cluster.plans, name)
        if kind == "fifo":
            os.mkfifo(path, 0o666)
        elif kind == "dir":
            os.mkdir(path, 0o700)
        else:
            open(path, "w").close()
        os.chown(path, daemon.pw_uid, daemon.pw_gid)
        os.chmod(path, 0o700 if kind == "dir" else 0o666)
        squats.append(path)

    try:
        take(f"solar-{job}.0.AAAAAA", "dir")
        if squat == "fifo_log":
            take(f"solar-{job}.0.plan.node0.log", "fifo")
        elif squat == "shared_log":
            for node in (0, 1):
                take(f"solar-{job}.0.plan.node{node}.log", "file")
        else:
            take(f"solar-{job}.0.plan", "file")
        assert cluster.run("scontrol", "release", job).returncode == 0
        wait_until(lambda: not job_state(cluster, job), timeout=150, what="the job's end")
        text = open(out).read() if os.path.exists(out) else ""
        assert text.count("verified (0 wrong), from the node agent") == 2, text
        assert len(re.findall(r"solar: node \d: [1-9]\d* hits", text)) == 2, text
        for path in squats:
            st = os.lstat(path)
            assert st.st_uid == daemon.pw_uid and (os.path.isdir(path) or st.st_size == 0), path
        if squat == "fifo_log":
            assert stat_is_fifo(squats[1])
    finally:
        cluster.run("scancel", job)
        for path in squats:
            if os.path.exists(path) and stat_is_fifo(path):
                try:  # an agent blocked opening it for writing gets a reader, then none
                    os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
                except OSError:
                    pass
        for path in squats:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.unlink(path)
        cluster.settle()
        shutil.rmtree(out_dir)


def stat_is_fifo(path):
    import stat
    return stat.S_ISFIFO(os.lstat(path).st_mode)


def test_slurmstepd_takes_the_step_from_its_folder_not_the_environment(cluster, dataset):
    """Finding 7: slurmstepd trusted SOLAR_STEP, SOLAR_PLAN and SOLAR_TRANSPARENT from the
    job's environment, so a job that set them by hand (srun then plans nothing) got an agent
    and the preload on a site with transparent=no, or a buffer above max_buffer. Now it takes
    the plan from the step's own folder (found by job and step id and its owner), checks it
    against the site's limits itself, and plans are private (0600 in a 0700 folder)."""
    plans = {}
    try:
        # Plans as srun makes them where the site allows it (copied out by the step itself).
        for name, extra in (("transparent", ["--solar-transparent"]), ("plain", [])):
            plans[name] = os.path.join(cluster.root, f"plan-{name}.copy")
            p = cluster.run("srun", "-N1", *solar_args(dataset, *extra), "sh", "-c",
                            'stat -c "MODES %a" "$SOLAR_PLAN" "$(dirname "$SOLAR_PLAN")"; '
                            f'cp "$SOLAR_PLAN" {plans[name]}')
            assert p.returncode == 0, p.stdout + p.stderr
            assert "MODES 600\nMODES 700" in p.stdout, p.stdout
        cluster.settle()
        cluster.plugstack("transparent=no max_buffer=4K")
        probe = 'sh -c \'echo "SOCKET=${SOLAR_SOCKET:-none} PRELOAD=${LD_PRELOAD:-none}"\''
        script = os.path.join(cluster.root, "bypass.sbatch")
        data = dataset.split(":")[0]
        with open(script, "w") as f:
            f.write(f"""#!/bin/bash
# By hand, as the user: the variables srun would set (no --solar-* option: srun plans nothing).
for plan in {plans['transparent']} {plans['plain']}; do
  n=$((n + 0))
  echo "STEP env-$plan"
  SOLAR_STEP=$SLURM_JOB_ID.$n SOLAR_PLAN=$plan SOLAR_TRANSPARENT=1 SOLAR_DATASET={dataset} \\
    srun -N1 {probe}
  n=$((n + 1))
done
# A step folder made by hand, as srun would, with each plan.
for plan in {plans['transparent']} {plans['plain']}; do
  echo "STEP folder-$plan"
  d=$(mktemp -d {cluster.plans}/solar-$SLURM_JOB_ID.$n.XXXXXX)
  cp $plan $d/plan && chmod 600 $d/plan
  SOLAR_STEP=$SLURM_JOB_ID.$n SOLAR_DATASET={dataset} srun -N1 {probe}
  rm -rf "$d"
  n=$((n + 1))
done
""")
        out = os.path.join(cluster.root, "bypass.out")
        p = cluster.run("sbatch", "-W", "-o", out, script)
        text = open(out).read() if os.path.exists(out) else ""
        os.unlink(out)
        assert p.returncode == 0 or text, p.stdout + p.stderr
        assert text.count("STEP ") == 4, text
        assert "SOCKET=/" not in text and PRELOAD not in text, text
        assert "transparent=no" in text and "max_buffer" in text, text
        assert not agents_running()
    finally:
        for path in plans.values():
            if os.path.exists(path):
                os.unlink(path)
