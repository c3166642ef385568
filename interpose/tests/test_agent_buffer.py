# SPDX-License-Identifier: Apache-2.0
"""The attached path against the real node agent (solar-agent --transparent, conftest.Agent): an
unmodified h5py + DataLoader job (loader.py) must see exactly the batches it sees without the
preload, whether the agent holds the whole dataset or part of it, and the counters the
interposer keeps in the agent's index (`solar stat --json`, and consumed[] read from the index)
must say what was served.

- whole dataset resident (a buffer holding every sample, the agent waited on until it has read
  them all): every read is served; exact counts.
- part resident (a plan whose buffer is smaller than the dataset, in an order that is not the
  loader's; the agent waited on until its slots are full): served samples, file reads and, with
  3-row items, short reads, mixed. With one row per item the job completes the plan's steps and
  the agent evicts and fetches at its own pace: bounds only. With three rows per item no step is
  ever complete (see below), the buffer stays as it was: exact counts.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from conftest import (BATCH, HERE, N, OP_XHELLO, PROTO_MAGIC, PROTO_VERSION, PYTHON, S, SOLAR,
                      file_sample, make_h5, plain_env, preload_env, run, wait_until)

LOADER = str(HERE / "loader.py")
EPOCHS = 2
LOADER_SEED = 42  # loader.py's RandomSampler seed
# The partly resident agent: a plan buffer of 16 samples (32 slots with the agent's 2 steps of
# staging), so its first 4 steps (32 samples) are resident when the job starts. Plan seed 39 is
# one whose first 4 steps hold neither sample the job's first two batches start with (checked
# below), so the job's first read is a miss whatever its timing.
PARTIAL, PARTIAL_SEED = "1M", 39


@pytest.fixture(scope="module")
def baseline(h5file):
    dataset, _ = h5file
    out = {}
    for span in (1, 3):
        r = run([PYTHON, LOADER, str(dataset), "0", "init", str(span), str(EPOCHS)], plain_env())
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        out[span] = r
    return out


def loader_first_epoch(span):
    """The items loader.py reads in its first epoch, in order (its own sampler, its own seed)."""
    import torch
    from torch.utils.data import RandomSampler
    g = torch.Generator()
    g.manual_seed(LOADER_SEED)
    return list(RandomSampler(range(N - span + 1), generator=g))


def run_loader(lib, dataset, sock, workers, mode, span, **kw):
    return run([PYTHON, LOADER, str(dataset), str(workers), mode, str(span), str(EPOCHS)],
               preload_env(lib, dataset, sock, **kw))


def run_and_observe(lib, dataset, agent, workers, mode, span, baseline):
    """Runs the job under the preload against `agent`: its output must be the job's without the
    preload. Returns the agent's transparent counters and the consumed[] counters."""
    r = run_loader(lib, dataset, agent.sock, workers, mode, span)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout == baseline[span].stdout
    assert r.stderr == baseline[span].stderr
    stats = agent.xstats()
    with agent.index() as ix:
        return stats, ix.consumed()


def attaching(workers, mode):
    # Lazy opens happen in the workers only (new ones each epoch): each attaches. Otherwise the
    # main process attaches and the workers inherit its mapping.
    return workers * EPOCHS if mode == "lazy" else 1


CASES = [(0, "init"), (2, "init"), (2, "lazy")]


