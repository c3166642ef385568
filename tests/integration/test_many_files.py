# SPDX-License-Identifier: Apache-2.0
"""Datasets of many HDF5 files end to end (issue 35), the batch modes: `solar run` with real
agents (and peers, and solar-stored) over what `solar gen` writes in the layouts of real
workloads: the SOLAR artifact's CosmoFlow (one sample a file, DIR:/split), DLIO (rows of a
few files, DIR:/records[]). solar-example-train --verify checks every sample's bytes and label
against gen's content rule, so a rank handed one wrong byte fails the test. Files changed
under a running job: the job either stops with an error naming the file, or finishes with
every sample verified; never a wrong byte. (The transparent mode and solar.torch.Loader over
many files have their own tests: test_transparent_files.py, tests/python.)"""
import json
import os
import re
import shutil
import subprocess

import pytest

from test_data_path import agents_up, at_line, interrupt, kill_agent, wrong_counts
from test_peers import peer_counts
from testlib import SOLAR, STORED, TRAIN, count_lines, reaped, run, wait_until

# The artifact's layout, small: 160 samples of 2x16x16 int16 (1 KiB), one a file.
ART_SAMPLES, ART_SHAPE = 160, "2,16,16"
# solar-example-train's last line for a rank that finished.
RANK_DONE = re.compile(r"rank (\d+): (\d+) batches, (\d+) samples, verified \((\d+) wrong\), "
                       r"(from the node agent|read directly)")
FAILED = "solar-example-train: "  # how a rank that stopped on an error starts its line


def gen(out, *args):
    return run(SOLAR, "gen", out, "--no-progress", *args)


def artifact(folder, seed=0, shape=ART_SHAPE, samples=ART_SAMPLES):
    gen(folder, "--layout", "per-sample-files", "--samples", samples, "--shape", shape,
        "--seed", seed)
    return folder


def solar_run(tmp_path, spec, *extra, labels="/unitPar", epochs=3, batch=4, nodes=2, ntasks=4,
              buffer="40%", train=(), popen=False, wrap=None):
    """`solar run` of solar-example-train --verify over `spec`; its run folder under tmp_path.
    `wrap`: a shell line the command is appended to (`ulimit -n 256; exec`)."""
    cmd = [SOLAR, "run", "-n", ntasks, "--nodes", nodes, "--dataset", spec, "--labels", labels,
           "--buffer", buffer, "--epochs", epochs, "--batch", batch, *extra, "--", TRAIN,
           "--verify", "--record", tmp_path / "rank-%r.txt", *train]
    cmd = [str(c) for c in cmd]
    if wrap:
        cmd = ["bash", "-c", f'{wrap} "$@"', "bash", *cmd]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    if popen:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
    return run(*cmd, check=False, env=env)


def ranks_done(out):
    """{rank: (samples, wrong, how)} of every rank that finished."""
    return {int(m.group(1)): (int(m.group(3)), int(m.group(4)), m.group(5))
            for m in RANK_DONE.finditer(out)}


def assert_every_sample_verified(p, samples, epochs, ranks=4, how=None):
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    done = ranks_done(out)
    assert sorted(done) == list(range(ranks)), out
    assert all(wrong == 0 for _, wrong, _ in done.values()), out
    assert sum(n for n, _, _ in done.values()) == samples * epochs, out
    if how:
        assert all(h == how for _, _, h in done.values()), out
    assert "wrong content" not in out, out


def assert_stopped_naming_or_verified(rc, out, path, samples, epochs):
    """A file changed under the job: no rank ever got a wrong byte, and either every rank
    finished with every sample verified, or the job failed and every rank that did not finish
    said why, naming the file."""
    assert "wrong content" not in out, out
    assert all(n == 0 for n in wrong_counts(out)), out
    # An agent that failed exits by itself (it once deadlocked sending its last words, until
    # solar run killed it 10 s later).
    assert "did not stop on SIGTERM" not in out, out
    done = ranks_done(out)
    if rc == 0:
        assert len(done) == 4 and sum(n for n, _, _ in done.values()) == samples * epochs, out
        return
    failed = [l for l in out.splitlines() if l.startswith(FAILED)]
    assert failed and len(failed) + len(done) == 4, out
    # What the agents told their ranks, and the ranks' own errors, name the file.
    for line in failed + [l for l in out.splitlines() if "the agent stopped:" in l]:
        assert str(path) in line, line


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    return artifact(tmp_path_factory.mktemp("art") / "cf")


