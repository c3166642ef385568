# SPDX-License-Identifier: Apache-2.0
"""Faults found by probing the data path as an attacker and a careless user would (issue 14), with
real processes: an agent that runs out of file descriptors or is stopped (SIGSTOP), a `solar run`
killed outright, whatever lies at the agent's --socket path, and floods of connections."""
import os
import pathlib
import resource
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time

import pytest

from test_data_path import _try_stats, check_sequences, children, dataset  # noqa: F401
from testlib import (AGENT, MAGIC, OP_HELLO, OP_NEXT, OP_STATS, SOLAR, TRAIN, VERSION, count_lines,
                     frame, run, wait_until)

# Under scripts/sanitize address the agent's freed memory stays in ASan's quarantine (256 MiB by
# default) instead of going back to its allocator, so its peak RSS may grow by that much more.
ASAN_QUARANTINE_MIB = 256 if "ASAN_OPTIONS" in os.environ else 0


def start(cmd, tmp_path, **env):
    """A `solar run` (or any command) in its own session, so that a test can kill all of it."""
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, TMPDIR=str(tmp_path), **env), start_new_session=True)


def finish(p, timeout):
    """(returncode, stdout, stderr); on a timeout the whole session is killed and the test fails."""
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        reap(p)
        out, err = p.communicate()
        raise AssertionError(f"still running after {timeout} s (hung):\n{out[-3000:]}\n{err[-3000:]}")


def reap(p):
    """Kills what is left of a session started by start() (stopped processes included)."""
    for sig in (signal.SIGCONT, signal.SIGKILL):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
    if p.poll() is None:
        p.kill()
    p.wait()


def alive(pid):
    """Running (a zombie is not: nobody may have reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_dirs(tmp_path):
    return [d for d in os.listdir(tmp_path) if d.startswith("solar-run-")]


def run_cmd(tmp_path, *opts, train_args=()):
    return [SOLAR, "run", *opts, "--plan-out", tmp_path / "plan", "--", TRAIN, "--verify", "--record",
            tmp_path / "rank-%r.txt", *train_args]


# ---- 1. a stopped agent, an agent out of file descriptors: ranks read directly, nothing hangs ----

def test_sigstopped_agent_ranks_fall_back_after_the_timeout(tmp_path, dataset):
    """SIGSTOP of an agent mid-run: its ranks wait SOLAR_AGENT_TIMEOUT seconds for the reply, then
    read directly from the step where they were, say so once, and the job finishes with every
    sample verified (before: they waited forever)."""
    p = start(run_cmd(tmp_path, "-n", "4", "--nodes", "2", "--buffer", "40%", "--epochs", "3", "--batch",
                      "6", "--dataset", dataset, train_args=["--compute-ms", "15"]),
              tmp_path, SOLAR_AGENT_TIMEOUT="2")
    try:
        wait_until(lambda: len(children(p.pid, "solar-agent")) == 2, timeout=120, what="2 agents")
        wait_until(lambda: count_lines(tmp_path / "rank-0.txt") >= 5, timeout=120, what="rank 0 at step 5")
        stopped = children(p.pid, "solar-agent")[0]
        os.kill(stopped, signal.SIGSTOP)
        rc, out, err = finish(p, 120)
    finally:
        reap(p)
    assert rc == 0, err
    assert err.count("the agent did not answer within 2 s (SOLAR_AGENT_TIMEOUT)") == 2, err  # node 0's ranks
    assert (out + err).count("verified (0 wrong)") == 4, out + err
    check_sequences(tmp_path, tmp_path / "plan", 4)  # nothing lost, nothing twice
    assert not alive(stopped)


def test_agent_out_of_file_descriptors_refuses_at_once_and_the_job_finishes(tmp_path, dataset):
    """`ulimit -n 18`: the agent can serve a few ranks only. It keeps accepting, answers the others
    at once (they read directly), logs it once-ish and stops keeping slots for them, so the ranks
    it serves are not held up either (the timeout is long: nothing relies on it). Before: it
    stopped accepting without a word and the other ranks waited forever."""
    # Ranks slowed down (20 ms a step) so that all eight are attached at once: fast ones finished
    # and gave their descriptors back before the last ones connected, and none was refused.
    cmd = " ".join(f"'{c}'" for c in run_cmd(tmp_path, "-n", "8", "--nodes", "1", "--buffer", "50%",
                                            "--epochs", "1", "--batch", "4", "--dataset", dataset,
                                            "--keep-run-dir", train_args=["--compute-ms", "20"]))
    p = start(["bash", "-c", f"ulimit -n 18 && exec {cmd}"], tmp_path, SOLAR_AGENT_TIMEOUT="600")
    try:
        rc, out, err = finish(p, 180)
    finally:
        reap(p)
    assert rc == 0, err
    both = out + err
    assert both.count("verified (0 wrong)") == 8, both
    served, direct = both.count("from the node agent"), both.count("verified (0 wrong), read directly")
    assert served >= 1 and direct >= 1 and served + direct == 8, both
    assert err.count("out of file descriptors") == direct, err  # each refused rank says why
    assert "SOLAR_AGENT_TIMEOUT" not in err, err
    check_sequences(tmp_path, tmp_path / "plan", 8)
    (folder,) = run_dirs(tmp_path)
    log = (tmp_path / folder / "node0.log").read_text()
    said = [l for l in log.splitlines() if "out of file descriptors" in l]
    assert 1 <= len(said) <= 3 and "refused local rank" in said[0], log


# ---- 2. `kill -KILL` of solar run: its agents, ranks and folder go with it -------------------------

def test_killed_solar_run_takes_its_agents_ranks_and_folder_with_it(tmp_path, dataset):
    p = start(run_cmd(tmp_path, "-n", "4", "--nodes", "2", "--buffer", "40%", "--epochs", "3", "--batch",
                      "6", "--dataset", dataset, train_args=["--compute-ms", "20"]), tmp_path)
    try:
        wait_until(lambda: len(children(p.pid, "solar-agent")) == 2, timeout=120, what="2 agents")
        wait_until(lambda: count_lines(tmp_path / "rank-0.txt") >= 3, timeout=120, what="rank 0 at step 3")
        agents = children(p.pid, "solar-agent")
        ranks = children(p.pid, "solar-example-train")
        assert len(ranks) == 4 and run_dirs(tmp_path)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        wait_until(lambda: not any(alive(a) for a in agents), timeout=10, what="the agents to stop")
        wait_until(lambda: not any(alive(r) for r in ranks), timeout=10, what="the ranks to stop")
        wait_until(lambda: not run_dirs(tmp_path), timeout=15, what="the run folder to go")
    finally:
        reap(p)


def owner_line(pid, start, boot=None):
    """What solar run writes into its folder's solar-run.owner."""
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = boot or f.read().strip()
    return f"boot={boot} pidns={os.readlink('/proc/self/ns/pid')} pid={pid} start={start}\n"