@pytest.mark.parametrize("span", [1, 3])
@pytest.mark.parametrize("workers,mode", CASES)
def test_whole_dataset_resident_every_read_served(lib, h5file, baseline, start_agent, workers,
                                                  mode, span):
    dataset, offset = h5file
    agent = start_agent(dataset, buffer="100%", epochs=EPOCHS)
    agent.wait_all_resident()
    stats, consumed = run_and_observe(lib, dataset, agent, workers, mode, span, baseline)
    with agent.index() as ix:
        assert ix.resident() == set(range(N))  # the plan evicts nothing: still all there
    assert stats["attached"] == attaching(workers, mode)
    assert stats["torn"] == 0
    assert (stats["miss_reads"], stats["miss_bytes"]) == (0, 0)
    items = EPOCHS * (N - span + 1)  # one pread of `span` rows per item, at the item's row
    assert (stats["hit_reads"], stats["hit_bytes"]) == (items, items * span * S)
    # A sample counts as consumed when a read brings its first byte: each item's read brings
    # `span` rows.
    assert consumed == [EPOCHS * sum(1 for i in range(N - span + 1) if i <= k < i + span)
                        for k in range(N)]
    if span == 1:
        # Every sample consumed once per epoch: every step of the plan is done, although the
        # job's order is not the plan's.
        total = agent.stat()["total_steps"]
        wait_until(lambda: agent.xstats()["consumed_steps"] == total, timeout=10,
                   what=f"consumed_steps == {total}")


def part_resident_agent(start_agent, dataset):
    agent = start_agent(dataset, buffer=PARTIAL, epochs=EPOCHS, seed=PARTIAL_SEED)
    resident = agent.wait_stalled()
    assert len(resident) == agent.stalled_steps * BATCH
    return agent, resident


@pytest.mark.parametrize("workers,mode", CASES)
def test_part_resident_paced_by_the_job(lib, h5file, baseline, start_agent, workers, mode):
    """One row per item: the job reads every sample once per epoch in its own order; as it
    completes the plan's steps the agent evicts and fetches (at its own pace: what is resident
    when depends on timing, so hits and misses are bounded, not counted exactly)."""
    dataset, offset = h5file
    agent, resident = part_resident_agent(start_agent, dataset)
    steps = agent.stalled_steps
    order = loader_first_epoch(1)
    firsts = {order[0]} if workers == 0 else {order[0], order[BATCH]}  # each worker's first
    assert not firsts & resident, "the scenario changed: pick another PARTIAL_SEED"
    stats, consumed = run_and_observe(lib, dataset, agent, workers, mode, 1, baseline)
    assert stats["attached"] == attaching(workers, mode)
    # Every read is one whole sample, from its start: counted once, as a hit or a miss.
    assert consumed == [EPOCHS] * N
    assert stats["hit_reads"] + stats["miss_reads"] == EPOCHS * N
    assert stats["hit_bytes"] == stats["hit_reads"] * S
    assert stats["miss_bytes"] == stats["miss_reads"] * S
    # Bounds that hold whatever the timing. The job's first read finds the agent as it was (a
    # step is done only once all its samples have been read) and is of a sample not resident:
    # a miss. A sample resident at the start stays so until its step is done, which needs it
    # read: its first read is served, unless that read is the one that completes its step (then
    # the copy may race the eviction: a miss, or a torn copy and a miss).
    assert stats["miss_reads"] >= 1
    assert stats["hit_reads"] >= len(resident) - steps
    # Each sample consumed once per epoch: every step of the plan is done, although the job's
    # order is not the plan's; the agent has paced through all of them.
    total = agent.stat()["total_steps"]
    wait_until(lambda: agent.xstats()["consumed_steps"] == total, timeout=10,
               what=f"consumed_steps == {total}")


def span3_reads(resident):
    """What loader.py's 3-row reads (items 0..N-3, one pread each) do against a buffer holding
    `resident`, in one epoch: (hit_reads, hit_bytes, miss_reads, miss_bytes, consumed, short).
    A read whose first rows are resident is served up to the first missing row, and the
    interposer reads the rest from the file into the same buffer (no short count): a miss."""
    hits = hit_bytes = misses = miss_bytes = short = 0
    consumed = [0] * N
    for i in range(N - 2):
        p = 0
        while p < 3 and i + p in resident:
            p += 1
        for j in range(i, i + 3):  # served or from the file, each row's first byte is read once
            consumed[j] += 1
        if p:
            hits, hit_bytes = hits + 1, hit_bytes + p * S
        if p < 3:
            misses, miss_bytes = misses + 1, miss_bytes + (3 - p) * S
            short += 0 < p
    return hits, hit_bytes, misses, miss_bytes, consumed, short


