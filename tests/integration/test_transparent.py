# SPDX-License-Identifier: Apache-2.0
"""Job-transparent mode with real processes: an unmodified h5py + DistributedSampler + DataLoader
script (slurm_examples/train_h5py_ddp.py) under `solar run --transparent` (real agents, the real
interposer preloaded into every rank and DataLoader worker) against the same script without
solar: per-batch SHA-256 of inputs and labels and the losses identical bit for bit."""
import os
import re
import subprocess

import pytest

from test_data_path import (agents_up, at_line, interrupt, kill_agent, other_dataset,
                            rewrite_in_place)
from testlib import PY, SOLAR, run

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "slurm_examples", "train_h5py_ddp.py")
SERVED = re.compile(r"file reads served from the buffer (\d+) \(.*?\), fallen through (\d+)")
FELL = re.compile(r"([\d.]+)% of the script's file reads fell through to storage \(more than 2%")


def digests(tmp_path, tag, world):
    out = {}
    for r in range(world):
        with open(tmp_path / f"{tag}-{r}.txt") as f:
            out[r] = f.read().splitlines()
        assert out[r], f"rank {r} wrote no batches"
    return out


def run_script(tmp_path, data, tag, *solar_args, workers=0, lazy=False, epochs=2, batch=4,
               seed=3, script_seed=None, popen=False):
    cmd = [SOLAR, "run", "-n", "4", "--nodes", "2", "--dataset", data, "--epochs", str(epochs),
           "--batch", str(batch), "--seed", str(seed), *solar_args, "--", PY, SCRIPT, data,
           "--epochs", str(epochs), "--batch", str(batch),
           "--seed", str(seed if script_seed is None else script_seed),
           "--workers", str(workers), "--digests", str(tmp_path / f"{tag}-%r.txt")]
    if lazy:
        cmd.append("--lazy")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    if popen:
        return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
    return run(*cmd, check=False, env=env, timeout=600)


def served(stderr):
    """(reads served from the buffer, reads fallen through), summed over the nodes."""
    pairs = [tuple(map(int, m.groups())) for m in SERVED.finditer(stderr)]
    assert len(pairs) == 2, stderr
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    out = {}
    for name, preset, n, layout in (("tiny", "tiny", 96, "contiguous"),
                                    ("small", "small", 48, "contiguous"),
                                    ("chunked", "small", 48, "chunked"),
                                    ("chunked-tiny", "tiny", 96, "chunked"),
                                    # gzip chunks of one sample (issue 36): served as stored,
                                    # h5py decompressing them in the rank
                                    ("gzip", "small", 48, "gzip"),
                                    ("gzip-tiny", "tiny", 96, "gzip")):
        path = d / f"{name}.h5"
        run(SOLAR, "gen", path, "--samples", str(n), "--preset", preset, "--layout", layout,
            "--seed", "4", "--no-progress")
        out[name] = path
    return out


@pytest.mark.parametrize("preset,workers,lazy", [("small", 0, False), ("small", 2, True),
                                                 ("tiny", 2, False), ("tiny", 0, True),
                                                 ("chunked", 2, False), ("chunked-tiny", 0, True),
                                                 ("gzip", 2, False), ("gzip-tiny", 0, True)])
def test_unmodified_script_same_bytes_served_from_the_buffer(tmp_path, datasets, preset, workers,
                                                             lazy):
    data = datasets[preset]
    plain = run_script(tmp_path, data, "plain", "--buffer", "100%", "--no-agent", workers=workers,
                       lazy=lazy)
    assert plain.returncode == 0, plain.stderr
    solar = run_script(tmp_path, data, "solar", "--buffer", "100%", "--transparent",
                       workers=workers, lazy=lazy)
    assert solar.returncode == 0, solar.stdout + solar.stderr
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)
    hits, _ = served(solar.stderr)
    assert hits > 0, solar.stderr


