# SPDX-License-Identifier: Apache-2.0
"""solar_spank.so on the test cluster over a dataset of many files (issue 35): the SOLAR
artifact's CosmoFlow layout from `solar gen --layout per-sample-files` (one HDF5 file a sample in
folders of 64, `/split` + `/unitPar` float32[4]). srun lists and checks the files once (`solar
dataset-info --index-out`), keeps the index in the step's folder as dataset.index, names it to
the ranks ($SOLAR_DATASET_INDEX) and to each agent (--dataset-index); both modes read through it:
solar's own reader (solar-example-train --verify, every byte and label checked) and an unmodified
h5py script that opens and closes a file in every __getitem__ (--solar-transparent, its batches
compared bit for bit with the same script under plain srun). Fixtures in conftest.py (after each
test: no agent left, plan_dir and runtime_dir empty, nothing of solar's in /dev/shm)."""
import glob
import json
import os
import re
import subprocess
import sys

import pytest

from slurm_cluster import SOLAR, TRAIN

if os.geteuid() != 0:
    pytest.skip("the test cluster needs root (slurmd starts jobs as their users)",
                allow_module_level=True)

SAMPLES = 128  # two universes of 64 one-sample files, a folder each
EPOCHS = 2
PY = sys.executable if sys.executable.startswith("/usr/bin/") else "/usr/bin/python3"

# Run as each rank in place of solar-example-train: records what the plugin gave the rank
# (SOLAR_DATASET_INDEX) and its node's agent (--dataset-index, found by the rank's SOLAR_SOCKET
# in the agent's command line), then becomes solar-example-train. Everything it sees is
# printed as one JSON line, CHECK {...}, for the test to assert on.
RANK_PROBE = r"""
import json, os, stat, sys
index = os.environ.get("SOLAR_DATASET_INDEX", "")
seen = {"rank": os.environ.get("SLURM_PROCID"), "index": index, "plan": os.environ["SOLAR_PLAN"]}
try:
    st = os.lstat(index)
    seen["index_mode"] = oct(stat.S_IMODE(st.st_mode)) if stat.S_ISREG(st.st_mode) else "not a file"
    with open(index) as f:
        seen["index_head"] = f.readline().strip()
except OSError as e:
    seen["index_mode"] = f"error {e.errno}"
sock = os.environ.get("SOLAR_SOCKET", "")
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode(errors="replace").split("\0")
    except OSError:
        continue
    if sock and "--socket" in argv and argv[argv.index("--socket") + 1] == sock:
        seen["agent_index"] = argv[argv.index("--dataset-index") + 1] \
            if "--dataset-index" in argv else None
print("CHECK " + json.dumps(seen), flush=True)
os.execv(sys.argv[1], sys.argv[1:])
"""

# The unmodified script: the SOLAR artifact's CosmoFlow reader (a file opened and closed per
# sample, over the sorted file list), DistributedSampler, DataLoader. Nothing in it knows about
# solar. Per batch it writes the SHA-256 of its inputs and labels.
FILES_DDP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                         "slurm_examples", "train_h5py_files_ddp.py")


@pytest.fixture(scope="module")
def files_dataset(cluster):
    out = os.path.join(cluster.root, "universes")
    subprocess.run([SOLAR, "gen", out, "--layout", "per-sample-files", "--samples", str(SAMPLES),
                    "--preset", "tiny", "--seed", "4", "--universes-per-dir", "1",
                    "--no-progress"], check=True, capture_output=True, timeout=120)
    for d, _, files in os.walk(out):
        os.chmod(d, 0o755)
        for name in files:
            os.chmod(os.path.join(d, name), 0o644)
    assert len(glob.glob(os.path.join(out, "*", "*.hdf5"))) == SAMPLES
    return out


def srun(cluster, tmpdir, *args):
    """srun with its own TMPDIR (where it writes the index through a private folder), so the
    test sees that nothing of solar's is left there, and the user's index cache in the
    cluster's scratch folder (`solar dataset-info` keeps each listing there, by default in
    ~/.cache/solar: each test cluster's dataset would add one to root's home)."""
    os.makedirs(tmpdir, exist_ok=True)
    env = dict(cluster.env, TMPDIR=tmpdir,
               SOLAR_INDEX_CACHE=os.path.join(cluster.root, "index-cache"))
    return subprocess.run(["srun", *args], env=env,
                          capture_output=True, text=True, timeout=300, cwd=cluster.root)