@pytest.mark.parametrize("workers,mode", CASES)
def test_part_resident_short_reads_counted_exactly(lib, h5file, baseline, start_agent, workers,
                                                   mode):
    """Three rows per item: reads served whole, in part (a resident prefix, the rest from the
    file, one pread as the script sees it) and not at all, while the agent paces its evictions on what the job consumes (a
    sample counts as consumed when a read brings its first byte, so every row is consumed and
    steps complete). Exact whatever the timing: the bytes, every read's bytes accounted for once
    (served or from the file), and the consumed counters."""
    dataset, offset = h5file
    agent, resident = part_resident_agent(start_agent, dataset)
    hits, hit_bytes, misses, miss_bytes, consumed_1, short = span3_reads(resident)
    assert short > 0 and hits > short and misses > short  # all three kinds of read can occur
    stats, consumed = run_and_observe(lib, dataset, agent, workers, mode, 3, baseline)
    assert stats["attached"] == attaching(workers, mode)
    assert stats["hit_reads"] > 0 and stats["miss_reads"] > 0
    assert stats["hit_bytes"] + stats["miss_bytes"] == EPOCHS * (N - 2) * 3 * S
    assert consumed == [EPOCHS * c for c in consumed_1]
    # Every row consumed as often as the plan needs: every step done, every eviction made.
    total = agent.stat()["total_steps"]
    wait_until(lambda: agent.xstats()["consumed_steps"] == total, timeout=10,
               what=f"consumed_steps == {total}")


def test_replaced_file_is_read_directly(lib, tmp_path, start_agent):
    """The file is replaced (same layout, other bytes, another inode) after the agent read it:
    one warning, nothing served, the new file's batches."""
    path = tmp_path / "train.h5"
    offset = make_h5(path, seed=1234)
    agent = start_agent(path, buffer="100%", epochs=EPOCHS)
    agent.wait_all_resident()
    (tmp_path / "new").mkdir()
    new = tmp_path / "new" / "train.h5"
    assert make_h5(new, seed=4321) == offset
    assert new.stat().st_size == path.stat().st_size
    assert all(file_sample(new, offset, k) != file_sample(path, offset, k) for k in range(N))
    new.replace(path)
    base = run([PYTHON, LOADER, str(path), "0", "init", "1", str(EPOCHS)], plain_env())
    assert base.returncode == 0, base.stderr.decode()[-2000:]
    r = run_loader(lib, path, agent.sock, 0, "init", 1)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout == base.stdout
    warning = f"solar: {path} is not the file the node agent holds; reading it directly\n"
    assert r.stderr == warning.encode() + base.stderr
    assert agent.xstats() == dict.fromkeys(agent.xstats(), 0)
    with agent.index() as ix:
        assert ix.consumed() == [0] * N


def test_agent_not_transparent_is_read_directly_and_silently(lib, h5file, baseline, start_agent):
    """An agent started without --transparent answers XHELLO with an error: no message, every
    read from the file."""
    dataset, _ = h5file
    agent = start_agent(dataset, buffer="100%", epochs=EPOCHS, transparent=False)
    r = run_loader(lib, dataset, agent.sock, 2, "lazy", 1)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    assert r.stdout == baseline[1].stdout and r.stderr == baseline[1].stderr
    assert agent.stat()["transparent"] is None
    # One XHELLO per worker process (lazy opens: 2 workers, new ones each epoch), each refused.
    refused = agent.log_text().count(
        "interposer refused: this agent serves batches, not file reads")
    assert refused == 2 * EPOCHS, agent.log_text()


@pytest.mark.parametrize("dataset_var,socket_set",
                         [("fabric://node1/train.h5:/data", True), (None, True), ("", True),
                          ("set", False)],
                         ids=["fabric", "dataset-unset", "dataset-empty", "socket-unset"])
