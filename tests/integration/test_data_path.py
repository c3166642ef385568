# SPDX-License-Identifier: Apache-2.0
"""The whole data path with real processes: `solar run` starting real agents over a real HDF5
file or a real solar-stored server, real rank programs verifying every sample, and faults
(agent killed, rank killed, strangers, garbage on the socket, mismatched inputs)."""
import contextlib
import os
import pathlib
import shutil
import tempfile
import random
import signal
import socket
import struct
import subprocess
import sys

import pytest

from testlib import (AGENT, MAGIC, OP_BATCH, OP_ERROR, OP_HELLO, OP_HELLO_OK, OP_NEXT, OP_RELEASE,
                     OP_STATS, OP_STATS_REPLY, SOLAR, STORED, TRAIN, VERSION, count_lines, frame,
                     plan_sequences, reaped, run, wait_until)


def shm_entries():
    # Only ours: other tests running in parallel (torch workers, MPI) use /dev/shm too.
    return sorted(e for e in os.listdir("/dev/shm") if "solar" in e.lower())


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "d.h5"
    run(SOLAR, "gen", path, "--samples", "600", "--preset", "tiny", "--seed", "7", "--no-progress")
    return path


def recorded(path):
    out = {}
    with open(path) as f:
        for line in f:
            step, *samples = map(int, line.split())
            out[step] = samples
    return out


def check_sequences(tmp_path, plan, world):
    seq = plan_sequences(plan)
    assert len(seq) == world
    for rank in range(world):
        got = recorded(tmp_path / f"rank-{rank}.txt")
        assert got == dict(seq[rank]), f"rank {rank}'s samples differ from the plan"


RUN = ["-n", "4", "--nodes", "2", "--buffer", "50%", "--epochs", "3", "--batch", "6"]


def solar_run(tmp_path, dataset_spec, *extra, train_args=(), popen=False):
    cmd = [SOLAR, "run", *RUN, "--dataset", dataset_spec, "--plan-out", tmp_path / "plan", *extra,
           "--", TRAIN, "--verify", "--record", tmp_path / "rank-%r.txt", *train_args]
    # The run directory goes under the test's own folder, so leftovers are this run's alone.
    env = dict(os.environ, TMPDIR=str(tmp_path))
    if popen:
        return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
    return run(*cmd, check=False, env=env)


def test_run_two_nodes_over_hdf5(tmp_path, dataset):
    before = shm_entries()
    p = solar_run(tmp_path, dataset)
    assert p.returncode == 0, p.stderr
    out = p.stdout + p.stderr
    assert out.count("verified (0 wrong), from the node agent") == 4, out
    assert "DataLoading time SOLAR each epoch: [" in p.stdout
    check_sequences(tmp_path, tmp_path / "plan", 4)
    hits = [int(l.split(" hits")[0].split()[-1]) for l in p.stderr.splitlines() if " hits," in l]
    assert len(hits) == 2 and sum(hits) > 0, p.stderr
    assert shm_entries() == before
    assert not [d for d in os.listdir(tmp_path) if d.startswith("solar-run-")], "run directory left"



def test_run_large_batches_are_copied_to_the_rings_by_the_reader_pool(tmp_path):
    """256 KiB samples: each rank's batch (1.5 MiB) is copied into its ring by the agent's reader
    threads, not inline as the 4 KiB tests' are; every byte is still checked."""
    big = tmp_path / "big.h5"
    run(SOLAR, "gen", big, "--samples", "96", "--preset", "small", "--seed", "3", "--no-progress")
    p = solar_run(tmp_path, big)
    assert p.returncode == 0, p.stderr
    assert (p.stdout + p.stderr).count("verified (0 wrong), from the node agent") == 4, p.stderr
    check_sequences(tmp_path, tmp_path / "plan", 4)