def many_files_args(data, *extra):
    return [f"--solar-dataset={data}/:/split", "--solar-labels=/unitPar",
            f"--solar-epochs={EPOCHS}", "--solar-batch=4", *extra]


def read_stats(path):
    with open(path) as f:
        st = json.load(f)
    os.unlink(path)
    assert [n["node"] for n in st["nodes"]] == [0, 1], st
    for n in st["nodes"]:
        assert "missing" not in n, n
    return st


def test_verify_over_many_files_through_the_step_folders_index(cluster, files_dataset):
    """2 nodes x 2 ranks, solar-example-train --verify over the per-sample files (the folder
    named relative to where srun runs, as users type it): every sample and label checked by
    every rank, served by both agents; each rank's SOLAR_DATASET_INDEX and each agent's
    --dataset-index name the same dataset.index, a 0600 file in the step's own folder holding
    the files' index while the step runs, and it goes with the step."""
    tmpdir = os.path.join(cluster.root, "tmp-verify")
    stats = os.path.join(cluster.root, "files-verify.json")
    probe = os.path.join(cluster.root, "rank_probe.py")
    with open(probe, "w") as f:
        f.write(RANK_PROBE)
    # The folder as a user names it from where they submit (srun's working folder): relative.
    rel = os.path.relpath(files_dataset, cluster.root)
    p = srun(cluster, tmpdir, "-N2", "--ntasks-per-node=2",
             *many_files_args(rel, "--solar-buffer=40%", "--solar-verbose",
                              f"--solar-stats={stats}"),
             PY, probe, TRAIN, "--verify")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count("verified (0 wrong), from the node agent") == 4, out
    assert out.count("agent ready in") == 2, out
    hits = {int(n): int(h) for n, h in re.findall(r"solar: node (\d): (\d+) hits", out)}
    assert set(hits) == {0, 1} and all(h > 0 for h in hits.values()), out

    checks = [json.loads(l[len("CHECK "):]) for l in p.stdout.splitlines()
              if l.startswith("CHECK ")]
    assert sorted(c["rank"] for c in checks) == ["0", "1", "2", "3"], out
    folders = {os.path.dirname(c["plan"]) for c in checks}
    assert len(folders) == 1, checks
    [folder] = folders
    assert os.path.dirname(folder) == cluster.plans, folder
    for c in checks:
        assert c["index"] == os.path.join(folder, "dataset.index"), c
        assert c["index_mode"] == "0o600", c
        assert c["index_head"], c  # the index's header line: read, not empty
        assert c["agent_index"] == c["index"], c
    # The step's folder (with the index) and srun's private scratch folder are gone.
    assert not os.path.exists(folder)
    assert os.listdir(tmpdir) == [], os.listdir(tmpdir)

    st = read_stats(stats)
    for n in st["nodes"]:
        assert len(n["epochs"]) == EPOCHS, n
        served = sum(e["samples_served"] for e in n["epochs"])
        assert served == sum(e["hits"] + e["fetched_samples"] for e in n["epochs"]) > 0, n
    # Every sample served once per epoch across the two nodes.
    assert sum(e["samples_served"] for n in st["nodes"] for e in n["epochs"]) == EPOCHS * SAMPLES


@pytest.fixture(scope="module")
def plain_digests(cluster, files_dataset):
    """The unmodified script under plain srun (2 nodes x 2 ranks): its per-batch digests."""
    script = FILES_DDP
    out_dir = os.path.join(cluster.root, "files-ddp")
    os.makedirs(out_dir, exist_ok=True)
    p = srun(cluster, os.path.join(cluster.root, "tmp-plain"), "-N2", "--ntasks-per-node=2",
             PY, script, files_dataset, "--epochs", str(EPOCHS), "--batch", "4", "--seed", "3",
             "--digests", os.path.join(out_dir, "plain-%r.txt"))
    assert p.returncode == 0, p.stdout + p.stderr
    digests = {}
    for r in range(4):
        with open(os.path.join(out_dir, f"plain-{r}.txt")) as f:
            digests[r] = f.read()
        assert digests[r].count("\n") == EPOCHS * SAMPLES // 4 // 4, digests[r]
    return script, out_dir, digests


