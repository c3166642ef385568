# SPDX-License-Identifier: Apache-2.0
"""Job-transparent mode over datasets of many files (issue 35, item 5), with real processes:
unmodified h5py + DistributedSampler + DataLoader scripts under `solar run --transparent` (real
agents, the real interposer preloaded into every rank and DataLoader worker) against the same
script without solar: per-batch SHA-256 of inputs and labels identical bit for bit.

Two kinds of script, as real workloads read: the SOLAR artifact's CosmoFlow (one file per
sample in subfolders, `split` + `unitPar`, a file opened and closed in every __getitem__), and
DLIO's (a few files of many `records` rows, the last one shorter, every file kept open). The
interposer recognises each file of the dataset at open by its identity in the agent's file
table and serves its samples' bytes from the buffer; file descriptors of closed files are not
taken for new ones (a file a sample reuses the same numbers all the time)."""
import json
import os
import zipfile
import resource
import shutil

import pytest

import numpy as np

from test_transparent import SERVED, digests, served, wait_then_run
from testlib import PY, SOLAR, run

# The unmodified script: the artifact's CosmoFlow reader (--layout files) or DLIO's (records);
# nothing in it knows about solar. Per batch it writes the SHA-256 of inputs and labels.
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "slurm_examples",
                      "train_h5py_files_ddp.py")


@pytest.fixture(scope="module")
def script():
    return SCRIPT


def gen(out, layout, samples, *extra):
    run(SOLAR, "gen", out, "--layout", layout, "--samples", str(samples), "--preset", "tiny",
        "--seed", "4", "--no-progress", *extra)
    return out