def test_wrong_seed_same_bytes_and_the_mismatch_is_reported(tmp_path, datasets):
    data = datasets["small"]
    plain = run_script(tmp_path, data, "plain", "--buffer", "100%", "--no-agent", script_seed=9)
    assert plain.returncode == 0, plain.stderr
    solar = run_script(tmp_path, data, "solar", "--buffer", "50%", "--transparent", script_seed=9)
    assert solar.returncode == 0, solar.stdout + solar.stderr
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)
    assert "the script's order differs from the plan" in solar.stderr, solar.stderr
    # Each node that read more than 2% from the file says so, with its share of the reads.
    per_node = [tuple(map(int, m.groups())) for m in SERVED.finditer(solar.stderr)]
    said = [float(x) for x in FELL.findall(solar.stderr)]
    expect = [100 * miss / (hit + miss) for hit, miss in per_node if miss > 0.02 * (hit + miss)]
    assert expect and said == pytest.approx(expect, abs=0.06), solar.stderr


def test_agent_killed_mid_epoch_same_bytes(tmp_path, datasets):
    data = datasets["small"]
    plain = run_script(tmp_path, data, "plain", "--buffer", "100%", "--no-agent", epochs=3)
    assert plain.returncode == 0, plain.stderr
    p = run_script(tmp_path, data, "solar", "--buffer", "50%", "--transparent", epochs=3,
                   popen=True)
    rc, out, err = interrupt(p, kill_agent, agents_up(p), at_line(tmp_path / "solar-0.txt", 3),
                             timeout=600)
    assert rc == 0, out + err
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)