@pytest.mark.parametrize("workers", [0, 2])
def test_unmodified_script_opening_a_file_per_sample_transparent_same_bytes(
        cluster, files_dataset, plain_digests, workers):
    """srun --solar-transparent over the per-sample files: the script that opens and closes a
    file in every __getitem__ (in the rank, or in 2 DataLoader workers) gets the plain run's
    batches bit for bit, its reads of the files served from the agents' buffers (both nodes'
    --solar-stats count served reads and the files' opens)."""
    script, out_dir, want = plain_digests
    tmpdir = os.path.join(cluster.root, f"tmp-transparent-{workers}")
    stats = os.path.join(cluster.root, f"files-transparent-{workers}.json")
    tag = f"solar{workers}"
    p = srun(cluster, tmpdir, "-N2", "--ntasks-per-node=2",
             *many_files_args(files_dataset, "--solar-buffer=64%", "--solar-seed=3",
                              "--solar-transparent", "--solar-verbose",
                              f"--solar-stats={stats}"),
             PY, script, files_dataset, "--epochs", str(EPOCHS), "--batch", "4", "--seed", "3",
             "--workers", str(workers), "--digests", os.path.join(out_dir, f"{tag}-%r.txt"))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(4):
        with open(os.path.join(out_dir, f"{tag}-{r}.txt")) as f:
            assert f.read() == want[r], f"rank {r}: batches differ from plain srun's"
    served = [int(n) for n in re.findall(r"file reads served from the buffer (\d+)", out)]
    assert len(served) == 2 and sum(served) > 0, out
    st = read_stats(stats)
    x = [n["transparent"] for n in st["nodes"]]
    assert sum(t["hit_reads"] for t in x) > 0, x
    # Every sample's file opened by the script once per epoch (by the rank or a worker).
    assert sum(t["opens"] for t in x) == EPOCHS * SAMPLES, x
    assert os.listdir(tmpdir) == [], os.listdir(tmpdir)


@pytest.fixture(scope="module")
def npz_dataset(cluster):
    """MLPerf Storage's UNet3D layout in small (issue 36): 64 npz files, one sample each, of
    32 KiB +- 50% (np.savez: float32 `x` of its own length, int32 `y`)."""
    import numpy as np
    out = os.path.join(cluster.root, "npz")
    os.makedirs(out, mode=0o755)
    rng = np.random.default_rng(6)
    for i in range(64):
        n = int(rng.integers(1 << 12, 3 << 12))
        path = os.path.join(out, f"case_{i:05d}.npz")
        np.savez(path, x=rng.standard_normal(n, dtype=np.float32), y=np.array([i], np.int32))
        os.chmod(path, 0o644)
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_npz_files_read_with_np_load_transparent_same_bytes(cluster, npz_dataset, workers):
    """srun --solar-transparent, 2 nodes x 2 ranks, over whole-file samples of differing sizes
    that the unmodified script reads with np.load (zipfile's read(2)s at the file's position):
    the batches of plain srun bit for bit, reads served from both nodes' buffers."""
    out_dir = os.path.join(cluster.root, "npz-ddp")
    os.makedirs(out_dir, exist_ok=True)
    script_args = [PY, FILES_DDP, npz_dataset, "--layout", "npz", "--epochs", str(EPOCHS),
                   "--batch", "4", "--seed", "3", "--workers", str(workers)]
    plain = srun(cluster, os.path.join(cluster.root, "tmp-npz-plain"), "-N2",
                 "--ntasks-per-node=2", *script_args, "--digests",
                 os.path.join(out_dir, f"plain{workers}-%r.txt"))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    tmpdir = os.path.join(cluster.root, f"tmp-npz-{workers}")
    p = srun(cluster, tmpdir, "-N2", "--ntasks-per-node=2",
             f"--solar-dataset={npz_dataset}/*.npz", "--solar-labels=", f"--solar-epochs={EPOCHS}",
             "--solar-batch=4", "--solar-buffer=64%", "--solar-seed=3", "--solar-transparent",
             "--solar-verbose", *script_args, "--digests",
             os.path.join(out_dir, f"solar{workers}-%r.txt"))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(4):
        with open(os.path.join(out_dir, f"plain{workers}-{r}.txt")) as f:
            want = f.read()
        assert want.count("\n") == EPOCHS * 64 // 4 // 4, want
        with open(os.path.join(out_dir, f"solar{workers}-{r}.txt")) as f:
            assert f.read() == want, f"rank {r}: batches differ from plain srun's"
    served = [int(n) for n in re.findall(r"file reads served from the buffer (\d+)", out)]
    assert len(served) == 2 and sum(served) > 0, out
    assert os.listdir(tmpdir) == [], os.listdir(tmpdir)