@pytest.fixture(scope="module")
def dlio(tmp_path_factory):
    """DLIO's layout: 8 files of 50 rows, the last 30 (380 samples), 8x8 uint8 rows."""
    out = tmp_path_factory.mktemp("dlio") / "dlio"
    gen(out, "--layout", "dlio", "--files", 8, "--samples-per-file", 50, "--samples", 380,
        "--shape", "8,8")
    return out


# ---- the artifact's layout: one sample a file ------------------------------------------------

def test_artifact_layout_two_nodes_every_sample_verified(tmp_path, art):
    p = solar_run(tmp_path, f"{art}/:/split")
    assert_every_sample_verified(p, ART_SAMPLES, 3, how="from the node agent")
    # Both agents served, each with its summary line.
    assert len(re.findall(r"^solar run: node [01]: \d+ steps", p.stderr, re.M)) == 2, p.stderr


def test_artifact_layout_agent_killed_mid_run_same_result(tmp_path, art):
    """An agent SIGKILLed while its ranks run: they go on reading the files directly, every
    sample still verified, nothing lost or read twice."""
    (tmp_path / "whole").mkdir()
    whole = solar_run(tmp_path / "whole", f"{art}/:/split", epochs=6, batch=2)
    assert_every_sample_verified(whole, ART_SAMPLES, 6)
    want = {r: (tmp_path / "whole" / f"rank-{r}.txt").read_text() for r in range(4)}
    p = solar_run(tmp_path, f"{art}/:/split", epochs=6, batch=2, train=["--compute-ms", "3"],
                  popen=True)
    rc, out, err = interrupt(p, lambda p: kill_agent(p, 0), agents_up(p),
                             at_line(tmp_path / "rank-0.txt", 10))
    assert rc == 0, out + err
    assert "went away" in err, err
    done = ranks_done(out + err)
    assert sorted(done) == [0, 1, 2, 3] and all(w == 0 for _, w, _ in done.values()), out + err
    assert sum(n for n, _, _ in done.values()) == ART_SAMPLES * 6, out + err
    # Node 0's ranks finished reading directly; every rank got exactly the same samples in the
    # same steps as without the kill.
    assert done[0][2] == "read directly" and done[1][2] == "read directly", out + err
    assert {r: (tmp_path / f"rank-{r}.txt").read_text() for r in range(4)} == want


def test_artifact_layout_resumed_at_an_epoch_gets_the_rest(tmp_path, art):
    p = solar_run(tmp_path, f"{art}/:/split", "--start-epoch", 2, epochs=3)
    assert_every_sample_verified(p, ART_SAMPLES, 1, how="from the node agent")
    # 10 steps an epoch (160 samples, 4 ranks x 4): both agents began at epoch 2's first.
    assert p.stderr.count("started at step 20:") == 2, p.stderr
    assert "continuing from step" not in p.stderr, p.stderr  # no rank fell back


# ---- DLIO's layout: rows of a few files ------------------------------------------------------

def test_dlio_layout_rows_every_sample_verified(tmp_path, dlio):
    p = solar_run(tmp_path, f"{dlio}/:/records[]", labels="/labels")
    assert_every_sample_verified(p, 380, 3, how="from the node agent")


def test_dlio_layout_with_peers_every_sample_verified(tmp_path, dlio):
    """--peers on 2 nodes (tcp;ofi_rxm over loopback): a node's misses on samples the other
    holds come from its buffer; the bytes are checked as any others."""
    p = solar_run(tmp_path, f"{dlio}/:/records[]", "--peers", labels="/labels", epochs=4,
                  buffer="50%")
    assert_every_sample_verified(p, 380, 4, how="from the node agent")
    counts = peer_counts(p.stderr)
    assert sorted(counts) == [0, 1], p.stderr
    assert sum(n for n, _ in counts.values()) > 0, p.stderr
    assert "peer sharing was turned off" not in p.stderr, p.stderr


# ---- many files, few descriptors -------------------------------------------------------------

@pytest.fixture(scope="module")
def many_tiny(tmp_path_factory):
    """2,000 files of 32 bytes: eight times more files than `ulimit -n 256` lets a process open."""
    return artifact(tmp_path_factory.mktemp("tiny") / "tiny", shape="2,4,4", samples=2000)


