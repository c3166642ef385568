# SPDX-License-Identifier: Apache-2.0
"""The local tier (issue 37, items 2 and 3), batch and transparent modes: a dataset 5x the agents' memory (--buffer
20%) with a local tier for the rest (--local-buffer 80%), 2 nodes x 2 ranks, 4 epochs, real
agents writing and reading their tier files on this machine's disk. Every sample each rank gets
is checked against the generator's content rule (solar-example-train --verify); the agents'
stats say how many samples came back from the local disk, per epoch; nothing is left in the
local folder after the run, after an agent is SIGKILLed, after copies corrupted on disk, on
a disk too small for the tier, on a disk that fills up mid-run (ENOSPC on a write) or on a disk
whose reads fail with EIO (each then degrades to storage reads, one warning)."""
import json
import os
import pathlib
import re
import signal
import subprocess
import threading

import pytest

from testlib import SOLAR, TRAIN, reaped, run, wait_until

SAMPLES, EPOCHS, BATCH = 640, 4, 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("tier")
    run(SOLAR, "gen", d / "d.h5", "--samples", SAMPLES, "--preset", "small")
    return d / "d.h5"


def job(tmp_path, data, *extra, train=(), local_dir=None):
    local_dir = local_dir or tmp_path / "nvme"
    local_dir.mkdir(exist_ok=True)
    return [SOLAR, "run", "-n", "4", "--nodes", "2", "--dataset", data, "--buffer", "20%",
            "--local-buffer", "80%", "--local-dir", local_dir, "--epochs", EPOCHS, "--batch",
            BATCH, "--stats-out", tmp_path / "stats.json", *extra, "--", TRAIN, "--verify",
            *train]


def verified(p):
    """Every rank checked every sample it got, and none was wrong."""
    out = p.stdout + p.stderr
    wrong = [int(w) for w in re.findall(r"verified \((\d+) wrong\)", out)]
    assert wrong == [0, 0, 0, 0], out


def tiers(tmp_path):
    with open(tmp_path / "stats.json") as f:
        return [n for n in json.load(f)["nodes"]]


@pytest.mark.parametrize("mode", [[], ["--zero-copy"]], ids=["rings", "zero-copy"])
def test_every_sample_right_and_read_back_from_the_local_disk(tmp_path, data, mode):
    p = run(*job(tmp_path, data, *mode), timeout=300)
    verified(p)
    for n in tiers(tmp_path):
        lt = n["local_tier"]
        # The plan's moves, done: a write for each planned write, every planned read back read
        # from the disk (or still in memory), none from storage, nothing wrong.
        assert lt["writes"] == lt["planned_writes"] > 0, lt
        assert 0 < lt["reads"] <= lt["planned_reads"], lt
        assert lt["from_storage"] == lt["corrupt"] == lt["errors"] == 0 and not lt["off"], lt
        per_epoch = [e["local_samples"] for e in n["epochs"]]
        assert per_epoch[0] == 0 and all(k > 0 for k in per_epoch[1:]), per_epoch
        # Memory holds a fifth of the dataset, so most of each later epoch came from the disk.
        assert all(e["fetched_samples"] < SAMPLES / 2 / 2 for e in n["epochs"][1:]), n["epochs"]
    assert list((tmp_path / "nvme").iterdir()) == []


def agents_in(folder):
    """The PIDs of the solar-agents whose --local-dir lies in `folder` (this test's runs)."""
    pids = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"solar-agent") and any(
                a.startswith(str(folder).encode() + b"/") for a in argv):
            pids.append(int(d.name))
    return pids


def agent_of(local_dir):
    """The PID of the solar-agent started for exactly `local_dir`, or None."""
    for pid in agents_in(local_dir.parent):
        try:
            argv = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(local_dir).encode() in argv:
            return pid
    return None


def test_an_agent_killed_leaves_nothing_in_the_local_folder(tmp_path, data):
    nvme = tmp_path / "nvme"
    cmd = job(tmp_path, data, train=["--compute-ms", "40"])
    with reaped(subprocess.Popen([str(a) for a in cmd], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)) as p:
        wait_until(lambda: any(nvme.glob("*-node0/tier")), timeout=60, what="node 0's tier")
        folder = next(nvme.glob("*-node0"))
        pid = agent_of(folder)
        assert pid is not None, list(nvme.iterdir())
        os.kill(pid, signal.SIGKILL)
        out, err = p.communicate(timeout=300)
    # Its ranks go on reading the file themselves; the run's sweep removes what it left.
    verified(subprocess.CompletedProcess(cmd, p.returncode, out, err))
    assert list(nvme.iterdir()) == [], list(nvme.iterdir())