def test_whole_dataset_resident_no_sample_byte_from_the_files(cluster, files_dataset,
                                                              plain_digests):
    """Both nodes holding every sample their ranks read (64M: several times the 512 KiB
    dataset), the script starting once its node's agent has read all of them (polling `solar
    stat`): every read of every file, the sample's bytes and the HDF5 metadata h5py reads at
    each open, is served from the buffer; nothing falls through to the files."""
    script, out_dir, want = plain_digests
    wrapper = os.path.join(cluster.root, "wait-then-train.sh")
    with open(wrapper, "w") as f:
        f.write("#!/bin/sh\n"
                "tries=0\n"  # bounded: a wrapper left looping would outlive a failed step
                f"until {SOLAR} stat \"$SOLAR_SOCKET\" --json | {PY} -c "
                "'import json,sys; s=json.load(sys.stdin); "
                "sys.exit(s[\"ready_steps\"] < s[\"total_steps\"])'"
                "; do tries=$((tries + 1)); if [ $tries -gt 2400 ]; then\n"
                "  echo \"wait-then-train: the agent did not read every sample within 120 s\" >&2;"
                " exit 1\nfi; sleep 0.05; done\nexec \"$@\"\n")
    os.chmod(wrapper, 0o755)
    stats = os.path.join(cluster.root, "files-resident.json")
    p = srun(cluster, os.path.join(cluster.root, "tmp-resident"), "-N2", "--ntasks-per-node=2",
             *many_files_args(files_dataset, "--solar-buffer=64M", "--solar-seed=3",
                              "--solar-transparent", "--solar-verbose",
                              f"--solar-stats={stats}"),
             wrapper, PY, script, files_dataset, "--epochs", str(EPOCHS), "--batch", "4",
             "--seed", "3", "--workers", "2", "--digests", os.path.join(out_dir, "resident-%r.txt"))
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for r in range(4):
        with open(os.path.join(out_dir, f"resident-{r}.txt")) as f:
            assert f.read() == want[r], f"rank {r}: batches differ from plain srun's"
    served = re.findall(r"node \d: file reads served from the buffer (\d+)"
                        r"(?: \(.*?\))?, fallen through (\d+)", out)
    assert len(served) == 2 and all(int(h) > 0 and int(m) == 0 for h, m in served), out
    st = read_stats(stats)
    for n in st["nodes"]:
        x = n["transparent"]
        assert x["hit_reads"] > 0 and x["miss_reads"] == 0 and x["miss_bytes"] == 0, n


def test_a_listing_that_does_not_finish_is_stopped_naming_the_timeout(cluster):
    """The dataset is listed before anything is allocated, by `solar dataset-info` under the
    plugin's timeout=: a list that never ends (here a FIFO nobody writes, as a hung file system
    would hold the open) stops srun within the limit, with one line saying the listing was
    stopped and that timeout= is what the admin raises, not solar=; nothing ran."""
    import time
    fifo = os.path.join(cluster.root, "list.fifo")
    os.mkfifo(fifo, 0o644)
    try:
        cluster.plugstack("timeout=1")
        t0 = time.monotonic()
        p = srun(cluster, os.path.join(cluster.root, "tmp-fifo"), "-N1",
                 f"--solar-dataset=@{fifo}:/split", "--solar-labels=/unitPar",
                 "--solar-buffer=40%", "--solar-epochs=1", "--solar-batch=4", "echo", "RAN")
        took = time.monotonic() - t0
    finally:
        os.unlink(fifo)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "RAN" not in p.stdout, p.stdout
    lines = [l for l in p.stderr.splitlines() if "error: solar: " in l]
    assert len(lines) == 1, p.stderr
    assert "--solar-dataset" in lines[0] and "did not finish" in lines[0] and \
        "timeout= in plugstack.conf" in lines[0] and "solar=" not in lines[0], lines[0]
    assert took < 30, took  # 1 s and the kill's reap, not the listing's own end
    assert os.listdir(os.path.join(cluster.root, "tmp-fifo")) == []
    assert not cluster.jobs()

