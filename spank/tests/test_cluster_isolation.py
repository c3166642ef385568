# SPDX-License-Identifier: Apache-2.0
"""solar_spank.so on the test cluster: what another user can reach of a job (issue 14: the
buffer, the socket, the agent's privileges) and what a job's user, or another user, can place
where the plugin's root side and slurmstepd look (issue 32: run folders, plan_dir's names, the
step's environment). Fixtures in conftest.py, the cluster in slurm_cluster.py."""
import os
import re
import shutil
import subprocess

import pytest

from slurm_cluster import PRELOAD, TRAIN, agents_running, solar_args, wait_until
from testlib import proc_status

if os.geteuid() != 0:
    pytest.skip("the test cluster needs root (slurmd starts jobs as their users)",
                allow_module_level=True)

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