@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_run_zero_copy_and_direct_io_agents(tmp_path, preset):
    """--zero-copy: no rings; ranks read the cache slots, which stay pinned until released.
    --direct-io: the agents read the file with O_DIRECT (4 KiB samples: every read unaligned)."""
    data = tmp_path / "z.h5"
    run(SOLAR, "gen", data, "--samples", "96", "--preset", preset, "--seed", "5", "--no-progress")
    p = solar_run(tmp_path, data, "--zero-copy", "--direct-io")
    assert p.returncode == 0, p.stderr
    assert (p.stdout + p.stderr).count("verified (0 wrong), from the node agent") == 4, p.stderr
    check_sequences(tmp_path, tmp_path / "plan", 4)


def test_run_without_agents_reads_the_same_samples(tmp_path, dataset):
    p = solar_run(tmp_path, dataset, "--no-agent")
    assert p.returncode == 0, p.stderr
    assert (p.stdout + p.stderr).count("verified (0 wrong), read directly") == 4
    check_sequences(tmp_path, tmp_path / "plan", 4)


def test_run_over_solar_stored(tmp_path, dataset):
    ready = tmp_path / "ready"
    server = subprocess.Popen([STORED, "--export", f"d={dataset}", "--ready-file", str(ready), "--quiet"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: ready.exists() and ready.read_text().strip(), what="solar-stored ready")
        addr = ready.read_text().strip()
        p = solar_run(tmp_path, f"fabric://{addr}/d")
        assert p.returncode == 0, p.stderr
        assert (p.stdout + p.stderr).count("verified (0 wrong), from the node agent") == 4
        check_sequences(tmp_path, tmp_path / "plan", 4)
    finally:
        server.terminate()
        server.wait(timeout=30)


def children(pid, name):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{d}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if int(fields[1]) == pid and comm.startswith(name[:15]):
            out.append(int(d))
    return sorted(out)


def interrupt(p, act, *waits, timeout=300):
    """While the run `p` (a Popen) goes on: waits for each (predicate, what) in `waits`, calls
    `act(p)`, then lets the run finish. Returns (returncode, stdout, stderr); `p` never outlives
    the call."""
    with reaped(p):
        for pred, what in waits:
            wait_until(pred, timeout=120, what=what)
        act(p)
        out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def kill_agent(p, victim=0, name="solar-agent"):
    os.kill(children(p.pid, name)[victim], signal.SIGKILL)


def agents_up(p, count=2):
    return lambda: len(children(p.pid, "solar-agent")) == count, f"{count} agents"


def at_line(path, n):
    return lambda: count_lines(path) >= n, f"{path.name} at line {n}"


def run_and_kill(tmp_path, dataset, compute_ms, name, count, rank_file, steps, victim):
    """Starts a solar run, waits until `count` children called `name` run and `rank_file` shows
    `steps` steps, SIGKILLs the `victim`-th of them, and returns (returncode, stdout, stderr)."""
    p = solar_run(tmp_path, dataset, train_args=["--compute-ms", str(compute_ms)], popen=True)
    return interrupt(p, lambda p: kill_agent(p, victim, name),
                     (lambda: len(children(p.pid, name)) == count, f"{count} × {name}"),
                     at_line(tmp_path / rank_file, steps))


def test_agent_killed_mid_run_ranks_finish_directly(tmp_path, dataset):
    before = shm_entries()
    rc, out, err = run_and_kill(tmp_path, dataset, 15, "solar-agent", 2, "rank-0.txt", 10, 0)
    assert rc == 0, err
    assert "went away" in err, err
    assert (out + err).count("verified (0 wrong)") == 4
    check_sequences(tmp_path, tmp_path / "plan", 4)  # nothing lost, nothing twice
    assert shm_entries() == before


def test_rank_killed_others_finish(tmp_path, dataset):
    rc, out, err = run_and_kill(tmp_path, dataset, 10, "solar-example-train", 4, "rank-1.txt", 5, 1)
    assert rc == 128 + signal.SIGKILL, err
    assert (out + err).count("verified (0 wrong), from the node agent") == 3, out + err


# ---- the agent on its own --------------------------------------------------------------------

@contextlib.contextmanager
def standalone_agent(tmp_path, dataset, *extra):
    """A solar-agent on its own (no solar run) for node 0 of a 2-rank plan of `dataset`, once its
    socket accepts: (process, socket, log, plan). Stopped with SIGTERM afterwards; it must exit
    0 and remove its socket."""
    plan = tmp_path / "a.plan"
    run(SOLAR, "plan", "--samples", "600", "--sample-bytes", "4K", "--epochs", "2", "--nodes", "1",
        "--ranks-per-node", "2", "--batch", "4", "--buffer", "400K", "--out", plan)
    # Under /tmp directly (pytest's own folders are private to root), created 0700.
    sock_dir = pathlib.Path(tempfile.mkdtemp(prefix="solar-test-"))
    sock = sock_dir / "agent.sock"
    log = tmp_path / "agent.log"
    proc = subprocess.Popen([str(a) for a in (AGENT, "--plan", plan, "--node", "0", "--dataset",
                                              dataset, "--socket", sock, "--log", log, *extra)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def connectable():
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(sock))
            return True
        except OSError:
            assert proc.poll() is None, f"agent exited: {log.read_text() if log.exists() else ''}"
            return False

    try:
        wait_until(connectable, what="agent socket")
        yield proc, sock, log, plan
    finally:
        proc.terminate()
        rc = proc.wait(timeout=30)
        left = sock.exists()
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert rc == 0
    assert not left, "the agent left its socket behind"


@pytest.fixture
def agent(tmp_path, dataset):
    with standalone_agent(tmp_path, dataset) as (proc, sock, log, _):
        yield proc, sock, log


def stats(sock):
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(frame(OP_STATS))
        head = s.recv(16, socket.MSG_WAITALL)
        magic, ver, op, length, _ = struct.unpack("<IHHII", head)
        assert op == OP_STATS_REPLY
        return s.recv(length, socket.MSG_WAITALL)


def test_agent_survives_garbage_and_serves_valid_clients(agent):
    proc, sock, _ = agent
    rng = random.Random(1)
    for i in range(150):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(sock))
            kind = i % 5
            if kind == 0:
                s.sendall(bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64))))
            elif kind == 1:  # valid header, absurd length
                s.sendall(struct.pack("<IHHII", MAGIC, VERSION, OP_NEXT, 1 << 30, 0))
            elif kind == 2:  # next before hello, wrong sizes
                s.sendall(frame(OP_NEXT, b"\x01\x02\x03"))
            elif kind == 3:  # hello for a rank that does not exist
                s.sendall(frame(OP_HELLO, struct.pack("<II", 99, os.getpid())))
            else:  # unknown op
                s.sendall(frame(rng.randrange(11, 60000), os.urandom(rng.randrange(0, 32))))
            try:
                s.recv(64)
            except OSError:
                pass
    assert proc.poll() is None
    assert b'"total_steps"' in stats(sock)


