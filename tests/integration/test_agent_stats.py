# SPDX-License-Identifier: Apache-2.0
"""The agent's measured statistics with real processes: per-epoch records, the head start and
their totals, in the stats reply, the log's last line ("stopped: {...}") and the --stats-out
file, for the ring path, the zero-copy path and the transparent mode (agent/README.md)."""
import glob
import json
import math
import os
import pathlib
import shutil
import signal
import socket
import stat
import struct
import subprocess
import tempfile

import h5py
import pytest

from test_data_path import recorded
from testlib import AGENT, OP_STATS, OP_STATS_REPLY, SOLAR, TRAIN, frame, run, wait_until

SAMPLES, SAMPLE_BYTES, EPOCHS, RANKS, BATCH = 600, 4096, 3, 2, 4
STEPS = SAMPLES // (RANKS * BATCH)  # per epoch, one node


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "d.h5"
    run(SOLAR, "gen", path, "--samples", SAMPLES, "--preset", "tiny", "--seed", "7", "--no-progress")
    return path


@pytest.fixture
def sock_dir():
    # Under /tmp directly (pytest's own folders are private to root), created 0700.
    d = pathlib.Path(tempfile.mkdtemp(prefix="solar-test-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def plan(tmp_path, buffer, epochs=EPOCHS, samples=SAMPLES, ranks=RANKS):
    path = tmp_path / "p.plan"
    run(SOLAR, "plan", "--samples", samples, "--sample-bytes", "4K", "--epochs", epochs, "--nodes",
        "1", "--ranks-per-node", ranks, "--batch", BATCH, "--buffer", buffer, "--out", path)
    return path


def stats_reply(sock):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(frame(OP_STATS))
        magic, ver, op, length, _ = struct.unpack("<IHHII", s.recv(16, socket.MSG_WAITALL))
        assert op == OP_STATS_REPLY
        body = b""
        while len(body) < length:
            chunk = s.recv(length - len(body))
            assert chunk, "stats reply cut short"
            body += chunk
        return json.loads(body)


def start_agent(plan_path, dataset, sock, log, *extra):
    proc = subprocess.Popen([str(a) for a in (AGENT, "--plan", plan_path, "--node", "0", "--dataset",
                                              dataset, "--socket", sock, "--log", log, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def connectable():
        assert proc.poll() is None, f"agent exited: {log.read_text() if log.exists() else ''}"
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
            return True
        except OSError:
            return False

    wait_until(connectable, what="agent socket")
    return proc


def stop_agent(proc):
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


def stopped_line(log):
    """The agent's final stats: the JSON of the last "stopped: {" line of its log."""
    lines = [l for l in pathlib.Path(log).read_text().splitlines() if "stopped: {" in l]
    assert lines, pathlib.Path(log).read_text()
    return json.loads(lines[-1][lines[-1].index("{"):])


def finite_nonneg(v):
    return isinstance(v, (int, float)) and math.isfinite(v) and v >= 0


def run_ranks(tmp_path, plan_path, dataset, sock, ranks=RANKS):
    env = dict(os.environ, SOLAR_PLAN=str(plan_path), SOLAR_NODE="0", SOLAR_DATASET=str(dataset),
               SOLAR_SOCKET=str(sock))
    procs = [subprocess.Popen([TRAIN, "--verify", "--record", str(tmp_path / f"rank-{r}.txt")],
                              env=dict(env, SOLAR_LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(ranks)]
    for p in procs:
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0 and "verified (0 wrong), from the node agent" in out, out
    return sum(len(s) for r in range(ranks) for s in recorded(tmp_path / f"rank-{r}.txt").values())


def check_epochs(epochs, served, steps=STEPS, ranks=RANKS, stall=True):
    assert len(epochs) == EPOCHS
    assert [e["epoch"] for e in epochs] == list(range(EPOCHS))
    for e in epochs:
        assert e["started"] and e["complete"], e
        assert e["steps"] == steps
        assert e["batches_served"] == steps * ranks, e
        assert e["fetched_bytes"] == e["fetched_samples"] * SAMPLE_BYTES, e
        for k in ("read_seconds", "wall_seconds", "start_seconds", "end_seconds"):
            assert finite_nonneg(e[k]), (k, e)
        assert e["end_seconds"] >= e["start_seconds"]
        for k in ("stall_seconds", "stall_max_rank_seconds", "stall_max_wait_seconds"):
            assert finite_nonneg(e[k]) if stall else e[k] is None, (k, e)
        if stall:
            assert e["stall_max_wait_seconds"] <= e["stall_max_rank_seconds"] + 1e-9
            assert e["stall_max_rank_seconds"] <= e["stall_seconds"] + 1e-9
        if e["fetched_samples"]:
            assert e["storage_reads"] >= 1 and e["read_seconds"] > 0, e
    assert sum(e["hits"] + e["fetched_samples"] for e in epochs) == served
    assert sum(e["samples_served"] for e in epochs) == served


@pytest.mark.parametrize("mode", ["ring", "zero-copy"])
@pytest.mark.parametrize("buffer", ["100%", "40%"])
def test_per_epoch_stats_of_a_real_run(tmp_path, dataset, sock_dir, mode, buffer):
    plan_path = plan(tmp_path, buffer)
    sock, log, out = sock_dir / "a.sock", tmp_path / "agent.log", tmp_path / "stats" / "node0.json"
    out.parent.mkdir()
    extra = ["--stats-out", out] + (["--zero-copy"] if mode == "zero-copy" else [])
    proc = start_agent(plan_path, dataset, sock, log, *extra)
    try:
        served = run_ranks(tmp_path, plan_path, dataset, sock)
        reply = stats_reply(sock)
    finally:
        if proc.poll() is None:
            stop_agent(proc)
    assert served == SAMPLES * EPOCHS  # one node: every sample of every epoch

    # The --stats-out file: complete JSON, private, nothing left beside it.
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert os.listdir(out.parent) == ["node0.json"]
    doc = json.loads(out.read_text())
    assert doc["node"] == 0 and doc["format_version"] == 1
    assert doc["mode"] == {"ring": "ring", "zero-copy": "zero_copy"}[mode]
    assert doc["epochs_planned"] == EPOCHS and doc["steps_per_epoch"] == STEPS
    assert doc["ranks_per_node"] == RANKS and doc["sample_bytes"] == SAMPLE_BYTES
    epochs = doc["epochs"]
    check_epochs(epochs, served)

    # Its totals are the epochs' sums, and agree with the agent's run totals.
    final = stopped_line(log)
    t = doc["totals"]
    for k in ("hits", "fetched_samples", "fetched_bytes", "storage_reads", "samples_served",
              "batches_served"):
        assert t[k] == sum(e[k] for e in epochs), k
    assert t["fetched_samples"] == final["fetched_samples"]
    assert t["fetched_bytes"] == final["bytes_read"]
    assert t["storage_reads"] == final["storage_reads"]
    assert t["epochs_complete"] == EPOCHS
    assert math.isclose(t["read_seconds"], sum(e["read_seconds"] for e in epochs), rel_tol=1e-9)
    assert math.isclose(t["stall_seconds"], sum(e["stall_seconds"] for e in epochs), rel_tol=1e-9)
    assert math.isclose(t["stall_max_rank_seconds"], max(r["stall_seconds"] for r in final["ranks"]))
    for k in ("read_seconds", "stall_seconds", "stall_max_rank_seconds", "stall_max_wait_seconds",
              "wall_seconds", "run_seconds", "slot_wait_seconds"):
        assert finite_nonneg(t[k]), k
    assert t["wall_seconds"] <= t["run_seconds"]

    # The head start: what was fetched before the first request.
    h = doc["head_start"]
    assert h["requested"] and finite_nonneg(h["seconds"]) and finite_nonneg(h["startup_seconds"])
    assert math.isclose(h["since_start_seconds"], h["seconds"] + h["startup_seconds"], abs_tol=1e-6)
    assert h["fetched_bytes"] == h["fetched_samples"] * SAMPLE_BYTES
    assert 0 <= h["fetched_samples"] <= t["fetched_samples"]
    assert 0 <= h["ready_steps"] <= STEPS * EPOCHS
    assert h["seconds"] <= epochs[0]["start_seconds"] + 1e-9

    if buffer == "100%":  # the whole dataset stays: epoch 0 reads it all, later ones nothing
        assert epochs[0]["fetched_samples"] == epochs[0]["samples_served"] == SAMPLES
        assert epochs[0]["hits"] == 0
        for e in epochs[1:]:
            assert e["fetched_samples"] == 0 and e["storage_reads"] == 0 and e["read_seconds"] == 0
            assert e["hits"] == e["samples_served"] == SAMPLES
    else:  # 40%: later epochs read again what was evicted
        assert all(e["fetched_samples"] > 0 for e in epochs)
        assert sum(e["hits"] for e in epochs[1:]) > 0

    # The same records in the log's last line and (counts only: a moment earlier) the reply.
    assert final["per_epoch"] == epochs and final["head_start"] == h and final["totals"] == t
    assert final["epochs"] == EPOCHS  # the run totals keep their fields
    assert reply["epochs"] == EPOCHS and reply["per_epoch_omitted"] == 0
    for got, want in zip(reply["per_epoch"], epochs, strict=True):
        for k in ("hits", "fetched_samples", "fetched_bytes", "samples_served", "batches_served",
                  "complete"):
            assert got[k] == want[k], k


def test_device_bytes_of_a_cold_run_are_the_planned_bytes(tmp_path, dataset, sock_dir):
    """device_read_bytes (/proc/self/io) counts what the disk gave the agent: from a cold file,
    every sample once (100%), with no readahead past what the plan asked for (issue 15: the
    kernel's guess read 6.6% more) and `solar gen`'s data on page boundaries (at HDF5's
    default offset 2048 a lone 4 KiB sample took two pages)."""
    if os.major(os.stat(dataset).st_dev) == 0:
        pytest.skip(f"{dataset} is not on a block device: nothing is read from a disk")
    fd = os.open(dataset, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    plan_path = plan(tmp_path, "100%", epochs=1)
    sock, log = sock_dir / "a.sock", tmp_path / "agent.log"
    proc = start_agent(plan_path, dataset, sock, log)
    try:
        assert run_ranks(tmp_path, plan_path, dataset, sock) == SAMPLES
    finally:
        if proc.poll() is None:
            stop_agent(proc)
    final = stopped_line(log)
    planned = SAMPLES * SAMPLE_BYTES
    assert final["bytes_read"] == planned
    device = final["device_read_bytes"]
    if device is None:
        pytest.skip("the kernel keeps no per-process I/O counts (/proc/self/io)")
    # HDF5's own metadata (superblock, object headers, the label dataset's first reads) is
    # the only other thing the agent reads: a few pages.
    assert planned <= device <= 1.03 * planned + 64 * 1024, (device, planned)


def test_read_gap_merges_nearby_samples_into_fewer_requests(tmp_path, dataset, sock_dir):
    """--read-gap: samples close together in the file, of a step and of the steps queued behind
    it, are one request (issue 15: request-bound storage); every sample still verified."""
    plan_path = plan(tmp_path, "40%")
    counts = {}
    for gap in ("0", "1M"):
        sock, log = sock_dir / f"a{gap}.sock", tmp_path / f"agent-{gap}.log"
        proc = start_agent(plan_path, dataset, sock, log, "--read-gap", gap)
        try:
            assert run_ranks(tmp_path, plan_path, dataset, sock) == SAMPLES * EPOCHS
        finally:
            if proc.poll() is None:
                stop_agent(proc)
        final = stopped_line(log)
        counts[gap] = (final["storage_reads"], final["storage_requests"], final["bytes_read"])
    reads, requests, nbytes = counts["0"]
    assert requests == reads > 0  # a request per run
    merged_reads, merged_requests, merged_bytes = counts["1M"]
    assert merged_reads == reads and merged_bytes == nbytes  # the same plan, the same samples
    assert 0 < merged_requests < reads / 2, counts


def test_bad_read_gap_is_refused(tmp_path, dataset, sock_dir):
    r = subprocess.run([str(AGENT), "--plan", str(plan(tmp_path, "40%")), "--node", "0",
                        "--dataset", str(dataset), "--socket", str(sock_dir / "a.sock"),
                        "--read-gap", "lots"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--read-gap" in r.stderr and "'lots'" in r.stderr, r.stderr


def test_live_reply_has_every_epoch_and_no_request_yet(tmp_path, dataset, sock_dir):
    """Before any rank asks: every planned epoch is listed, none started; the head start says
    nothing was requested and counts what was fetched so far."""
    proc = start_agent(plan(tmp_path, "40%"), dataset, sock_dir / "a.sock", tmp_path / "a.log")
    try:
        r = stats_reply(sock_dir / "a.sock")
    finally:
        stop_agent(proc)
    assert len(r["per_epoch"]) == EPOCHS and r["per_epoch_omitted"] == 0
    assert not any(e["started"] or e["complete"] for e in r["per_epoch"])
    assert all(e["wall_seconds"] is None and e["samples_served"] == 0 for e in r["per_epoch"])
    h = r["head_start"]
    assert h["requested"] is False and h["seconds"] is None and h["since_start_seconds"] is None
    assert h["fetched_bytes"] == h["fetched_samples"] * SAMPLE_BYTES
    assert r["totals"]["wall_seconds"] is None and r["totals"]["samples_served"] == 0


def test_reply_of_very_many_epochs_fits_one_message(tmp_path, sock_dir):
    """4000 epochs of records exceed the protocol's 1 MiB message: the reply leaves out the
    oldest and says how many; the log line and --stats-out keep them all."""
    data = tmp_path / "d8.h5"
    run(SOLAR, "gen", data, "--samples", "8", "--preset", "tiny", "--no-progress")
    plan_path = plan(tmp_path, "100%", epochs=4000, samples=8, ranks=1)
    out = tmp_path / "s.json"
    proc = start_agent(plan_path, data, sock_dir / "a.sock", tmp_path / "a.log", "--stats-out", out)
    try:
        r = stats_reply(sock_dir / "a.sock")
    finally:
        stop_agent(proc)
    assert r["per_epoch_omitted"] > 0
    assert len(r["per_epoch"]) + r["per_epoch_omitted"] == 4000
    assert r["per_epoch"][0]["epoch"] == r["per_epoch_omitted"]
    assert r["per_epoch"][-1]["epoch"] == 3999
    assert len(json.loads(out.read_text())["epochs"]) == 4000
    assert len(stopped_line(tmp_path / "a.log")["per_epoch"]) == 4000


def test_bad_stats_out_is_refused_at_start_up(tmp_path, dataset, sock_dir):
    plan_path = plan(tmp_path, "40%")
    for path, why in ((tmp_path / "missing" / "s.json", "does not exist"),
                      (tmp_path, "is a folder")):
        sock = sock_dir / "a.sock"
        p = run(AGENT, "--plan", plan_path, "--node", "0", "--dataset", dataset, "--socket", sock,
                "--stats-out", path, check=False, timeout=30)
        assert p.returncode == 1, p.stderr
        assert "--stats-out" in p.stderr and why in p.stderr and str(path) in p.stderr, p.stderr
        assert not sock.exists()
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                    reason="needs root to run the agent as another user")
def test_stats_out_in_a_folder_the_user_cannot_write_is_refused_at_start_up(tmp_path, dataset):
    """As nobody (root writes anywhere): a folder it may not write to."""
    pub = pathlib.Path(tempfile.mkdtemp(prefix="solar-test-"))
    try:
        os.chmod(pub, 0o755)
        plan_path = shutil.copy(plan(tmp_path, "40%"), pub / "p.plan")
        data = shutil.copy(dataset, pub / "d.h5")
        for f in (plan_path, data):
            os.chmod(f, 0o644)
        locked, socks = pub / "locked", pub / "s"
        locked.mkdir(mode=0o755)
        socks.mkdir()
        os.chmod(socks, 0o777)
        p = run("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", AGENT, "--plan",
                plan_path, "--node", "0", "--dataset", data, "--socket", socks / "a.sock",
                "--stats-out", locked / "s.json", check=False, timeout=30)
        assert p.returncode == 1, p.stderr
        assert "--stats-out" in p.stderr and "cannot create a file in" in p.stderr, p.stderr
        assert os.listdir(locked) == [] and not (socks / "a.sock").exists()
    finally:
        shutil.rmtree(pub, ignore_errors=True)


def test_transparent_mode_per_epoch_stats(tmp_path):
    """An unmodified script under `solar run --transparent`: each epoch's records from the
    agent's final line; the requests are the interposer's consumption, so there is no stall."""
    data = tmp_path / "t.h5"
    run(SOLAR, "gen", data, "--samples", "48", "--preset", "small", "--seed", "4", "--no-progress")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "slurm_examples",
                          "train_h5py_ddp.py")
    epochs, batch = 3, 4
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = run(SOLAR, "run", "-n", "2", "--dataset", data, "--epochs", epochs, "--batch", batch,
            "--seed", "3", "--buffer", "100%", "--transparent", "--keep-run-dir", "--",
            "/usr/bin/python3", script, data, "--epochs", epochs, "--batch", batch, "--seed", "3",
            "--workers", "0", check=False, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    with h5py.File(data, "r") as f:
        sample_bytes = f["/data"][0].nbytes
    logs = glob.glob(str(tmp_path / "solar-run-*" / "node0.log"))
    assert len(logs) == 1, p.stderr
    final = stopped_line(logs[0])
    steps = final["steps_per_epoch"]
    per = final["per_epoch"]
    assert len(per) == epochs == final["epochs"]
    served = 0
    for e in per:
        assert e["started"] and e["complete"] and e["batches_served"] == steps * 2, e
        assert e["fetched_bytes"] == e["fetched_samples"] * sample_bytes, e
        assert e["stall_seconds"] is None and e["stall_max_wait_seconds"] is None
        assert finite_nonneg(e["read_seconds"]) and finite_nonneg(e["wall_seconds"])
        assert set(e["file_reads"]) == {"hit_reads", "hit_bytes", "miss_reads", "miss_bytes"}
        served += e["samples_served"]
    assert served == 48 * epochs
    assert sum(e["hits"] + e["fetched_samples"] for e in per) == served
    assert per[0]["fetched_samples"] == 48 and per[0]["hits"] == 0
    assert all(e["fetched_samples"] == 0 and e["hits"] == 48 for e in per[1:])
    x = final["transparent"]
    assert sum(e["file_reads"]["hit_reads"] for e in per) <= x["hit_reads"]
    assert sum(e["file_reads"]["miss_reads"] for e in per) <= x["miss_reads"]
    h = final["head_start"]
    assert h["requested"] and finite_nonneg(h["seconds"])
    assert final["totals"]["stall_seconds"] is None
    assert final["totals"]["samples_served"] == served
