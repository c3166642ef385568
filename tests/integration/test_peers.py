# SPDX-License-Identifier: Apache-2.0
"""Peer sharing with real processes: `solar run --peers` starts one agent per simulated node;
they read the plan's peer reads from each other's buffers over libfabric RMA (tcp;ofi_rxm on
loopback). The bytes ranks get are checked (the C++ example trainer verifies every sample; the
unmodified h5py script's per-batch digests must equal its run without solar), also with a peer
agent SIGKILLed mid-run, and a process with the card's address but not its key reads nothing."""
import os
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile

import pytest

from test_data_path import children, interrupt, wrong_counts
from test_transparent import SCRIPT, digests
from testlib import AGENT, PEER_PROBE as PROBE, PY, SOLAR, TRAIN, count_lines, run, wait_until

PEERS = re.compile(r"node (\d+): (\d+) samples read from peers' buffers \(.*?\), (\d+) from "
                   r"storage instead")


def peer_counts(stderr):
    """{node: (peer samples, fallbacks)} from solar run's summary."""
    return {int(m.group(1)): (int(m.group(2)), int(m.group(3))) for m in PEERS.finditer(stderr)}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("peers") / "d.h5"
    run(SOLAR, "gen", path, "--samples", "192", "--preset", "small", "--seed", "4",
        "--no-progress")
    return path


def script_run(tmp_path, data, tag, *solar_args, epochs=3, popen=False, timeout=600):
    cmd = [SOLAR, "run", "-n", "4", "--nodes", "4", "--dataset", data, "--epochs", str(epochs),
           "--batch", "4", "--seed", "3", "--buffer", "26%", *solar_args, "--", PY, SCRIPT,
           data, "--epochs", str(epochs), "--batch", "4", "--seed", "3",
           "--digests", tmp_path / f"{tag}-%r.txt"]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    if popen:
        return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
    return run(*cmd, check=False, env=env, timeout=timeout)


def test_unmodified_script_reads_peers_and_gets_the_same_bytes(tmp_path, data):
    plain = script_run(tmp_path, data, "plain", "--no-agent")
    assert plain.returncode == 0, plain.stderr
    p = script_run(tmp_path, data, "peers", "--transparent", "--peers")
    assert p.returncode == 0, p.stdout + p.stderr
    assert digests(tmp_path, "peers", 4) == digests(tmp_path, "plain", 4)
    counts = peer_counts(p.stderr)
    assert sorted(counts) == [0, 1, 2, 3], p.stderr
    assert all(n > 0 and fb == 0 for n, fb in counts.values()), p.stderr
    assert "peer sharing was turned off" not in p.stderr, p.stderr