@pytest.mark.parametrize("agents", [True, False], ids=["agents", "no-agent"])
def test_two_thousand_files_under_ulimit_256(tmp_path, many_tiny, agents):
    extra = [] if agents else ["--no-agent"]
    p = solar_run(tmp_path, f"{many_tiny}/:/split", *extra, epochs=2, batch=25,
                  wrap="ulimit -n 256; exec")
    assert_every_sample_verified(p, 2000, 2,
                                 how="from the node agent" if agents else "read directly")
    assert "Too many open files" not in p.stdout + p.stderr


# ---- files changed under a running job -------------------------------------------------------

VICTIM = "000/univ0001_010.hdf5"  # global id 74
FAULT_MODES = pytest.mark.parametrize("mode", ["agents", "no-agent"])


def faulted_run(tmp_path, data, fault, mode, epochs=20):
    """A long run (small buffer: the files are read again every epoch; a tiny batch and some
    compute) in which `fault()` is done once the agents serve and rank 0 is a few steps in.
    mode "no-agent": the ranks read the files themselves, with their own checks."""
    extra = ["--no-agent"] if mode == "no-agent" else []
    p = solar_run(tmp_path, f"{data}/:/split", *extra, epochs=epochs, batch=2, buffer="20%",
                  train=["--compute-ms", "1"], popen=True)
    steps_done = []

    def act(p):
        steps_done.append(count_lines(tmp_path / "rank-0.txt"))
        fault()

    waits = [] if extra else [agents_up(p)]
    rc, out, err = interrupt(p, act, *waits, at_line(tmp_path / "rank-0.txt", 5), timeout=120)
    # Mid-run: rank 0 had most of its steps (4 ranks x 2 samples a step) still to go.
    assert steps_done[0] < epochs * ART_SAMPLES // 8 // 2, steps_done
    return rc, out + err


@pytest.fixture
def fresh(tmp_path):
    """A dataset of the test's own (it is changed) and one of the same shape, other content."""
    return artifact(tmp_path / "cf"), artifact(tmp_path / "other", seed=8)


@FAULT_MODES
def test_file_deleted_mid_run(tmp_path, fresh, mode):
    data, _ = fresh
    rc, out = faulted_run(tmp_path, data, lambda: os.unlink(data / VICTIM), mode)
    assert_stopped_naming_or_verified(rc, out, data / VICTIM, ART_SAMPLES, 20)


@FAULT_MODES
def test_file_replaced_by_a_rename_mid_run(tmp_path, fresh, mode):
    """`mv` of another dataset's file (same shape, other bytes) over one of the files."""
    data, other = fresh
    rc, out = faulted_run(tmp_path, data, lambda: os.replace(other / VICTIM, data / VICTIM),
                          mode)
    assert_stopped_naming_or_verified(rc, out, data / VICTIM, ART_SAMPLES, 20)


@FAULT_MODES
def test_file_rewritten_in_place_mid_run(tmp_path, fresh, mode):
    data, other = fresh

    def rewrite():
        with open(other / VICTIM, "rb") as src, open(data / VICTIM, "r+b") as dst:
            shutil.copyfileobj(src, dst)

    rc, out = faulted_run(tmp_path, data, rewrite, mode)
    assert_stopped_naming_or_verified(rc, out, data / VICTIM, ART_SAMPLES, 20)


def assert_refused_before_start(p, *named):
    """The job was refused before any agent or rank started, naming what is wrong."""
    out = p.stdout + p.stderr
    assert p.returncode == 2, out  # bad input
    assert not ranks_done(out) and "DataLoading" not in out, out
    assert "node 0:" not in out, out  # no agent served
    for n in named:
        assert n in out, out


def test_a_file_that_is_not_hdf5_is_refused_before_the_job_starts(tmp_path, fresh):
    data, _ = fresh
    (data / VICTIM).write_bytes(b"not an HDF5 file\n" * 64)
    p = solar_run(tmp_path, f"{data}/:/split")
    assert_refused_before_start(p, str(data / VICTIM), "not an HDF5 file")
    assert not list(tmp_path.glob("rank-*.txt")), "a rank started"