def start_time(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def test_folders_of_dead_solar_runs_are_swept_by_the_next(tmp_path, dataset):
    """A folder left by a solar run killed with its whole process group (the watchdog too) is
    removed by the next solar run of the user: only when its owner is dead, on this machine."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    folders = {
        "solar-run-dead01": owner_line(gone.pid, "12345"),  # the owner has exited
        "solar-run-live01": owner_line(os.getpid(), start_time(os.getpid())),  # still running
        "solar-run-reused": owner_line(os.getpid(), "1"),  # its pid now another process's: dead
        "solar-run-other1": owner_line(gone.pid, "12345", boot="another-machine"),
        "solar-run-kept01": None,  # --keep-run-dir: no owner file
    }
    for name, owner in folders.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "node0.log").write_text("x")
        if owner:
            (tmp_path / name / "solar-run.owner").write_text(owner)
    p = run(*run_cmd(tmp_path, "-n", "2", "--buffer", "40%", "--epochs", "1", "--batch", "6", "--dataset",
                     dataset, "--no-agent"), env=dict(os.environ, TMPDIR=str(tmp_path)), check=False)
    assert p.returncode == 0, p.stderr
    assert sorted(run_dirs(tmp_path)) == ["solar-run-kept01", "solar-run-live01", "solar-run-other1"]


# ---- 3. --socket PATH: only a stale socket is replaced ----------------------------------------------

@pytest.fixture
def small_plan(tmp_path):
    plan = tmp_path / "p.plan"
    run(SOLAR, "plan", "--samples", "600", "--sample-bytes", "4K", "--epochs", "1", "--batch", "4",
        "--buffer", "100K", "--out", plan)
    return plan


def agent_on(plan, data, sock, timeout=30, extra=()):
    """Runs an agent on `sock`; (returncode, output) once it exits. One still running after
    `timeout` seconds took the path over, a failure of these tests: it is stopped and None is
    returned as its status."""
    proc = subprocess.Popen([AGENT, "--plan", plan, "--node", "0", "--dataset", data, "--socket", sock,
                             *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
        return None, out


@pytest.fixture
def sock_dir():
    d = pathlib.Path(tempfile.mkdtemp(prefix="solar-test-"))  # short: a socket path has < 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_socket_path_holding_a_file_or_a_folder_is_left_alone(small_plan, dataset, sock_dir):
    target = sock_dir / "target"
    target.write_text("keep me")
    cases = {"file": ("a regular file", lambda p: p.write_text("precious")),
             "folder": ("a folder", lambda p: p.mkdir()),
             "link": ("a symbolic link", lambda p: p.symlink_to(target))}
    for name, (what, make) in cases.items():
        path = sock_dir / name
        make(path)
        rc, out = agent_on(small_plan, dataset, path)
        assert rc == 1, f"{name}: the agent took the path over ({rc}):\n{out}"
        assert str(path) in out and what in out and "removed" not in out, out
    assert (sock_dir / "file").read_text() == "precious"
    assert (sock_dir / "folder").is_dir() and not os.listdir(sock_dir / "folder")
    assert (sock_dir / "link").is_symlink() and target.read_text() == "keep me"


def test_socket_path_served_by_another_agent_is_left_alone(small_plan, dataset, sock_dir):
    path = sock_dir / "live.sock"
    live = socket.socket(socket.AF_UNIX)
    live.bind(str(path))
    live.listen(8)
    try:
        rc, out = agent_on(small_plan, dataset, path)
        assert rc == 1 and f"{path}: another agent is serving this socket" in out, out
        with socket.socket(socket.AF_UNIX) as c:  # still there, still the other one's
            c.connect(str(path))
    finally:
        live.close()


# ---- 4. floods of connections: memory, threads and descriptors stay bounded --------------------

def status(pid):
    with open(f"/proc/{pid}/status") as f:
        fields = dict(l.split(":", 1) for l in f)
    return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM", "Threads")}


@pytest.fixture
def one_rank_agent(tmp_path, dataset, sock_dir):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))  # ours; the agent inherits it
    plan = tmp_path / "a.plan"
    run(SOLAR, "plan", "--samples", "600", "--sample-bytes", "4K", "--epochs", "1", "--nodes", "1",
        "--ranks-per-node", "1", "--batch", "4", "--buffer", "400K", "--out", plan)
    sock, log = sock_dir / "agent.sock", tmp_path / "agent.log"
    proc = subprocess.Popen([AGENT, "--plan", plan, "--node", "0", "--dataset", dataset, "--socket", sock,
                             "--log", log], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None or b'"total_steps"' in _try_stats(sock), what="agent")
        assert proc.poll() is None, log.read_text()
        yield proc, plan, sock, log
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def rank_env(plan, dataset, sock):
    return dict(os.environ, SOLAR_PLAN=str(plan), SOLAR_NODE="0", SOLAR_LOCAL_RANK="0",
                SOLAR_DATASET=str(dataset), SOLAR_SOCKET=str(sock), SOLAR_AGENT_TIMEOUT="30")


def test_connection_flood_keeps_the_agent_bounded_and_a_rank_is_served(one_rank_agent, dataset):
    """900 connections each declaring a 1 MiB frame and sending nothing more, then 300 that send
    nothing at all, all held open: the agent's memory (peak RSS), threads and descriptors stay
    bounded, it logs the refusals a few times, not per connection, and a rank connecting after
    the flood is served by it (before: +1 GB, a descriptor per connection)."""
    proc, plan, sock, log = one_rank_agent
    before = status(proc.pid)
    held = []
    try:
        for i in range(1200):
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            if i < 900:
                s.sendall(struct.pack("<IHHII", MAGIC, VERSION, (OP_NEXT, OP_HELLO, OP_STATS)[i % 3], 1 << 20, 0))
            held.append(s)
        assert b'"total_steps"' in _try_stats(sock)  # it got through all of them
        time.sleep(0.5)
        after = status(proc.pid)
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        p = run(TRAIN, "--verify", env=rank_env(plan, dataset, sock), check=False, timeout=120)
    finally:
        for s in held:
            s.close()
    assert after["VmHWM"] - before["VmRSS"] < (100 + ASAN_QUARANTINE_MIB) * 1024, (before, after)  # kB
    assert after["Threads"] <= before["Threads"], (before, after)
    assert fds < 128 + 40, fds
    assert p.returncode == 0 and "verified (0 wrong), from the node agent" in p.stdout + p.stderr, p.stderr
    assert proc.poll() is None
    text = log.read_text()
    flood = [l for l in text.splitlines() if "oversized" in l or "oldest" in l]
    assert 1 <= len(flood) <= 8, "\n".join(flood[:20]) + f"\n... {len(flood)} lines"


def test_client_that_never_reads_its_replies_is_closed(one_rank_agent):
    """10000 stats requests sent at once, their replies not read: the agent stops queueing replies
    past its bound and closes the connection instead of growing (before: every reply queued)."""
    proc, _, sock, _ = one_rank_agent
    before = status(proc.pid)
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock))
        s.sendall(frame(OP_STATS) * 10000)
        time.sleep(2)
        s.settimeout(20)
        got = 0
        while True:
            try:
                chunk = s.recv(1 << 20)
            except ConnectionResetError:  # closed with requests it had not read yet
                break
            if not chunk:
                break
            got += len(chunk)
    after = status(proc.pid)
    reply = len(_try_stats(sock)) + 16
    assert got < 10000 * reply / 2, (got, reply)
    assert after["VmHWM"] - before["VmRSS"] < (100 + ASAN_QUARANTINE_MIB) * 1024, (before, after)
    assert proc.poll() is None


def test_a_plan_above_the_max_buffer_it_was_started_with_is_refused(small_plan, dataset, sock_dir):
    """Issue 32 (review): slurmstepd checks the site's max_buffer on the plan, which lies in a
    folder of the job's user, who could replace it before the agent reads it; the agent checks
    the limit it was given (--max-buffer) on the plan it reads."""
    rc, out = agent_on(small_plan, dataset, sock_dir / "a.sock", extra=["--max-buffer", "50000"])
    assert rc == 1, out
    assert "above this agent's limit" in out and "--max-buffer" in out, out
    assert not (sock_dir / "a.sock").exists(), out