@pytest.mark.parametrize("provider", ["tcp;ofi_rxm", "shm"])
def test_batch_ranks_verify_every_peer_filled_sample(tmp_path, data, provider):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = run(SOLAR, "run", "-n", "4", "--nodes", "4", "--dataset", data, "--epochs", "3",
            "--batch", "4", "--buffer", "26%", "--peers", "--peer-provider", provider, "--",
            TRAIN, "--verify", check=False, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout + p.stderr
    assert out.count("verified (0 wrong), from the node agent") == 4, out
    assert sum(n for n, _ in peer_counts(p.stderr).values()) > 0, p.stderr


def test_peer_agent_killed_mid_run_same_bytes(tmp_path, data):
    plain = script_run(tmp_path, data, "plain", "--no-agent", epochs=4)
    assert plain.returncode == 0, plain.stderr
    p = script_run(tmp_path, data, "peers", "--transparent", "--peers", "--peer-timeout", "3",
                   epochs=4, popen=True)

    def kill_node1(p):
        victim = children(p.pid, "solar-agent")[1]
        os.kill(victim, 9)

    rc, out, err = interrupt(
        p, kill_node1, (lambda: len(children(p.pid, "solar-agent")) == 4, "4 agents"),
        (lambda: count_lines(tmp_path / "peers-0.txt") >= 4, "rank 0 at line 4"), timeout=600)
    assert rc == 0, out + err
    assert digests(tmp_path, "peers", 4) == digests(tmp_path, "plain", 4)


def test_strangers_cannot_read_or_write_a_buffer(tmp_path, data):
    """A rank program that probes node 1's agent while the job runs: with the card's key it reads
    (the control), with guessed keys it neither reads nor writes, with the card's key it does
    not write (remote access is read-only); another user cannot even open the card (the peer
    folder is 0700, the card 0600)."""
    probe = tmp_path / "probe.sh"
    result = tmp_path / "probe.txt"
    probe.write_text(
        "#!/bin/sh\n"
        '[ "$RANK" = 0 ] || exit 0\n'
        'card="$(dirname "$SOLAR_SOCKET")/peers/node1.peer"\n'
        f'until [ -e "$card" ]; do sleep 0.05; done\n'
        f'{PROBE} "$card" > {result} 2>&1; echo "probe-status $?" >> {result}\n'
        f'stat -c "card-mode %a" "$card" >> {result}\n'
        f'stat -c "dir-mode %a" "$(dirname "$card")" >> {result}\n'
        f'setpriv --reuid=65534 --regid=65534 --clear-groups cat "$card" >/dev/null 2>&1; '
        f'echo "stranger-cat $?" >> {result}\n')
    probe.chmod(0o755)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = run(SOLAR, "run", "-n", "2", "--nodes", "2", "--dataset", data, "--epochs", "1",
            "--batch", "4", "--buffer", "26%", "--peers", "--", probe, check=False, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    text = result.read_text()
    assert "granted-read ok" in text, text
    assert re.search(r"guessed-read \d+ refused", text), text
    assert "guessed-read" in text and not re.search(r"guessed-read \d+ ok", text), text
    assert "guessed-write" in text and not re.search(r"guessed-write \d+ ok", text), text
    assert "granted-write refused" in text, text  # read-only, even with the key
    assert "probe-status 0" in text, text
    assert "card-mode 600" in text and "dir-mode 700" in text, text
    assert "stranger-cat 0" not in text and "stranger-cat" in text, text


def test_peer_dir_that_others_can_open_is_refused(tmp_path, data):
    plan = tmp_path / "plan"
    run(SOLAR, "plan", "--samples", "192", "--sample-bytes", "256K", "--epochs", "1",
        "--nodes", "2", "--batch", "4", "--buffer", "26%", "--out", plan)
    shared = tmp_path / "open"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    p = run(AGENT, "--plan", plan, "--node", "0", "--dataset", data, "--socket",
            tmp_path / "a.sock", "--peer-dir", shared, check=False, timeout=60)
    assert p.returncode == 1, p.stderr
    assert "--peer-dir" in p.stderr and "0700" in p.stderr, p.stderr
    assert not list(shared.iterdir())


def test_peer_agent_stopped_mid_run_nothing_hangs_same_bytes(tmp_path, data):
    """SIGSTOP of node 1's agent, left stopped until `solar run` stops the agents at the end:
    reads from it (in flight or queued) give up after --peer-timeout (peer sharing off, or
    that peer passed over), its own unmodified rank reads the file for what is not resident,
    and every rank still gets the plain run's bytes."""
    plain = script_run(tmp_path, data, "plain", "--no-agent", epochs=4)
    assert plain.returncode == 0, plain.stderr
    p = script_run(tmp_path, data, "peers", "--transparent", "--peers", "--peer-timeout", "1",
                   epochs=4, popen=True)

    def stop_node1(p):
        os.kill(children(p.pid, "solar-agent")[1], 19)  # SIGSTOP; solar run sends SIGCONT

    # Stopped as soon as its own rank has its first batch (so it is attached, and the other
    # nodes have all their peer reads from it still to do: they cannot have read ahead of it).
    rc, out, err = interrupt(
        p, stop_node1, (lambda: len(children(p.pid, "solar-agent")) == 4, "4 agents"),
        (lambda: count_lines(tmp_path / "peers-1.txt") >= 1, "rank 1 at line 1"), timeout=600)
    assert rc == 0, out + err
    assert digests(tmp_path, "peers", 4) == digests(tmp_path, "plain", 4)
    # It stayed stopped to the end (no statistics from it); the others finished without it.
    assert "node 1: the agent gave no statistics" in err, err
    assert sorted(peer_counts(err)) == [0, 2, 3], err


@pytest.mark.parametrize("own_card", [True, False], ids=["own-card-later", "no-own-card"])
def test_another_jobs_card_is_not_read(tmp_path, own_card):
    """Two jobs of the same shape (the same plan inputs) on different datasets, each with two
    agents started by hand: job A's node0.peer copied into job B's peer folder (a reused
    --peer-dir) before B's node 0 writes its own. B's node 1 must see that the card names
    another job and dataset, say so, not read A's buffer, and take B's own card once it is
    there, or, when B's node 0 never starts, read from storage after --peer-timeout; every rank
    gets its own dataset's bytes."""
    sock_dir = pathlib.Path(tempfile.mkdtemp(prefix="solar-test-"))  # short socket paths
    procs, jobs = [], {}
    try:
        for tag, seed in (("a", "4"), ("b", "5")):
            d = tmp_path / tag
            d.mkdir()
            run(SOLAR, "gen", d / "d.h5", "--samples", "480", "--preset", "tiny", "--seed", seed,
                "--no-progress")
            run(SOLAR, "plan", "--samples", "480", "--sample-bytes", "4K", "--epochs", "3",
                "--nodes", "2", "--batch", "4", "--buffer", "26%", "--peer-fetch", "--policy",
                "sampler", "--out", d / "plan")
            (d / "peers").mkdir(mode=0o700)
            jobs[tag] = d

        def agent(tag, node, timeout="20"):
            d = jobs[tag]
            sock = sock_dir / f"{tag}{node}.sock"
            log = d / f"node{node}.log"
            p = subprocess.Popen([str(a) for a in (
                AGENT, "--plan", d / "plan", "--node", node, "--dataset", d / "d.h5", "--socket",
                sock, "--log", log, "--peer-dir", d / "peers", "--peer-timeout", timeout)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            procs.append(p)
            return p, sock, log

        def connectable(p, sock, log):
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(str(sock))
                return True
            except OSError:
                assert p.poll() is None, log.read_text() if log.exists() else ""
                return False

        agents = {("a", 0): agent("a", 0), ("a", 1): agent("a", 1)}
        wait_until(lambda: (jobs["a"] / "peers" / "node0.peer").exists(), what="A's card")
        shutil.copy(jobs["a"] / "peers" / "node0.peer", jobs["b"] / "peers" / "node0.peer")
        agents[("b", 1)] = agent("b", 1, "20" if own_card else "2")
        b1_log = agents[("b", 1)][2]
        # B's node 1 has read (or refused) the card it found before B's node 0 starts.
        wait_until(lambda: b1_log.exists() and re.search(
            r"peer sharing over|another job", b1_log.read_text()), what="B node 1 read the cards")
        if own_card:
            agents[("b", 0)] = agent("b", 0)
        for key, a in agents.items():
            wait_until(lambda: connectable(*a), what=f"agent {key}")

        ranks = []
        for tag, node in agents:  # one rank per agent
            env = dict(os.environ, SOLAR_PLAN=str(jobs[tag] / "plan"), SOLAR_NODE=str(node),
                       SOLAR_LOCAL_RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       RANK=str(node), WORLD_SIZE="2", SOLAR_DATASET=str(jobs[tag] / "d.h5"),
                       SOLAR_SOCKET=str(agents[(tag, node)][1]))
            ranks.append((tag, node, subprocess.Popen(
                [TRAIN, "--verify"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True)))
        outs = {}
        for tag, node, r in ranks:
            out, _ = r.communicate(timeout=300)
            outs[(tag, node)] = (r.returncode, out)
        assert all(rc == 0 for rc, _ in outs.values()), outs
        for p in procs:
            p.terminate()
        for p in procs:
            assert p.wait(timeout=30) == 0
        text = b1_log.read_text()
        for key, (_, out) in outs.items():
            assert wrong_counts(out) == [0], (key, out, text)
        assert re.search(r"peer node 0: the card in \S+ is another job's \(its job is plan file "
                         r"\S+/a/plan .*; its dataset is file inode .* \(this agent's: file "
                         r"inode .*\); not used", text), text
        m = re.search(r'"peers":\{[^}]*"samples":(\d+)', text)
        if own_card:  # it read B's node 0 once that card was there
            assert m and int(m.group(1)) > 0, text
        else:  # nothing from a peer; what it planned to read from node 0 came from storage
            assert re.search(r"peer node 0: only another job's card in \S+ after 2 s \(its job "
                             r"is plan file \S+/a/plan ", text), text
            assert m and int(m.group(1)) == 0, text
        planned = re.search(r"(\d+) peer reads planned from other nodes", text)
        assert planned and int(planned.group(1)) > 0, text
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(sock_dir, ignore_errors=True)