def read_frame(s):
    head = s.recv(16, socket.MSG_WAITALL)
    assert len(head) == 16, head
    magic, ver, op, length, _ = struct.unpack("<IHHII", head)
    assert (magic, ver) == (MAGIC, VERSION)
    return op, s.recv(length, socket.MSG_WAITALL) if length else b""


def test_rank_may_ask_for_steps_ahead(agent):
    """Protocol version 4: up to 8 `next` requests may be unanswered; the agent answers them in
    order, each once its batch is in the rank's ring (16 steps deep for these small batches: a
    step needs the release of the one sixteen before it; the hello says to ask 7 ahead, and to
    hold releases back), and refuses a ninth."""
    proc, sock, _ = agent
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(frame(OP_HELLO, struct.pack("<II", 0, os.getpid())))
        msg, fds, _, _ = socket.recv_fds(s, 16 + 4096, 1)
        for fd in fds:
            os.close(fd)
        assert struct.unpack_from("<IHHII", msg)[2] == OP_HELLO_OK
        assert struct.unpack_from("<I", msg, 16 + 60)[0] == 7  # HelloOk::ask_ahead
        assert struct.unpack_from("<I", msg, 16 + 108)[0] == 1  # HelloOk::defer_releases
        nxt = lambda *ts: b"".join(frame(OP_NEXT, struct.pack("<Q", t)) for t in ts)  # noqa: E731
        rel = lambda t: frame(OP_RELEASE, struct.pack("<Q", t))  # noqa: E731

        def batch_step():
            op, body = read_frame(s)
            assert op == OP_BATCH, (op, body)
            step, count, _ = struct.unpack_from("<QII", body)
            assert count == 4 and len(body) == 16 + 8 * count
            return step

        def steps(n):
            return [batch_step() for _ in range(n)]

        s.sendall(nxt(0, 1))  # both asked before either is read
        assert steps(2) == [0, 1]
        # Steps 2..15 fit the ring without a release, eight asked at a time at most ...
        s.sendall(nxt(*range(2, 10)))
        assert steps(8) == list(range(2, 10))
        s.sendall(nxt(*range(10, 17)))
        assert steps(6) == list(range(10, 16))
        # ... 16 waits for step 0's release, and 17..23 with it: eight unanswered, a ninth
        # refused.
        s.sendall(nxt(*range(17, 24)))
        s.sendall(nxt(24))
        op, why = read_frame(s)
        assert op == OP_ERROR and b"more than 8 steps asked for" in why, why
        s.sendall(nxt(23))  # out of order: the next step to ask for is 24
        op, why = read_frame(s)
        assert op == OP_ERROR and b"next step to ask for is 24" in why, why
        # Releases let the waiting steps through, in order, several in one go (the node's
        # other ranks never come: their rings stay full, and the agent reads no further ahead
        # than a step or two past step 16 for them).
        s.sendall(rel(0) + rel(1))
        assert steps(2) == [16, 17]
    assert proc.poll() is None