def test_a_file_of_another_shape_is_refused_naming_it_and_the_shapes(tmp_path, fresh):
    data, _ = fresh
    odd = artifact(tmp_path / "odd", shape="2,16,8")
    os.replace(odd / VICTIM, data / VICTIM)
    p = solar_run(tmp_path, f"{data}/:/split")
    assert_refused_before_start(p, str(data / VICTIM))
    # What differs: this file's samples and the first file's.
    assert "2x16x8 int16" in p.stderr and "2x16x16 int16" in p.stderr, p.stderr
    assert not list(tmp_path.glob("rank-*.txt")), "a rank started"


# ---- statistics and the run folder -----------------------------------------------------------

def test_stats_out_and_kept_run_folder(tmp_path, art):
    stats = tmp_path / "run.json"
    p = solar_run(tmp_path, f"{art}/:/split", "--stats-out", stats, "--keep-run-dir")
    assert_every_sample_verified(p, ART_SAMPLES, 3)
    doc = json.loads(stats.read_text())
    assert doc["source"] == "solar run" and [n["node"] for n in doc["nodes"]] == [0, 1]
    served = 0
    for n in doc["nodes"]:
        assert len(n["epochs"]) == 3 and not n["error"], n
        assert n["sample_bytes"] == 2 * 16 * 16 * 2, n
        for e in n["epochs"]:
            assert e["samples_served"] == e["hits"] + e["fetched_samples"]
            served += e["samples_served"]
    assert served == ART_SAMPLES * 3
    # The kept folder holds the index every agent and rank read: one line a file.
    kept = re.search(r"solar run: kept (\S+)", p.stderr).group(1)
    with open(os.path.join(kept, "dataset.index")) as f:
        text = f.read()
    assert text.startswith("solar-dataset-index "), text[:200]
    assert sum(1 for l in text.splitlines() if "univ" in l) == ART_SAMPLES, text[:2000]
    assert {"node0.stats.json", "node1.stats.json"} <= set(os.listdir(kept)), os.listdir(kept)


def test_stat_reports_every_agent_of_a_many_file_run(tmp_path, art):
    job = solar_run(tmp_path, f"{art}/:/split", "-v", epochs=60, batch=2,
                    train=["--compute-ms", "2"], popen=True)
    with reaped(job):
        line = ""
        while "solar stat" not in line:
            line = job.stderr.readline()
            assert line, "solar run ended before its agents were ready"
        folder = re.search(r"solar stat (\S+) --watch", line).group(1)
        once = run(SOLAR, "stat", folder)
        assert len(re.findall(r"^node [01]: .* hit rate", once.stdout, re.M)) == 2, once.stdout
        assert once.stdout.count("  rank ") == 4, once.stdout
        docs = [json.loads(l) for l in run(SOLAR, "stat", folder, "--json").stdout.splitlines()]
        assert sorted(d["node"] for d in docs) == [0, 1], docs
        for d in docs:
            assert d["sample_bytes"] == 2 * 16 * 16 * 2 and not d["error"], d
            assert d["total_steps"] == 60 * ART_SAMPLES // 8, d  # 4 ranks x 2 a step
        rest = job.stderr.read()
        assert job.wait(timeout=120) == 0, rest
    done = ranks_done(job.stdout.read() + rest)
    assert len(done) == 4 and sum(n for n, _, _ in done.values()) == ART_SAMPLES * 60


# ---- solar-stored exporting a directory ------------------------------------------------------

def test_solar_stored_exports_a_directory(tmp_path, art):
    ready, log = tmp_path / "ready", tmp_path / "stored.log"
    with open(log, "w") as logf:
        server = subprocess.Popen([STORED, "--export", f"cf={art}/:/split", "--labels",
                                   "/unitPar", "--ready-file", ready, "--quiet"],
                                  stdout=logf, stderr=subprocess.STDOUT)
    with reaped(server):
        wait_until(lambda: server.poll() is not None or (ready.exists() and ready.read_text()),
                   what="solar-stored ready")
        assert server.poll() is None, log.read_text()
        addr = ready.read_text().strip()
        p = solar_run(tmp_path, f"fabric://{addr}/cf", epochs=2)
        assert_every_sample_verified(p, ART_SAMPLES, 2, how="from the node agent")
        server.terminate()
        assert server.wait(timeout=30) == 0, log.read_text()