def test_solar_run_killed_leaves_nothing_in_the_local_folder(tmp_path, data):
    """SIGKILL of `solar run` itself: its agents and ranks go (parent-death signal) and its
    watchdog removes the run folder and the local tier's folders it lists, though they lie
    outside it (--local-dir)."""
    nvme, tmp = tmp_path / "nvme", tmp_path / "tmp"
    tmp.mkdir()
    cmd = job(tmp_path, data, train=["--compute-ms", "40"])
    with reaped(subprocess.Popen([str(a) for a in cmd], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL,
                                 env=dict(os.environ, TMPDIR=str(tmp)))) as p:
        wait_until(lambda: any(nvme.glob("*-node1/tier")), timeout=60, what="node 1's tier")
        p.kill()
        p.wait(timeout=30)
    wait_until(lambda: not agents_in(nvme), timeout=30, what="the run's agents gone")
    wait_until(lambda: not any(nvme.iterdir()) and not any(tmp.iterdir()), timeout=30,
               what="the run folder and the local tier's folders removed")


def test_copies_corrupted_on_disk_are_read_from_storage_instead(tmp_path, data):
    nvme = tmp_path / "nvme"
    cmd = job(tmp_path, data, "--keep-run-dir", train=["--compute-ms", "25"])
    stop = threading.Event()
    corrupted = []

    def corrupt():  # one byte of every slot of every tier file, over and over
        while not stop.is_set():
            for f in nvme.glob("*/tier"):
                try:
                    with open(f, "r+b") as w:
                        size = os.fstat(w.fileno()).st_size
                        for at in range(0, size, 4096 * 65):  # the slots of 256 KiB + label
                            os.pwrite(w.fileno(), b"\x5a", at + 100)
                    corrupted.append(f)
                except OSError:
                    pass
            stop.wait(0.05)

    t = threading.Thread(target=corrupt)
    t.start()
    try:
        p = run(*cmd, timeout=300)
    finally:
        stop.set()
        t.join()
    kept = [line.split("kept ", 1)[1].strip() for line in p.stderr.splitlines() if "kept " in line]
    try:
        verified(p)
        assert corrupted
        nodes = tiers(tmp_path)
        assert sum(n["local_tier"]["corrupt"] for n in nodes) > 0, nodes
        for n in nodes:
            lt = n["local_tier"]
            assert lt["from_storage"] >= lt["corrupt"], lt
            log = (pathlib.Path(kept[0]) / f"node{n['node']}.log").read_text()
            assert log.count("CRC-32 mismatch") == (1 if lt["corrupt"] else 0), log
        assert list(nvme.iterdir()) == []
    finally:
        for k in kept:
            run("rm", "-rf", k)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root)")
def test_a_disk_too_small_for_the_tier_degrades_to_storage_with_one_warning(tmp_path, data):
    small = tmp_path / "small"
    small.mkdir()
    run("mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", small)
    try:
        p = run(*job(tmp_path, data, "--keep-run-dir", local_dir=small), timeout=300)
        kept = [line.split("kept ", 1)[1].strip() for line in p.stderr.splitlines()
                if "kept " in line]
        try:
            verified(p)
            for n in tiers(tmp_path):
                lt = n["local_tier"]
                assert lt["off"] and lt["errors"] == 1 and lt["reads"] == lt["writes"] == 0, lt
                assert lt["from_storage"] > 0, lt
                log = (pathlib.Path(kept[0]) / f"node{n['node']}.log").read_text()
                assert log.count("the local tier is off") == 1, log
            assert list(small.iterdir()) == []
        finally:
            for k in kept:
                run("rm", "-rf", k)
    finally:
        run("umount", small)