def test_other_protocol_version_is_told_why(agent):
    """A libsolar of another build (another protocol version) hears which versions differ, in
    one error frame, and the agent serves on."""
    proc, sock, _ = agent
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(str(sock))
        s.sendall(struct.pack("<IHHII", MAGIC, 1, OP_HELLO, 8, 0) + struct.pack("<II", 0, os.getpid()))
        head = s.recv(16, socket.MSG_WAITALL)
        magic, ver, op, length, _ = struct.unpack("<IHHII", head)
        assert (magic, ver, op) == (MAGIC, VERSION, OP_ERROR)  # error, in the agent's version
        why = s.recv(length, socket.MSG_WAITALL).decode()
        assert f"speaks protocol version {VERSION}" in why and "request version 1" in why, why
        assert s.recv(16) == b""  # then closed
    assert proc.poll() is None
    assert b'"total_steps"' in stats(sock)


def test_other_user_cannot_attach(agent, tmp_path):
    proc, sock, _ = agent
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
             "try:\n s.connect(sys.argv[1])\nexcept PermissionError:\n print('denied'); sys.exit(0)\n"
             "try:\n s.sendall(bytes.fromhex(sys.argv[2])); r = s.recv(16)\nexcept ConnectionError:\n r = b''\n"
             "print('reply' if r else 'closed')\n")
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable, "-c", probe,
                 str(sock), frame(OP_STATS).hex()]
    # The socket's directory and the socket itself are private to the agent's user.
    assert run(*as_nobody).stdout.strip() == "denied"
    # Even reachable, the agent checks the peer's uid and hangs up.
    os.chmod(sock.parent, 0o755)
    os.chmod(sock, 0o666)
    assert run(*as_nobody).stdout.strip() == "closed"
    assert proc.poll() is None


def test_agent_rejects_mismatched_inputs(tmp_path, dataset):
    other = tmp_path / "other.h5"
    run(SOLAR, "gen", other, "--samples", "500", "--preset", "tiny", "--no-progress")
    plan = tmp_path / "p.plan"
    run(SOLAR, "plan", "--samples", "600", "--sample-bytes", "4K", "--epochs", "1", "--batch", "4",
        "--buffer", "100K", "--out", plan)
    p = run(AGENT, "--plan", plan, "--node", "0", "--dataset", other, "--socket", tmp_path / "s1",
            check=False)
    assert p.returncode == 1 and "recompute the plan" in p.stderr, p.stderr
    p = run(AGENT, "--plan", plan, "--node", "0", "--dataset", tmp_path / "missing.h5", "--socket",
            tmp_path / "s2", check=False)
    assert p.returncode == 1 and "missing.h5" in p.stderr, p.stderr
    huge = tmp_path / "huge.plan"
    run(SOLAR, "plan", "--samples", "600", "--sample-bytes", "4K", "--epochs", "1", "--batch", "4",
        "--buffer", "100T", "--out", huge)
    p = run(AGENT, "--plan", huge, "--node", "0", "--dataset", dataset, "--socket", tmp_path / "s3",
            check=False)
    assert p.returncode == 1 and "available" in p.stderr, p.stderr
    assert not any((tmp_path / s).exists() for s in ("s1", "s2", "s3"))