def test_inert_configurations_never_attach(lib, h5file, baseline, start_agent, dataset_var,
                                           socket_set):
    """A transparent agent holding the whole dataset listens on SOLAR_SOCKET; the interposer,
    inert, never attaches to it (verbose: it would say so on stderr) and serves nothing."""
    dataset, _ = h5file
    agent = start_agent(dataset, buffer="100%", epochs=EPOCHS)
    agent.wait_all_resident()
    env = preload_env(lib, dataset, agent.sock, verbose=True)
    if dataset_var is None:
        del env["SOLAR_DATASET"]
    elif dataset_var != "set":
        env["SOLAR_DATASET"] = dataset_var
    if not socket_set:
        del env["SOLAR_SOCKET"]
    r = run([PYTHON, LOADER, str(dataset), "0", "init", "1", str(EPOCHS)], env)
    assert r.returncode == 0
    assert r.stdout == baseline[1].stdout and r.stderr == baseline[1].stderr
    assert agent.xstats() == dict.fromkeys(agent.xstats(), 0)
    with agent.index() as ix:
        assert ix.consumed() == [0] * N


def test_a_connection_that_never_reads_does_not_stop_the_agent(lib, h5file, baseline, start_agent):
    """Issue 32, finding 4: a same-user client sends XHELLO after XHELLO on one connection and
    never reads the replies. The agent answers the first, closes the connection at the second
    (an interposer asks once) and never blocks on it: while the client still holds it open,
    `solar stat` answers and a new interposer attaches and is served."""
    dataset, _ = h5file
    agent = start_agent(dataset, buffer="100%", epochs=EPOCHS)
    agent.wait_all_resident()
    hello = (struct.pack("<IHHII", PROTO_MAGIC, PROTO_VERSION, OP_XHELLO, 8, 0) +
             struct.pack("<II", os.getpid(), 0))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # its replies fill it soon
        s.connect(str(agent.sock))
        s.setblocking(False)
        try:
            for _ in range(4000):
                s.send(hello)
        except OSError:  # full, or closed by the agent
            pass
        before = agent.xstats()["hit_reads"]
        r = run_loader(lib, dataset, agent.sock, 0, "init", 1)
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        assert r.stdout == baseline[1].stdout
        assert agent.xstats()["hit_reads"] > before  # attached and served
    assert "asked for the buffer twice: closing it" in agent.log_text(), agent.log_text()


READ_IN_FLIGHT = r'''
import json, os, struct, sys
sys.path.insert(0, sys.argv[5])
from conftest import BufferIndex
ds, offset, S, sock = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
steps = json.loads(sys.argv[6])
fd = os.open(ds, os.O_RDONLY)  # the interposer attaches here
ix = BufferIndex(sock)         # our own view of the agent's entries
entry = lambda k: struct.unpack_from("<Q", ix.map, ix.entries_at + 8 * k)[0]
pick = next((k for step in steps for k in step if entry(k) and not entry(k) & 0xFFFFFFFF), None)
if pick is None:
    sys.exit("no sample in flight when the reader looked")
got = os.pread(fd, S, offset + pick * S)
raw = os.open(ds, os.O_RDWR)   # read-write: never served
want = os.pread(raw, S, offset + pick * S)
print(json.dumps({"sample": pick, "right": got == want,
                  "resident_after": bool(entry(pick) & 0xFFFFFFFF)}))
'''


def plan_fetches(agent):
    """The samples each step of the plan's first epoch fetches, in step order."""
    r = run([SOLAR, "plan-dump", str(agent.plan)], plain_env())
    assert r.returncode == 0, r.stderr.decode()
    steps = {}
    for line in r.stdout.decode().splitlines()[1:]:
        pos, epoch, step, gstep, node, rank, lrank, sample, hit = map(int, line.split(","))
        if pos == 0 and not hit:
            steps.setdefault(gstep, []).append(sample)
    return [steps[t] for t in sorted(steps)]