def on_a_failing_disk(tmp_path, data, check, **variables):
    """Runs the job with its programs seeing the tier files through eio_shim.c (`variables`
    say how they fail), checks every sample right and the local folder empty after, and calls
    check(local_tier stats, the warnings of a failed read or write) for each node."""
    shim = tmp_path / "eio_shim.so"
    run("cc", "-shared", "-fPIC", "-O2", "-o", shim,
        pathlib.Path(__file__).with_name("eio_shim.c"), "-ldl")
    env = dict(os.environ, LD_PRELOAD=str(shim), SOLAR_TEST_EIO_SUFFIX="/tier", **variables)
    nvme = tmp_path / "nvme"
    p = run(*job(tmp_path, data, "--keep-run-dir"), timeout=300, env=env)
    kept = [line.split("kept ", 1)[1].strip() for line in p.stderr.splitlines() if "kept " in line]
    try:
        verified(p)
        for n in tiers(tmp_path):
            log = (pathlib.Path(kept[0]) / f"node{n['node']}.log").read_text()
            check(n["local_tier"], [line for line in log.splitlines()
                                    if re.search(r"local tier: (reading|writing) sample", line)])
        assert list(nvme.iterdir()) == []
    finally:
        for k in kept:
            run("rm", "-rf", k)


def test_a_local_disk_filling_up_mid_run_degrades_to_storage_with_one_warning(tmp_path, data):
    # The disk fills up beneath the preallocated tier file (eio_shim.c: every write of a tier
    # file after each agent's first 20 returns ENOSPC, as on btrfs or ZFS). No wrong byte, the
    # job finishes, each agent warns once and writes nothing more; the copies it made before
    # are still read back (they are on the disk as written), the rest come from storage.
    def check(lt, warned):
        assert lt["full"] and not lt["off"] and lt["errors"] >= 1, lt
        # Each of the 20 copies is read back at most once in each later epoch.
        assert lt["writes"] == 20 and 0 < lt["reads"] <= 20 * (EPOCHS - 1), lt
        assert lt["from_storage"] > 0, lt
        assert len(warned) == 1 and "No space left on device" in warned[0], warned

    on_a_failing_disk(tmp_path, data, check, SOLAR_TEST_ENOSPC_AFTER="20")


def test_a_local_disk_returning_eio_degrades_to_storage_with_one_warning(tmp_path, data):
    # The disk's reads fail (eio_shim.c, preloaded: every read of a tier file after each
    # agent's first 12 returns EIO, as bad sectors do). No wrong byte, the job finishes, each
    # agent warns once, stops using its tier and reads those samples from storage instead.
    def check(lt, warned):
        assert lt["off"] and lt["errors"] >= 1, lt
        assert lt["reads"] <= 12 and lt["from_storage"] > 0, lt
        assert len(warned) == 1 and "local tier: reading sample" in warned[0], warned
        assert "Input/output error" in warned[0], warned

    on_a_failing_disk(tmp_path, data, check, SOLAR_TEST_EIO_AFTER="12")


def test_transparent_same_bytes_as_plain_and_samples_read_back(tmp_path, data):
    """The unmodified DDP script (h5py + DistributedSampler) under --transparent with a local
    tier: per-batch digests identical to the script without solar, the interposers served reads
    from the buffer, and the agents read samples back from the local disk after epoch 1."""
    from test_transparent import digests, run_script, served
    plain = run_script(tmp_path, data, "plain", "--buffer", "100%", "--no-agent", epochs=3)
    assert plain.returncode == 0, plain.stderr
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    solar = run_script(tmp_path, data, "solar", "--transparent", "--buffer", "20%",
                       "--local-buffer", "80%", "--local-dir", nvme, "--stats-out",
                       tmp_path / "stats.json", epochs=3)
    assert solar.returncode == 0, solar.stdout + solar.stderr
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)
    hits, _ = served(solar.stderr)
    assert hits > 0, solar.stderr
    for n in tiers(tmp_path):
        lt = n["local_tier"]
        assert lt["reads"] > 0 and lt["corrupt"] == lt["errors"] == 0, lt
        assert sum(e["local_samples"] for e in n["epochs"][1:]) > 0, n["epochs"]
    assert list(nvme.iterdir()) == []


@pytest.mark.parametrize("extra,says", [
    (["--local-dir", "/nonexistent-solar-dir"], "--local-dir"),
    (["--local-buffer", "50%", "--nodes", "2", "--peers"], "--peers"),
    (["--local-buffer", "lots"], "--local-buffer"),
])
def test_refusals_name_the_option(tmp_path, data, extra, says):
    p = run(SOLAR, "run", "-n", "2", "--dataset", data, "--buffer", "20%", "--epochs", 1,
            "--batch", BATCH, *extra, "--", TRAIN, check=False)
    assert p.returncode == 2 and says in p.stderr, p.stderr