def test_run_rejects_bad_input(tmp_path, dataset):
    p = run(SOLAR, "run", "-n", "2", "--dataset", tmp_path / "missing.h5", "--buffer", "1M", "--epochs",
            "1", "--batch", "4", "--", TRAIN, check=False)
    assert p.returncode == 2 and "--dataset" in p.stderr and "missing.h5" in p.stderr, p.stderr
    p = run(SOLAR, "run", "-n", "2", "--dataset", dataset, "--buffer", "8K", "--epochs", "1",
            "--batch", "4", "--", TRAIN, check=False)
    assert p.returncode == 2 and "--buffer" in p.stderr, p.stderr
    p = run(SOLAR, "run", "-n", "2", "--dataset", dataset, "--buffer", "1M", "--epochs", "1",
            "--batch", "400", "--", TRAIN, check=False)
    assert p.returncode == 2 and "--batch" in p.stderr, p.stderr


def test_stale_socket_of_a_crashed_agent_is_replaced(tmp_path, dataset):
    plan = tmp_path / "p.plan"
    run(SOLAR, "plan", "--samples", "600", "--sample-bytes", "4K", "--epochs", "1", "--batch", "4",
        "--buffer", "100K", "--out", plan)
    sock_dir = pathlib.Path(tempfile.mkdtemp(prefix="solar-test-"))
    sock = sock_dir / "agent.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))  # what a SIGKILLed agent leaves: a socket file nobody listens on
    stale.close()
    proc = subprocess.Popen([AGENT, "--plan", plan, "--node", "0", "--dataset", dataset, "--socket",
                             sock], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: proc.poll() is not None or b'"total_steps"' in _try_stats(sock),
                   what="agent on the stale path")
        assert proc.poll() is None
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        shutil.rmtree(sock_dir, ignore_errors=True)
    assert "removed stale socket" in out, out


def _try_stats(sock):
    try:
        return stats(sock)
    except (OSError, struct.error, AssertionError):
        return b""


def test_gpu_copy_path_never_breaks_the_batch_path(tmp_path, dataset):
    # With a GPU the batches are copied to it and checked; without one (or without CUDA in this
    # build) libsolar says why, the call fails cleanly, and training goes on on the CPU.
    p = solar_run(tmp_path, dataset, train_args=["--device-copy"])
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count("verified (0 wrong), from the node agent") == 4, out
    skipped = out.count("GPU copies skipped: ")
    copied = out.count("copied to the GPU, 0 wrong")
    assert skipped + copied == 4, out
    if skipped:
        assert "no GPU" in out or "without CUDA" in out, out


# ---- the dataset replaced under a running job ------------------------------------------------

NOT_THE_PLANS = "not the dataset the plan was computed for"


def other_dataset(tmp_path, samples=600, preset="tiny"):
    """A file of the dataset fixture's shape with other content (seed 8)."""
    other = tmp_path / "other.h5"
    run(SOLAR, "gen", other, "--samples", str(samples), "--preset", preset, "--seed", "8",
        "--no-progress")
    return other


def rewrite_in_place(path, other):
    """`other`'s bytes written into `path`: same inode, new content and mtime."""
    with open(other, "rb") as src, open(path, "r+b") as dst:
        shutil.copyfileobj(src, dst)


def wrong_counts(out):
    """Every 'verified (N wrong)' a rank printed."""
    return [int(l.split("verified (")[1].split(" wrong")[0]) for l in out.splitlines()
            if "verified (" in l]