def write_npz(out, samples, mean_bytes, seed=5):
    """MLPerf Storage's UNet3D layout in small: one .npz a sample (np.savez: float32 `x` of a
    length spread +-50% around the mean, int32 `y`), of differing sizes."""
    out.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(samples):
        n = int(rng.integers(mean_bytes // 8, mean_bytes * 3 // 8 + 1))  # 0.5x .. 1.5x mean
        np.savez(out / f"case_{i:05d}.npz", x=rng.standard_normal(n, dtype=np.float32),
                 y=np.array([i], dtype=np.int32))
    return out


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """The artifact's layout (2 universes of 64 one-sample files, a subfolder each), with
    contiguous and with chunked arrays (one chunk a file: the interposer's extent table), and
    DLIO's (8 files of 50 rows but the last, 30). Samples of 4 KiB."""
    d = tmp_path_factory.mktemp("data")
    return {
        "files": gen(d / "universes", "per-sample-files", 128, "--universes-per-dir", "1"),
        "files-chunked": gen(d / "universes-chunked", "per-sample-files", 128,
                             "--universes-per-dir", "1", "--storage-layout", "chunked"),
        # The artifact's layout written with gzip (issue 36): each file's one chunk served as
        # stored, h5py decompressing it in the rank.
        "files-gzip": gen(d / "universes-gzip", "per-sample-files", 128,
                          "--universes-per-dir", "1", "--storage-layout", "gzip"),
        "records": gen(d / "dlio", "dlio", 380, "--files", "8", "--samples-per-file", "50"),
        # Whole-file samples (issue 36): 96 npz files of 32 KiB +- 50%, np.load in the script.
        "npz": write_npz(d / "npz", 96, 32 << 10),
    }


SPEC = {"files": ("{}/:/split", "/unitPar", "files"),
        "files-glob": ("{}/*/*.hdf5:/split", "/unitPar", "files"),
        "files-list": ("@{}.list:/split", "/unitPar", "files"),
        "files-chunked": ("{}/:/split", "/unitPar", "files"),
        "files-gzip": ("{}/:/split", "/unitPar", "files"),
        "records": ("{}/:/records[]", "/labels", "records"),
        "npz": ("{}/*.npz", None, "npz")}


def solar_run(tmp_path, script, data, kind, tag, *solar_args, ranks=4, nodes=2, workers=0,
              epochs=2, wrapper=None, preexec=None):
    spec, labels, layout = SPEC[kind]
    cmd = [SOLAR, "run", "-n", str(ranks), "--nodes", str(nodes), "--dataset", spec.format(data),
           *(["--labels", labels] if labels else []), "--epochs", str(epochs), "--batch", "4",
           "--seed", "3",
           *solar_args, "--", *(str(wrapper).split() if wrapper else []), PY, script, data, "--layout",
           layout, "--epochs", str(epochs), "--batch", "4", "--seed", "3", "--workers",
           str(workers), "--digests", tmp_path / f"{tag}-%r.txt"]
    return run(*cmd, check=False, env=dict(os.environ, TMPDIR=str(tmp_path)), timeout=600,
               preexec_fn=preexec)


def plain_and_solar(tmp_path, script, data, kind, *solar_args, ranks=4, nodes=2, wrapper=None,
                    **kw):
    """The script without solar, then under --transparent (started by `wrapper`, if any):
    returns the second run, its per-batch digests checked identical to the first's."""
    plain = solar_run(tmp_path, script, data, kind, "plain", "--buffer", "100%", "--no-agent",
                      ranks=ranks, nodes=nodes, **kw)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    solar = solar_run(tmp_path, script, data, kind, "solar", "--transparent", *solar_args,
                      ranks=ranks, nodes=nodes, wrapper=wrapper, **kw)
    assert solar.returncode == 0, solar.stdout + solar.stderr
    assert digests(tmp_path, "solar", ranks) == digests(tmp_path, "plain", ranks)
    return solar


@pytest.mark.parametrize("kind,workers", [("files", 0), ("files", 2), ("files-chunked", 2),
                                          ("files-gzip", 0), ("files-gzip", 2),
                                          ("records", 0), ("records", 2),
                                          ("npz", 0), ("npz", 2)])
def test_unmodified_script_over_many_files_same_bytes_served_from_the_buffer(
        tmp_path, script, datasets, kind, workers):
    """2 nodes x 2 ranks: a file opened and closed per sample, or DLIO's files kept open."""
    solar = plain_and_solar(tmp_path, script, datasets[kind], kind, "--buffer", "100%",
                            workers=workers)
    hits, _ = served(solar.stderr)
    assert hits > 0, solar.stderr


@pytest.mark.parametrize("kind", ["files-glob", "files-list"])
def test_glob_and_list_name_the_same_files(tmp_path, script, datasets, kind):
    """The artifact's files named by a glob, and by a list in sorted path order (the script's):
    the interposer takes what the glob's basename pattern matches, or any file for a list, and
    serves the files of the agent's table."""
    data = datasets["files"]
    if kind == "files-list":
        with open(f"{data}.list", "w") as f:
            f.writelines(f"{p}\n" for p in sorted(data.glob("*/*.hdf5")))
    solar = plain_and_solar(tmp_path, script, data, kind, "--buffer", "100%", ranks=2, nodes=1)
    m = SERVED.search(solar.stderr)
    assert m and int(m.group(1)) > 0, solar.stderr


def transparent_stats(path):
    with open(path) as f:
        return [n["transparent"] for n in json.load(f)["nodes"]]


@pytest.mark.parametrize("kind", ["files", "files-chunked", "files-gzip", "records", "npz"])
def test_whole_dataset_resident_no_sample_byte_from_the_files(tmp_path, script, datasets, kind):
    """One node holding the whole dataset (a buffer several times its size: the plan's resident
    set is what its staging slots leave) and a script that starts once the agent has read every
    sample: every read of a sample's bytes, in every file, is served from the buffer; only HDF5's
    metadata reads reach the files. Each open of a file of the dataset is counted (`opens`):
    the artifact's script opens one per sample read, two epochs over 128 samples; DLIO's opens
    its 8 files once in each rank (to count their rows) and in each DataLoader worker (made
    anew every epoch)."""
    data = datasets[kind]
    solar = plain_and_solar(tmp_path, script, data, kind, "--buffer", "64M", "--stats-out",
                            tmp_path / "stats.json", ranks=2, nodes=1, workers=2,
                            wrapper=wait_then_run(tmp_path))
    m = SERVED.search(solar.stderr)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) == 0, solar.stderr
    # npz: every byte np.load reads (read(2)s at the file's position, zipfile's end first)
    assert "fallen through 0 (0 B)" in solar.stderr, solar.stderr
    [x] = transparent_stats(tmp_path / "stats.json")
    assert x["miss_bytes"] == 0 and x["hit_reads"] > 0, x
    if kind == "records":  # 8 files x 2 ranks x (their own + 2 workers x 2 epochs)
        assert x["opens"] == 8 * 2 * (1 + 2 * 2), x
    else:  # npz: np.load opens each file once, so the whole file counts once (at its close)
        assert x["opens"] == 2 * (96 if kind == "npz" else 128), x


def resident_pages(path, offset, length):
    """How many of the pages holding bytes [offset, offset + length) of `path` are in the page
    cache (mincore(2) over a private mapping of the file)."""
    import ctypes
    import mmap
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        page = mmap.PAGESIZE
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        at = ctypes.c_char.from_buffer(mm)
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(at)), ctypes.c_size_t(size), vec):
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del at
        return sum(vec[i] & 1 for i in range(offset // page, (offset + length - 1) // page + 1))
    finally:
        mm.close()


def evict(paths):
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def test_served_files_are_not_read_ahead_from_storage(tmp_path, script, datasets):
    """The artifact's layout, one 4 KiB sample a file: h5py's small metadata reads of a file
    the agent serves must not make the kernel read ahead the sample's bytes (the whole file)
    from storage, a second time. The agent reads with O_DIRECT (--direct-io); the files are
    dropped from the page cache once it has read them all; after two epochs served from the
    buffer, no page of any sample's bytes is in the page cache."""
    import h5py
    data = datasets["files"]
    files = sorted(data.glob("*/*.hdf5"))
    where = {}
    for p in files:
        with h5py.File(p, "r") as f:
            where[p] = f["split"].id.get_offset()
    assert all(v is not None and v % 4096 == 0 for v in where.values()), where
    (tmp_path / "drop.py").write_text(
        "import os, sys\n"
        "for p in sys.argv[1:]:\n"
        "    fd = os.open(p, os.O_RDONLY)\n"
        "    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)\n"
        "    os.close(fd)\n")
    dropper = tmp_path / "drop-cache.sh"
    dropper.write_text(f"#!/bin/sh\n{PY} {tmp_path / 'drop.py'} {' '.join(map(str, files))}\n"
                       'exec "$@"\n')
    dropper.chmod(0o755)
    evict(files)
    solar = solar_run(tmp_path, script, data, "files", "solar", "--transparent", "--direct-io",
                      "--buffer", "64M", ranks=2, nodes=1,
                      wrapper=f"{wait_then_run(tmp_path)} {dropper}")
    assert solar.returncode == 0, solar.stdout + solar.stderr
    m = SERVED.search(solar.stderr)
    assert m and int(m.group(1)) > 0 and int(m.group(2)) == 0, solar.stderr
    read_ahead = {p.name: n for p in files if (n := resident_pages(p, where[p], 4096))}
    assert not read_ahead, (f"sample pages of {len(read_ahead)} of {len(files)} files in the "
                            f"page cache: {sorted(read_ahead)[:4]} ...")
    # The same files read by h5py without solar do bring them in (the check can fail).
    evict(files)
    plain = solar_run(tmp_path, script, data, "files", "plain", "--buffer", "100%", "--no-agent",
                      ranks=2, nodes=1)
    assert plain.returncode == 0, plain.stderr
    assert sum(resident_pages(p, where[p], 4096) for p in files) == len(files)


def test_ulimit_256_with_2000_files(tmp_path, script):
    """2,000 one-sample files, every process limited to 256 descriptors (the agent, the ranks
    and their workers): the agent holds a bounded number of files open, the script one at a
    time, and the interposer none of its own."""
    data = gen(tmp_path / "many", "per-sample-files", 2000, "--universes-per-dir", "4")

    def limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    solar = plain_and_solar(tmp_path, script, data, "files", "--buffer", "100%", ranks=2,
                            nodes=1, workers=2, epochs=1, preexec=limit)
    m = SERVED.search(solar.stderr)
    assert m and int(m.group(1)) > 0, solar.stderr


def test_one_file_replaced_the_others_still_served(tmp_path, script, datasets):
    """One file of the dataset moved over by another (new inode) once the agents have read the
    whole dataset, before the ranks open it: its reads go to the new file, whose bytes the
    script gets as it would without solar; the other files are still served from the buffer
    (one file of many changed withdraws nothing else)."""
    data = tmp_path / "universes"
    shutil.copytree(datasets["files"], data)
    victim = data / "001" / "univ0001_007.hdf5"
    other = tmp_path / "other.hdf5"
    shutil.copyfile(data / "000" / "univ0000_003.hdf5", other)  # another sample's bytes
    wrapper = tmp_path / "replace-then-train.sh"
    wrapper.write_text(f'#!/bin/sh\n[ "$RANK" = 0 ] && mv -f {other} {victim}\n'
                       'tries=0\n'  # bounded, as wait_then_run
                       f'while [ -e {other} ]; do tries=$((tries + 1)); '
                       '[ $tries -gt 2400 ] && exit 1; sleep 0.05; done\nexec "$@"\n')
    wrapper.chmod(0o755)
    solar = solar_run(tmp_path, script, data, "files", "solar", "--transparent", "--buffer",
                      "64M", ranks=2, nodes=1, wrapper=f"{wait_then_run(tmp_path)} {wrapper}")
    assert solar.returncode == 0, solar.stdout + solar.stderr
    # The reference: the dataset as the script found it, without solar.
    plain = solar_run(tmp_path, script, data, "files", "plain", "--buffer", "100%",
                      "--no-agent", ranks=2, nodes=1)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert digests(tmp_path, "solar", 2) == digests(tmp_path, "plain", 2)
    m = SERVED.search(solar.stderr)
    assert m and int(m.group(1)) > 0, solar.stderr
    assert "withdr" not in solar.stderr and "changed during the run" not in solar.stderr, \
        solar.stderr


BATCH_RANK = """
import glob, io, os, sys
import numpy as np, solar
files = sorted(glob.glob(sys.argv[1] + "/*.npz"))
L = solar.Loader()
assert L.sizes_differ
n = 0
for b in L:
    views = [bytes(v) for v in b.views()]
    for x, a, v in zip(b.indices, b.data, views):
        want = open(files[x], "rb").read()
        assert a.tobytes() == want == v, (int(x), len(a), len(want))
        assert np.load(io.BytesIO(want))["y"][0] == x
        n += 1
os.write(1, f"rank {L.rank} agent {L.using_agent} checked {n}\\n".encode())  # one write: ranks share stdout
"""


def test_npz_sizes_spread_served_in_batch_mode_each_sample_its_file(tmp_path, datasets):
    """The npz files are of differing sizes (+-50% around their mean), one sample each. solar
    run without --transparent plans them by bytes and its agents serve them zero copy to
    solar.Loader: every sample of every batch is exactly its file's bytes (with the agent and
    without), and the agents hit their buffers. `solar dataset-info` says what they are."""
    data = datasets["npz"]
    sizes = sorted(os.path.getsize(p) for p in data.glob("*.npz"))
    assert sizes[-1] > 2.5 * sizes[0], sizes  # spread, not one size
    with zipfile.ZipFile(data / "case_00000.npz") as z:
        assert sorted(z.namelist()) == ["x.npy", "y.npy"]
    rank = tmp_path / "rank.py"
    rank.write_text(BATCH_RANK)
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(SOLAR), "..", "..", "python"))
    budget = str(sum(sizes) // 2)
    for extra in ([], ["--no-agent"]):
        stats = tmp_path / f"stats{len(extra)}.json"
        p = run(SOLAR, "run", "--nodes", "2", "--ranks-per-node", "2", "--dataset",
                f"{data}/*.npz", "--buffer", budget, "--epochs", "2", "--batch", "4",
                *(extra or ["--stats-out", stats]), *extra, "--", PY, rank, data, env=env)
        lines = [l for l in p.stdout.splitlines() if l.startswith("rank ")]
        assert len(lines) == 4, p.stdout + p.stderr
        assert all(l.endswith("checked 24") for l in lines), p.stdout
        assert all(("agent True" in l) == (not extra) for l in lines), p.stdout
        if not extra:
            nodes = json.loads(stats.read_text())["nodes"]
            assert sum(e["hits"] for n in nodes for e in n["epochs"]) > 0, nodes
            assert all(n["mode"] == "zero_copy" and n["buffer"]["sized"] for n in nodes), nodes
    p = run(SOLAR, "run", "--nodes", "2", "--dataset", f"{data}/*.npz", "--buffer", "50%",
            "--epochs", "1", "--batch", "4", "--peers", "--", PY, "-c", "pass", check=False)
    assert p.returncode == 2 and "whole-file samples" in p.stderr and "--peers" in p.stderr, \
        p.stderr
    info = json.loads(run(SOLAR, "dataset-info", f"{data}/*.npz", "--labels", "").stdout)
    assert info["whole_files"] is True and info["samples"] == 96, info
    assert info["stored_sample_bytes"] == info["sample_bytes"] == sizes[-1], info
    assert "whole-file samples" in info["layout"], info


@pytest.mark.parametrize("kind,workers", [("npz", 0), ("npz", 2)])
def test_samples_of_differing_sizes_held_by_their_bytes(tmp_path, script, datasets, kind,
                                                        workers):
    """Issue 36, item 1: whole files of +-50% around their mean in a buffer of
    64% of their bytes, 2 nodes x 2 ranks, 3 epochs: the plan counts bytes (no slot of the
    largest sample each), every sample is held in its own bytes rounded up to 64 in one arena
    per agent, sized from the node's schedule as extents; digests identical to the plain
    script's, reads served, nothing left unplaced."""
    stats = tmp_path / "stats.json"
    solar = plain_and_solar(tmp_path, script, datasets[kind], kind, "--buffer", "64%",
                            "--stats-out", stats, workers=workers, epochs=3)
    hits, _ = served(solar.stderr)
    assert hits > 0, solar.stderr
    with open(stats) as f:
        doc = json.load(f)
    plan = doc["plan"]
    # The byte bound, recounted here: every epoch reads all bytes, at most both buffers' bytes
    # can already be there.
    data = datasets[kind]
    sizes = [(os.path.getsize(p) + 63) // 64 * 64 for p in sorted(data.glob("*.npz"))]
    for node in doc["nodes"]:
        b = node["buffer"]
        assert b["sized"] is True and b["unplaced_samples"] == 0, b
        # The arena holds the plan's bytes (fragmentation: a little more, never less), and
        # the buffer holds it.
        assert b["plan_bytes"] <= b["arena_bytes"] <= 1.25 * b["plan_bytes"], b
        assert b["bytes"] > b["arena_bytes"], b
    B, M, E = sum(sizes), 2, 3
    cap = doc["nodes"][0]["buffer"]["plan_bytes"]
    assert plan["lower_bound_bytes"] == B + (E - 1) * max(0, B - M * cap), plan
    assert plan["lower_bound_bytes"] <= plan["remote_bytes"], plan


def test_a_buffer_too_small_for_the_largest_samples_is_refused_naming_both(tmp_path, datasets):
    """Samples of differing sizes: a --buffer below three steps of the node's ranks at the
    largest sample is refused before anything starts, naming the largest sample and the least
    buffer."""
    data = datasets["npz"]
    largest = max(os.path.getsize(p) for p in data.glob("*.npz"))
    p = run(SOLAR, "run", "-n", "2", "--dataset", f"{data}/*.npz", "--buffer", "64K",
            "--transparent", "--epochs", "1", "--batch", "4", "--", PY, "-c", "pass",
            check=False)
    assert p.returncode == 2, p.stderr
    assert "--buffer" in p.stderr and "64.0 KiB per node is too small" in p.stderr, p.stderr
    rounded = (largest + 63) // 64 * 64
    assert f"up to {rounded / 1024:.1f} KiB" in p.stderr, (rounded, p.stderr)
    assert f"at least {3 * 2 * 4 * rounded / 2**20:.2f} MiB" in p.stderr, p.stderr


def test_gen_writes_npz_of_spread_sizes_that_verify_and_serve(tmp_path, script):
    """Issue 36, item 4: `solar gen --layout npz` writes MLPerf Storage's UNet3D layout with
    samples of spread sizes (np.savez's format: np.load reads it), `solar verify` checks every
    file's bytes and label and finds a changed byte or a file moved to another place; the
    unmodified script reads it under --transparent at 64% of its bytes with the plain script's
    batches."""
    data = tmp_path / "unet3d"
    g = run(SOLAR, "gen", data, "--layout", "npz", "--samples", "64", "--preset", "tiny",
            "--size-spread", "50", "--seed", "9", "--no-progress")
    assert "64 .npz files" in g.stdout and "--transparent" in g.stdout, g.stdout
    files = sorted(data.glob("*.npz"))
    assert len(files) == 64 and files[0].name == "case_00000.npz", files[:2]
    sizes = []
    for p in files:
        with np.load(p) as z:
            assert z["x"].dtype == np.uint8 and z["y"].dtype == np.int64 and z["y"].shape == (1,)
            sizes.append(z["x"].size)
            assert list(z["solar"]) == [9, int(p.stem.split("_")[1])]
    assert 2048 <= min(sizes) < max(sizes) <= 6144 and len(set(sizes)) > 32, sizes
    v = run(SOLAR, "verify", f"{data}/*.npz", "--labels", "", "--no-progress")
    assert "verified 64 .npz samples" in v.stdout and "all match" in v.stdout, v.stdout
    # The generator is deterministic: the same seed, the same files.
    again = tmp_path / "again"
    run(SOLAR, "gen", again, "--layout", "npz", "--samples", "64", "--preset", "tiny",
        "--seed", "9", "--no-progress")
    assert all((again / p.name).read_bytes() == p.read_bytes() for p in files)
    solar = plain_and_solar(tmp_path, script, data, "npz", "--buffer", "64%", workers=2)
    hits, _ = served(solar.stderr)
    assert hits > 0, solar.stderr
    # A changed byte of x (its CRC made to match: np.load would take it) and two files
    # swapped: both named.
    broken = tmp_path / "broken"
    shutil.copytree(data, broken)
    with np.load(broken / "case_00003.npz") as z:
        x, y, meta = z["x"].copy(), z["y"], z["solar"]
    x[7] ^= 1
    np.savez(broken / "case_00003.npz", x=x, y=y, solar=meta)
    os.rename(broken / "case_00005.npz", broken / "tmp.npz")
    os.rename(broken / "case_00006.npz", broken / "case_00005.npz")
    os.rename(broken / "tmp.npz", broken / "case_00006.npz")
    v = run(SOLAR, "verify", f"{broken}/*.npz", "--labels", "", "--no-progress", check=False)
    assert v.returncode == 1, v.stdout + v.stderr
    assert "MISMATCH: 3 sample(s)" in v.stdout and "3, 5, 6" in v.stdout, v.stdout
    # Refusals name the fix.
    r = run(SOLAR, "gen", tmp_path / "x", "--layout", "gzip", "--samples", "4", "--size-spread",
            "10", check=False)
    assert r.returncode == 2 and "--size-spread" in r.stderr and "npz" in r.stderr, r.stderr
    r = run(SOLAR, "gen", data, "--layout", "npz", "--samples", "4", check=False)
    assert r.returncode == 2 and "--force" in r.stderr, r.stderr
