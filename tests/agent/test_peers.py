"""Peer sharing with real processes: `solar run --peers` starts one agent per simulated node;
they read the plan's peer reads from each other's buffers over libfabric RMA (tcp;ofi_rxm on
loopback). The bytes ranks get are checked (the C++ example trainer verifies every sample; the
unmodified h5py script's per-batch digests must equal its run without solar), also with a peer
agent SIGKILLed mid-run, and a process with the card's address but not its key reads nothing."""
import os
import re
import subprocess

import pytest

from test_data_path import AGENT, BIN, SOLAR, TRAIN, children, interrupt, lines, run
from test_transparent import PY, SCRIPT, digests

PROBE = os.environ.get("SOLAR_PEER_PROBE") or os.path.join(BIN, "tests", "solar_peer_probe")
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
        (lambda: lines(tmp_path / "peers-0.txt") >= 4, "rank 0 at line 4"), timeout=600)
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
        (lambda: lines(tmp_path / "peers-1.txt") >= 1, "rank 1 at line 1"), timeout=600)
    assert rc == 0, out + err
    assert digests(tmp_path, "peers", 4) == digests(tmp_path, "plain", 4)
    # It stayed stopped to the end (no statistics from it); the others finished without it.
    assert "node 1: the agent gave no statistics" in err, err
    assert sorted(peer_counts(err)) == [0, 2, 3], err