def assert_no_foreign_bytes(out, world):
    # Each rank either finished on the original bytes or stopped with an error naming the file;
    # none was handed a byte of the other file.
    assert all(n == 0 for n in wrong_counts(out)), out
    finished = out.count("verified (0 wrong)")
    refused = out.count(NOT_THE_PLANS)
    assert finished + refused >= world and refused >= 1, out


def test_dataset_moved_over_then_agent_killed_no_rank_reads_the_other_file(tmp_path, dataset):
    """`mv` of another file of the same shape over the dataset mid-run, then an agent SIGKILLed:
    its ranks fall back to direct reads, which must refuse the new file (the plan carries the
    dataset's identity); the other node's agent keeps serving the file it opened."""
    other = other_dataset(tmp_path)
    p = solar_run(tmp_path, dataset, train_args=["--compute-ms", "15"], popen=True)

    def replace_then_kill(p):
        os.replace(other, dataset)
        kill_agent(p)

    rc, out, err = interrupt(p, replace_then_kill, agents_up(p),
                             at_line(tmp_path / "rank-0.txt", 10))
    both = out + err
    assert rc != 0, both
    assert_no_foreign_bytes(both, 4)
    assert str(dataset) in [l for l in both.splitlines() if NOT_THE_PLANS in l][0], both


def test_file_rewritten_in_place_is_refused_by_an_open_reader(tmp_path, dataset):
    """The same inode rewritten (another file's bytes copied into it): a rank that reads
    directly notices at its next read (size or mtime changed) and stops."""
    other = other_dataset(tmp_path)
    p = solar_run(tmp_path, dataset, "--no-agent", train_args=["--compute-ms", "15"], popen=True)
    rc, out, err = interrupt(p, lambda p: rewrite_in_place(dataset, other),
                             at_line(tmp_path / "rank-0.txt", 10))
    both = out + err
    assert rc != 0, both
    assert all(n == 0 for n in wrong_counts(both)), both
    assert "changed while solar was reading it" in both, both


def test_solar_stored_restarted_with_another_file_no_rank_reads_it(tmp_path, dataset):
    """solar-stored restarted on the same port exporting another file under the same name: the
    agents refuse to resume on it and exit; their ranks' direct reads refuse it too."""
    other = other_dataset(tmp_path)

    def start(path, listen, tag):
        ready = tmp_path / f"ready-{tag}"
        proc = subprocess.Popen([STORED, "--listen", listen, "--export", f"d={path}", "--ready-file",
                                 str(ready), "--quiet"], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        servers.append(proc)
        wait_until(lambda: proc.poll() is not None or (ready.exists() and ready.read_text().strip()),
                   what="solar-stored ready")
        assert proc.poll() is None, proc.stdout.read()
        return proc, ready.read_text().strip()

    def restart_on_the_other_file(p):
        server.kill()
        server.wait()
        start(other, addr, "b")

    servers = []
    try:
        server, addr = start(dataset, "127.0.0.1:0", "a")
        p = solar_run(tmp_path, f"fabric://{addr}/d", train_args=["--compute-ms", "15"], popen=True)
        rc, out, err = interrupt(p, restart_on_the_other_file, agents_up(p),
                                 at_line(tmp_path / "rank-0.txt", 10))
    finally:
        for proc in servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    both = out + err
    assert rc != 0, both
    assert all(n == 0 for n in wrong_counts(both)), both
    assert "different file" in both or NOT_THE_PLANS in both, both


def test_every_program_has_version_and_solar_names_unknown_commands():
    for prog, name in ((SOLAR, "solar"), (AGENT, "solar-agent"), (STORED, "solar-stored"),
                       (TRAIN, "solar-example-train")):
        p = run(prog, "--version")
        assert p.stdout.strip().startswith(name + " ") and p.stdout.strip()[len(name) + 1].isdigit(), p.stdout
    p = run(SOLAR, "frobnicate", check=False)
    assert p.returncode == 2
    assert "unknown command 'frobnicate'" in p.stderr and "plan, plan-dump" in p.stderr, p.stderr