def test_a_read_of_a_sample_in_flight_waits_for_it_and_is_served(lib, h5file, start_agent):
    """Issue 33, item 2: the agent marks the samples it is reading (in flight) in its index; a
    read of one waits for it (bounded, SOLAR_XINDEX_WAIT_NS) and is served from the buffer,
    instead of reading it from the storage a second time. The agent reads through a 2 MiB/s
    cap (a blkio cgroup, O_DIRECT, one step at a time: a step of 8 samples of 64 KiB takes
    0.25 s, its samples marked in flight as its read starts); the reader picks a sample of the
    earliest step still in flight and reads it."""
    dataset, offset = h5file
    sys.path.insert(0, str(HERE.parent.parent / "bench"))
    import slow_storage
    try:
        throttle = slow_storage.Throttle(dataset, 2 * 2**20)
    except slow_storage.Unavailable as e:
        pytest.skip(f"no read cap possible here: {e}")
    agent = None
    try:
        agent = start_agent(dataset, buffer="100%", epochs=EPOCHS, preexec=throttle.enter,
                            extra=["--direct-io", "--readers", "1"])
        steps = plan_fetches(agent)
        r = run([PYTHON, "-c", READ_IN_FLIGHT, str(dataset), str(offset), str(S),
                 str(agent.sock), str(HERE), json.dumps(steps)],
                preload_env(lib, dataset, agent.sock))
        assert r.returncode == 0, r.stderr.decode()[-2000:]
        out = json.loads(r.stdout)
        assert out["right"] and out["resident_after"], out
        stats = agent.xstats()
        assert stats["waited_reads"] == 1 and stats["waited_seconds"] > 0, stats
        assert (stats["hit_reads"], stats["hit_bytes"], stats["miss_reads"]) == (1, S, 0), stats
    finally:
        if agent:
            agent.stop()
        throttle.close()


READ_ON_CUE = r'''
import os, sys
ds, offset, S = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fd = os.open(ds, os.O_RDONLY)  # the interposer attaches here, while the agent runs
for line in sys.stdin:         # one sample number per line: read it, say so
    k = int(line)
    os.pread(fd, S, offset + k * S)
    print("read", k, flush=True)
'''


def test_a_stopped_agents_lease_runs_out_and_its_buffer_is_not_served(lib, h5file, start_agent):
    """Issue 32, finding 1, the lease: an agent that stops renewing it (SIGSTOP here; SIGKILL
    or the OOM killer alike) is no longer trusted once it runs out, though the file did not
    change: an attached process reads the file. Once the agent runs again and renews it, the
    buffer is served again. Counts exact: read 1 and 3 served, read 2 not."""
    dataset, offset = h5file
    agent = start_agent(dataset, buffer="100%", epochs=EPOCHS)
    agent.wait_all_resident()
    p = subprocess.Popen([PYTHON, "-c", READ_ON_CUE, str(dataset), str(offset), str(S)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env=preload_env(lib, dataset, agent.sock))
    stopped = False
    try:
        def read(k):
            p.stdin.write(f"{k}\n")
            p.stdin.flush()
            assert p.stdout.readline() == f"read {k}\n"
        with agent.index() as ix:
            read(1)
            os.kill(agent.proc.pid, signal.SIGSTOP)
            stopped = True
            until = ix.lease_until()
            wait_until(lambda: time.monotonic_ns() > until, timeout=10, what="the lease to run out")
            read(2)
            os.kill(agent.proc.pid, signal.SIGCONT)
            stopped = False
            wait_until(lambda: ix.lease_until() > time.monotonic_ns() + 10**9, timeout=10,
                       what="the lease renewed")
            read(3)
        p.stdin.close()
        assert p.wait(timeout=30) == 0
    finally:
        if stopped:
            os.kill(agent.proc.pid, signal.SIGCONT)
        if p.poll() is None:
            p.kill()
            p.wait()
    stats = agent.xstats()
    assert (stats["hit_reads"], stats["miss_reads"]) == (2, 1), stats
    with agent.index() as ix:
        consumed = ix.consumed()
    assert [consumed[k] for k in (1, 2, 3)] == [1, 1, 1]  # the unserved read still counts