def test_dataset_replaced_nothing_served_from_the_buffer(tmp_path, datasets):
    """The file moved over before the ranks open it: the interposer sees another inode than the
    agent's index and serves nothing; the script reads the new file, as it would without solar."""
    data = tmp_path / "d.h5"
    run(SOLAR, "gen", data, "--samples", "48", "--preset", "small", "--seed", "4", "--no-progress")
    other = other_dataset(tmp_path, 48, "small")
    # A wrapper that replaces the file once the agents hold it, then runs the script.
    wrapper = tmp_path / "replace-then-train.sh"
    wrapper.write_text(f'#!/bin/sh\n[ "$RANK" = 0 ] && mv -f {other} {data}\n'
                       f'while [ -e {other} ]; do sleep 0.05; done\nexec "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = run(SOLAR, "run", "-n", "4", "--nodes", "2", "--dataset", data, "--epochs", "2", "--batch",
            "4", "--seed", "3", "--buffer", "100%", "--transparent", "--", wrapper, PY, SCRIPT,
            data, "--epochs", "2", "--batch", "4", "--seed", "3", "--digests",
            tmp_path / "solar-%r.txt", check=False, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    hits, _ = served(p.stderr)
    assert hits == 0, p.stderr
    # One warning per rank process; nothing from the buffer, the new file's bytes as without solar.
    assert p.stderr.count("is not the file the node agent holds") == 4, p.stderr


def test_processes_that_are_not_ranks_are_untouched(tmp_path, datasets):
    data = datasets["tiny"]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    for cmd in (["bash", "-c", "echo hi; ls / | head -3; exit 3"],
                [PY, "-c", "import sys, h5py; print(h5py.File(sys.argv[1])['data'].shape)", data]):
        alone = run(*cmd, check=False)
        under = run(SOLAR, "run", "-n", "1", "--dataset", data, "--epochs", "1", "--batch", "4",
                    "--buffer", "100%", "--transparent", "--", *cmd, check=False, env=env)
        assert under.returncode == alone.returncode, under.stderr
        assert under.stdout == alone.stdout, under.stderr


def wait_then_run(tmp_path):
    """A wrapper that waits until the node agent has read every sample of its plan (polling
    `solar stat`, at most 120 s), then runs its arguments."""
    wrapper = tmp_path / "wait-then-train.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        "tries=0\n"  # bounded: a wrapper left looping would outlive a failed run
        f"until {SOLAR} stat \"$SOLAR_SOCKET\" --json | {PY} -c "
        "'import json,sys; s=json.load(sys.stdin); sys.exit(s[\"ready_steps\"] < s[\"total_steps\"])'"
        "; do tries=$((tries + 1)); if [ $tries -gt 2400 ]; then\n"
        "  echo \"wait-then-train: the agent did not read every sample within 120 s\" >&2; exit 1\n"
        "fi; sleep 0.05; done\nexec \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


@pytest.mark.parametrize("preset", ["tiny", "small", "chunked", "chunked-tiny", "gzip"])
def test_whole_dataset_resident_no_sample_byte_from_the_file(tmp_path, datasets, preset):
    """One node holding the whole dataset (64M, several times its size: the plan's resident set is
    what remains after the agent's staging slots, so 100% would evict a little): once the agent has read every sample (the script
    waits for that, polling `solar stat`), every read of a sample is served from the buffer,
    including HDF5's 64 KiB sieve reads over several 4 KiB rows; none falls through."""
    data = datasets[preset]
    wrapper = wait_then_run(tmp_path)
    env = dict(os.environ, TMPDIR=str(tmp_path))
    p = run(SOLAR, "run", "-n", "2", "--nodes", "1", "--dataset", data, "--epochs", "2", "--batch",
            "4", "--seed", "3", "--buffer", "64M", "--transparent", "--", wrapper, PY, SCRIPT,
            data, "--epochs", "2", "--batch", "4", "--seed", "3", "--workers", "2", "--digests",
            tmp_path / "solar-%r.txt", check=False, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    m = SERVED.search(p.stderr)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) == 0, p.stderr
    assert "fallen through 0 (0 B)" in p.stderr, p.stderr
    assert not FELL.search(p.stderr), p.stderr


def h5py_gzip(path, data, chunks):
    """An HDF5 file written by h5py: /data = `data` (numpy code, `n` the module) gzip-chunked
    by `chunks`, /label one int32 a sample."""
    subprocess.run([PY, "-c", "import h5py, numpy as n, sys; x = " + data + "; "
                    "f = h5py.File(sys.argv[1], 'w'); f.create_dataset('data', data=x, "
                    f"chunks={chunks}, compression='gzip'); "
                    "f.create_dataset('label', data=n.arange(len(x), dtype='i4'))", str(path)],
                   check=True)
    return path


def test_compressed_chunks_of_several_samples_are_refused_with_the_reason(tmp_path):
    """A gzip chunk of 4 samples holds no sample's bytes on their own: not served, said why."""
    data = h5py_gzip(tmp_path / "gz4.h5", "n.arange(48 * 64, dtype='i2').reshape(48, 64)",
                     (4, 64))
    p = run(SOLAR, "run", "-n", "1", "--dataset", data, "--epochs", "1", "--batch", "4",
            "--buffer", "100%", "--transparent", "--", "true", check=False,
            env=dict(os.environ, TMPDIR=str(tmp_path)))
    assert p.returncode != 0, p.stderr
    assert "chunks of several compressed samples" in p.stderr and "h5repack" in p.stderr, p.stderr


def test_compressible_gzip_chunks_take_their_stored_size_in_the_buffer(tmp_path):
    """Compressible samples (zeros but a few bytes) in gzip chunks: the plan counts slots of the
    longest stored chunk, so the same --buffer holds many more samples than raw ones would;
    the script's batches are the plain script's bit for bit."""
    # Zeros but each sample's id in a few of its values.
    data = h5py_gzip(tmp_path / "zeros.h5",
                     "n.zeros((96, 4, 8, 8, 8), 'i2'); x[:, 0, 0, 0, :] = n.arange(96)[:, None]",
                     (1, 4, 8, 8, 8))
    plain = run_script(tmp_path, data, "plain", "--buffer", "100%", "--no-agent")
    assert plain.returncode == 0, plain.stderr
    # 16 KiB a node: not one step of raw samples (2 ranks x 4 x 4 KiB = 32 KiB), ~250 stored.
    solar = run_script(tmp_path, data, "solar", "--buffer", "16K", "--transparent",
                       "--stats-out", tmp_path / "stats.json")
    assert solar.returncode == 0, solar.stdout + solar.stderr
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)
    hits, _ = served(solar.stderr)
    assert hits > 0, solar.stderr
    import json
    nodes = json.loads((tmp_path / "stats.json").read_text())["nodes"]
    assert all(0 < n["sample_bytes"] < 4096 // 10 for n in nodes), nodes


def rewrite_keeping_mtime(path, other):
    """rewrite_in_place, then the old access and modification times put back (as `touch -r`,
    `rsync -t` or `tar -x` leave them): only the change time tells."""
    st = os.stat(path)
    rewrite_in_place(path, other)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("rewrite", [rewrite_in_place, rewrite_keeping_mtime],
                         ids=["new-mtime", "mtime-put-back"])
def test_file_rewritten_in_place_mid_run_is_withdrawn(tmp_path, rewrite):
    """Another file's bytes copied over the dataset (same inode) while the script runs, with a
    new mtime or the old one put back (issue 32, finding 7: the ctime tells): the agent notices
    within its watch period and withdraws the buffer; from then on every rank reads the file
    itself, and each process says so once."""
    data = tmp_path / "d.h5"
    run(SOLAR, "gen", data, "--samples", "48", "--preset", "small", "--seed", "4", "--no-progress")
    other = other_dataset(tmp_path, 48, "small")
    p = run_script(tmp_path, data, "solar", "--buffer", "64%", "--transparent", epochs=40,
                   popen=True)
    rc, out, err = interrupt(p, lambda p: rewrite(data, other),
                             at_line(tmp_path / "solar-0.txt", 3), timeout=600)
    assert rc == 0, out + err
    assert "changed during the run; reading it directly" in err, err
    assert err.count("changed during the run; reading it directly") <= 4, err  # once per rank
    assert "the unmodified ranks read the file from now on" in err, err  # the agent withdrew it


def probe(tmp_path, mode):
    """transparent_probe.py MODE as the one rank of `solar run --transparent`, once its agent
    holds the whole dataset (48 samples of 64 KiB in a 64M buffer)."""
    data = tmp_path / "d.h5"
    run(SOLAR, "gen", data, "--samples", "48", "--preset", "small", "--seed", "4", "--no-progress")
    other = other_dataset(tmp_path, 48, "small")
    import h5py
    with h5py.File(data, "r") as f:
        offset, S = f["data"].id.get_offset(), f["data"][0].nbytes
    p = run(SOLAR, "run", "-n", "1", "--dataset", data, "--epochs", "1", "--batch", "4",
            "--buffer", "64M", "--transparent", "--", wait_then_run(tmp_path), PY,
            os.path.join(HERE, "transparent_probe.py"), mode, data, other, offset, S, check=False,
            env=dict(os.environ, TMPDIR=str(tmp_path), SOLAR_VERBOSE="1"), timeout=300)
    assert "WRONG" not in p.stdout, p.stdout + p.stderr
    assert p.stdout.count("ok ") >= 3, p.stdout + p.stderr
    return p


def test_agent_killed_then_file_rewritten_or_replaced_reads_the_new_bytes(tmp_path):
    """Issue 32, finding 1: the agent SIGKILLed (as the OOM killer does), then the file rewritten
    in place with its mtime put back, then deleted and written anew (ext4 often gives the new
    file the old inode number): every read of the rank, through the fd it had, a new one and a
    forked child, returns the file's bytes of the moment, never the buffer's old ones."""
    p = probe(tmp_path, "agent-killed")
    assert "killed agent" in p.stdout, p.stdout + p.stderr
    assert p.stdout.count("ok ") == 6, p.stdout + p.stderr
    assert "changed during the run; reading it directly" in p.stderr, p.stderr


def test_fd_closed_inside_fclose_and_reused_reads_the_other_file(tmp_path):
    """Issue 32, finding 2: fdopen + fclose close the dataset's fd inside glibc, where the
    interposer does not see it; fopen of another file takes the number. Its reads at offsets
    where the dataset has resident samples return the other file's bytes."""
    p = probe(tmp_path, "fclose")
    assert p.stdout.count("ok ") == 4, p.stdout + p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
