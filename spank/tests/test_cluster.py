# SPDX-License-Identifier: Apache-2.0
"""solar_spank.so on a real Slurm cluster on this host (scripts/test-cluster: a private munged,
slurmctld and two slurmd on loopback), real HDF5 files from `solar gen`, real agents. Every
wait polls (sinfo, squeue, files); every daemon is stopped by its recorded PID, even when a
test fails."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

from slurm_cluster import (AGENT, DDP_SCRIPT, SOLAR, SPANK, TRAIN, agents_running, solar_args,
                           wait_until)

if os.geteuid() != 0:
    pytest.skip("the test cluster needs root (slurmd starts jobs as their users)",
                allow_module_level=True)


def test_srun_help_lists_every_option(cluster):
    out = cluster.run("srun", "--help").stdout
    for opt in ["--solar-dataset", "--solar-labels", "--solar-buffer", "--solar-epochs",
                "--solar-batch", "--solar-seed", "--solar-order", "--solar-order-file",
                "--solar-imbalance",
                "--solar-transparent", "--solar-start-epoch", "--solar-start-step",
                "--solar-verbose", "--solar-stats", "--solar-plan", "--solar=off"]:
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


def test_local_tier_under_srun_every_sample_verified_nothing_left(cluster, dataset, tmp_path):
    """--solar-local-buffer with the site's local_dir= (issue 37): each node's agent keeps its
    tier in local_dir/solar-J.S.N, reads samples back from it in epochs 2+, every sample right;
    the folders are gone after the step. Without local_dir= the option is refused by name."""
    import json
    local = tmp_path / "nvme"
    local.mkdir()
    os.chmod(local, 0o1777)
    refused = cluster.run("srun", "-N1", *solar_args(dataset, "--solar-local-buffer=60%"), "true")
    assert refused.returncode != 0 and "--solar-local-buffer" in refused.stderr, refused.stderr
    assert "local_dir=" in refused.stderr, refused.stderr
    cluster.plugstack(f"local_dir={local}")
    try:
        stats = tmp_path / "stats.json"
        p = cluster.run("srun", "-N2", "--ntasks-per-node=2",
                        *solar_args(dataset, "--solar-buffer=20%", "--solar-local-buffer=60%",
                                    f"--solar-stats={stats}"), TRAIN, "--verify")
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert out.count("verified (0 wrong), from the node agent") == 4, out
        with open(stats) as f:
            nodes = json.load(f)["nodes"]
        for n in nodes:
            lt = n["local_tier"]
            assert lt["writes"] > 0 and lt["reads"] > 0 and lt["from_storage"] == 0, lt
            assert lt["dir"].startswith(f"{local}/solar-"), lt
            assert all(e["local_samples"] > 0 for e in n["epochs"][1:]), n["epochs"]
        wait_until(lambda: not os.listdir(local), what="the local tier's folders removed")
    finally:
        cluster.plugstack()


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


def test_million_samples_over_100_epochs_streamed_nothing_large_in_plan_dir(cluster):
    """Issue 40: a step of 10^6 samples x 100 epochs (10^8 accesses; its whole plan file is
    1.16 GB) gets a streamed plan: srun writes the inputs alone, each node's agent and ranks
    compute their share as the step goes. Every rank's first batches are verified from its
    agent, and what plan_dir holds while the ranks run is small (listed by rank 0 from inside
    the step). How fast it starts is measured in the closing note, not here."""
    import json
    path = os.path.join(cluster.root, "million.h5")
    subprocess.run([SOLAR, "gen", path, "--samples", "1000000", "--shape", "16", "--dtype",
                    "int16", "--seed", "5", "--no-progress"], check=True, capture_output=True,
                   timeout=300)
    os.chmod(path, 0o644)
    listing = os.path.join(cluster.root, "plan-dir-listing.txt")
    report = os.path.join(cluster.root, "million-%r.json")
    try:
        p = cluster.run(
            "srun", "-N2", "--ntasks-per-node=2", f"--solar-dataset={path}:/data",
            "--solar-buffer=10%", "--solar-epochs=100", "--solar-batch=32", "--solar-verbose",
            "sh", "-c", f'[ "$SLURM_PROCID" = 0 ] && find {cluster.plans} -type f -printf '
            f'"%s %p\\n" > {listing}; exec "$0" "$@"', TRAIN, "--verify", "--batches", "20",
            "--report", report, timeout=600)
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert out.count("20 batches, 640 samples, verified (0 wrong), from the node agent") == 4, \
            out
        assert "streamed (each node computes its share" in out, out
        with open(listing) as f:
            files = [(int(size), name) for size, name in (l.rstrip("\n").split(" ", 1) for l in f)]
        assert any(name.endswith("/plan") for _, name in files), files
        assert all(size < 1 << 20 for size, _ in files), files
        for r in range(4):
            with open(report.replace("%r", str(r))) as f:
                assert json.load(f)["first_batch_seconds"] > 0
    finally:
        for f in [path, listing] + glob.glob(report.replace("%r", "*")):
            if os.path.exists(f):
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


def test_order_unknown_pools_the_nodes_buffers(cluster, dataset):
    """srun --solar-transparent --solar-peers --solar-order=unknown: the agents start in demand
    mode (the plugin passes --order-unknown), each keeps the samples placed on its node, and a
    rank's miss of the other node's is read from that node's buffer; the bytes are plain's."""
    out = ddp_plain_then_transparent(cluster, dataset, "ddp-unknown", 3, 1, [],
                                     ["--solar-buffer=40%", "--solar-peers",
                                      "--solar-order=unknown"])
    assert out.count("demand mode from ") == 2 and "(--order unknown)" in out, out
    assert out.count("pooled over 2 nodes") == 2, out
    fetched = [int(n) for n in re.findall(r"(\d+) read from their buffers", out)]
    assert len(fetched) == 2 and sum(fetched) > 0, out


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


MULTIARCH = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True,
                           check=True).stdout.strip()


def staged_packages(cluster):
    """Every Debian package of the build (tests/install: package.deb) unpacked into one staging
    root, once."""
    deb_dir = os.environ.get("SOLAR_DEB_DIR")
    debs = sorted(glob.glob(os.path.join(deb_dir or "", "*.deb")))
    assert debs, f"no packages in {deb_dir}: ctest runs package.deb first"
    stage = os.path.join(cluster.root, "stage")
    if not os.path.isdir(stage):
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", deb, stage], check=True, timeout=120)
    return stage


def plugin_of_release(src, dst, version):
    """A copy of the plugin claiming another Slurm release: its plugin_version (0xMMmmuu) set
    to `version`, found through readelf (symbol value minus its section's address, plus the
    section's file offset)."""
    syms = subprocess.run(["readelf", "-W", "--dyn-syms", src], capture_output=True, text=True,
                          check=True).stdout
    m = re.search(r"^\s*\d+: ([0-9a-f]+)\s+4 OBJECT\s+GLOBAL\s+\S+\s+(\d+) plugin_version$",
                  syms, re.M)
    assert m, syms
    addr, index = int(m.group(1), 16), int(m.group(2))
    sections = subprocess.run(["readelf", "-W", "-S", src], capture_output=True, text=True,
                              check=True).stdout
    s = re.search(rf"^\s*\[\s*{index}\]\s+\S+\s+\S+\s+([0-9a-f]+) ([0-9a-f]+)", sections, re.M)
    assert s, sections
    offset = addr - int(s.group(1), 16) + int(s.group(2), 16)
    data = bytearray(open(src, "rb").read())
    data[offset:offset + 4] = version.to_bytes(4, "little")
    with open(dst, "wb") as f:
        f.write(data)


def test_slurm_check_sees_the_plugin_in_effect_and_a_mismatched_release(cluster, dataset):
    """`solar slurm-check` on the real cluster: the plugin in effect (exit 0); then a plugin of
    another Slurm release under an `optional` line: Slurm refuses it (srun prints "Incompatible
    Slurm plugin" on every step and runs it without solar, --solar-* unrecognised) and
    slurm-check names the two releases (exit 1)."""
    stage = staged_packages(cluster)
    solar = os.path.join(stage, "usr", "bin", "solar")
    cluster.plugstack(line="optional")
    p = cluster.run(solar, "slurm-check")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "the plugin is in effect" in p.stdout and "srun --help lists" in p.stdout, p.stdout
    own = subprocess.run(["srun", "--version"], capture_output=True, text=True,
                         env=cluster.env).stdout.split()[1]
    major, minor = (int(x) for x in own.split(".")[:2])
    os.makedirs(os.path.join(cluster.root, "other"), exist_ok=True)
    other = os.path.join(cluster.root, "other", "solar_spank.so")
    plugin_of_release(SPANK, other, (major + 1) << 16 | (minor + 1) << 8)
    with open(os.path.join(cluster.dir, "plugstack.conf"), "w") as f:
        f.write(f"optional {other} agent={AGENT} solar={SOLAR} plan_dir={cluster.plans}\n")
    try:
        p = cluster.run(solar, "slurm-check")
        assert p.returncode == 1, p.stdout + p.stderr
        assert f"built for Slurm {major + 1}.{minor + 1:02d}.0, this host runs {own}" in p.stdout
        assert "srun --help (exit" in p.stdout and "Incompatible" in p.stdout, p.stdout
        step = cluster.run("srun", "-N1", "echo", "RAN")
        assert step.returncode == 0 and "RAN" in step.stdout, step.stdout + step.stderr
        assert "Incompatible Slurm plugin" in step.stderr, step.stderr
        step = cluster.run("srun", "-N1", f"--solar-dataset={dataset}", "echo", "RAN")
        assert step.returncode != 0 and "unrecognized option '--solar-dataset" in step.stderr
    finally:
        cluster.plugstack()
        os.unlink(other)
    # No line at all: said so, naming the file.
    with open(os.path.join(cluster.dir, "plugstack.conf"), "w") as f:
        f.write("# nothing here\n")
    try:
        p = cluster.run(solar, "slurm-check")
        assert p.returncode == 1 and "no active solar_spank.so line in" in p.stdout, p.stdout
    finally:
        cluster.plugstack()


def test_installed_package_runs_the_example_job(cluster, dataset):
    """The Debian package unpacked into a staging root, the plugstack line of the docs with no
    agent=/solar= paths (the plugin finds them beside itself), and the documented example job
    (train-example.sbatch) with only the staging root's programs on PATH."""
    stage = staged_packages(cluster)
    plugin = os.path.join(stage, "usr", "lib", MULTIARCH, "slurm-wlm", "solar_spank.so")
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
