#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""I/O evaluation in the SOLAR artifact's format: the PyTorch DataLoader (h5py Dataset,
DistributedSampler) against solar.torch.Loader and against the same unmodified DataLoader
under solar's transparent mode (libsolar_preload.so), same HDF5 file, same ranks, same run.

    /usr/bin/python3 bench/pytorch_io.py                 # 800 samples, 4 ranks, b=16, 3 epochs
    /usr/bin/python3 bench/pytorch_io.py --workers 0,2,4 --samples 800 --preset small
    /usr/bin/python3 bench/pytorch_io.py --throttle 400M,2000      # emulated shared storage
    /usr/bin/python3 bench/pytorch_io.py --nodes 4 --ranks 1 --buffer 26% --epochs 5 \
        --throttle 400M,2000
    /usr/bin/python3 bench/pytorch_io.py --nodes 4 --ranks 1 --buffer 26% --epochs 5 \
        --throttle 400M,2000 --modes baseline,transparent --peers     # buffers shared
    /usr/bin/python3 bench/pytorch_io.py --layout per-sample-files --samples 400 \
        --throttle 400M,2000 --workers 0           # the artifact's layout: one file a sample

--throttle BPS[,IOPS] runs every mode inside one blkio cgroup capped at that read bandwidth
(and IOPS) on the disk holding the dataset (root; cgroup v1 blkio, as bench/slow_storage.py): the
page cache is dropped at every epoch start, so every loader reads "remote" storage at the
cap; the agents read with O_DIRECT there (solar run --direct-io), since simulated nodes share
one page cache and one node's fetch would otherwise be another's free hit. Each solar mode's
limit is the ratio the cap allows it: bytes the plain DataLoader reads
/ bytes its plan fetches (solar's own assignment for solar.torch.Loader; the script's
DistributedSampler assignment for the transparent mode).

The defaults keep the artifact's ratios (800 samples, 4 ranks, batch 16, 3 epochs, buffer 64%
of the dataset) with 256 KiB samples so it runs in minutes on 2 cores. Every rank runs under
`solar run` (which sets RANK/WORLD_SIZE/MASTER_*); the baseline runs with --no-agent and ignores
the SOLAR_* variables. Storage is cold at every epoch start (posix_fadvise DONTNEED on the file,
after a barrier): the dataset stands for one on remote storage, not in the page cache. The
baseline is tried with each --workers value and its best total is the one compared.
Data-loading time = time a rank waits for its batches; per epoch, the slowest rank's.

--layout per-sample-files reads the SOLAR artifact's CosmoFlow layout instead of one file:
`solar gen --layout per-sample-files` (a folder of one HDF5 file per sample, /split and
/unitPar float32[4]), and the rank script is the artifact's: paths = the sorted file list, and
every __getitem__ opens and closes one file (`with h5py.File(path) as f: x = f['split'][:];
y = f['unitPar'][:]`); solar.torch.Loader reads DIR/:/split with labels /unitPar. Cold
storage then drops every file's pages at each epoch start.

--layout npz reads MLPerf Storage's UNet3D layout in small: a folder of one .npz a sample
(np.savez: float32 `x` of --npz-mean bytes +-50%, uniformly spread, int32 `y`), read with
np.load in every __getitem__; solar serves them as whole-file samples ('DIR/*.npz') in the
transparent mode only, its buffer holding each file in its own bytes, and the limit is by
bytes: the bytes the plain script reads / the bytes the plan fetches (its stats file).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import slow_storage  # noqa: E402  (scripts/slow-storage: the emulated shared storage)


# --- driver helpers (also used by pytorch_e2e.py) ------------------------------------------------
def find_build(build):
    """(solar tool, libsolar.so) of a build directory."""
    for b in ([build] if build else []) + [os.path.join(REPO, d) for d in ("build", "build-py")]:
        tool, lib = os.path.join(b, "cli", "solar"), os.path.join(b, "client", "libsolar.so")
        if os.access(tool, os.X_OK) and os.path.exists(lib) and \
                os.path.exists(os.path.join(b, "agent", "solar-agent")):
            return os.path.abspath(tool), os.path.abspath(lib)
    sys.exit("pytorch bench: no build with cli/solar, client/libsolar.so and agent/solar-agent; "
             "build first (scripts/build) or pass --build DIR")


# The SOLAR artifact's CosmoFlow layout (--layout per-sample-files): each file one sample.
ARTIFACT_ARRAY, ARTIFACT_LABELS = "split", "unitPar"
# The files solar takes from a directory (storage/src/dataset_files.cpp), in its order.
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")


def data_files(path):
    """The HDF5 files of a dataset path: the file itself, or a directory's files below it in
    sorted path order, which is solar's global sample order (and the order of the artifact's
    sorted file list); a folder of .npz files: those, sorted."""
    if not os.path.isdir(path):
        return [path]
    npz = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".npz"))
    if npz:
        return npz
    return sorted(os.path.join(d, n) for d, _, names in os.walk(path) for n in names
                  if n.endswith(HDF5_SUFFIXES))


def write_npz(path, samples, mean_bytes, seed):
    """--layout npz (and au.py's UNet3D-like workload): one .npz a sample, float32 `x` of
    mean_bytes +-50% (uniform), int32 `y`."""
    os.makedirs(path)
    rng = np.random.default_rng(seed)
    for i in range(samples):
        n = int(rng.integers(mean_bytes // 8, mean_bytes * 3 // 8 + 1))
        np.savez(os.path.join(path, f"case_{i:05d}.npz"),
                 x=rng.standard_normal(n, dtype=np.float32), y=np.array([i], dtype=np.int32))
    return path


def drop_cache(path):
    """Cold storage: drops the page cache of the dataset's file, or of every file of a
    directory."""
    for f in data_files(path):
        slow_storage.evict(f)


_SRUN_RANK = ('RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS '
              'MASTER_ADDR=127.0.0.1 MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000)) exec "$@"')


def make_throttle(spec, path):
    """--throttle BPS[,IOPS]: slow_storage.Throttle on the disk holding `path`, or None."""
    if not spec:
        return None
    bps, _, iops = spec.partition(",")
    try:
        return slow_storage.Throttle(path, slow_storage.parse_size(bps, "--throttle"),
                                     int(iops) if iops else None)
    except (slow_storage.Unavailable, ValueError) as e:
        sys.exit(f"pytorch bench: --throttle {spec}: {e}")


THROTTLE = None


def solar_run(tool, dataset, a, rank_argv, extra=()):
    """Runs the rank program under `solar run`, or under `srun --solar-*` with --launcher srun
    (baseline: plain srun); returns its combined output."""
    no_agent = "--no-agent" in extra
    transparent = "--transparent" in extra
    rank_argv = [*rank_argv, "--data", dataset]
    if a.launcher == "srun":
        solar = [] if no_agent else [
            f"--solar-dataset={dataset}", f"--solar-buffer={a.buffer}",
            *([f"--solar-labels={a.labels}"] if getattr(a, "labels", None) else []),
            f"--solar-epochs={a.epochs}", f"--solar-batch={a.batch}", f"--solar-seed={a.seed}",
            "--solar-order=torch", "--solar-verbose",
            *(["--solar-transparent"] if transparent else [])]
        cmd = ["srun", "-N", str(a.nodes), f"--ntasks-per-node={a.ranks}", *solar, "bash", "-c",
               _SRUN_RANK, "rank", sys.executable, *rank_argv]
    else:
        cmd = [tool, "run", "--ranks-per-node", str(a.ranks), "--nodes", str(a.nodes),
               "--dataset", dataset,
               *(["--labels", a.labels] if getattr(a, "labels", None) else []),
               "--buffer", a.buffer, "--epochs", str(a.epochs), "--batch", str(a.batch),
               "--seed", str(a.seed), *([] if "unknown" in extra else ["--order", "torch"]),
               *extra,
               *([] if no_agent else ["-v"]),
               *(["--zero-copy"] if a.zero_copy and not no_agent and not transparent else []),
               # Peer sharing: the agents read each other's buffers over the fabric (loopback
               # here: uncapped, as a cluster's interconnect next to its shared storage).
               *(["--peers"] if getattr(a, "peers", False) and not no_agent else []),
               # Emulated nodes share this machine's page cache: under the cap, agents read
               # with O_DIRECT so that one node's fetch does not become another's free hit.
               *(["--direct-io"] if THROTTLE and not no_agent else []),
               "--", sys.executable, *rank_argv]
    p = subprocess.run(cmd, capture_output=True, text=True,
                       preexec_fn=THROTTLE.enter if THROTTLE else None)
    if p.returncode != 0:
        sys.exit(f"pytorch bench: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr


def gather(outdir, ranks):
    """Per-epoch maximum over ranks of each list in the ranks' JSON reports."""
    reports = []
    for r in range(ranks):
        with open(os.path.join(outdir, f"rank-{r}.json")) as f:
            reports.append(json.load(f))
    return {k: [max(rep[k][e] for rep in reports) for e in range(len(reports[0][k]))]
            for k in reports[0] if isinstance(reports[0][k], list)} | {
        "rank0": reports[0], "agent_ranks": sum(bool(rep.get("agent")) for rep in reports)}


def median_run(runs, total=sum):
    """The run of median total (the upper one of an even count) among repeated runs."""
    return sorted(runs, key=total)[len(runs) // 2]


PLAN = None


def planned(log):
    """(remote fetches, accesses) of the plan a solar run or srun --solar-verbose reports."""
    import re
    m = re.search(r"(\d+) remote fetches for (\d+) accesses", log)
    return (int(m.group(1)), int(m.group(2))) if m else None


def stored_bytes(tool, spec):
    """The dataset's bytes as its samples are stored (compressed chunks), from `solar
    dataset-info`: what the transparent mode buffers and plans by; None for raw samples."""
    p = subprocess.run([tool, "dataset-info", spec], capture_output=True, text=True)
    if p.returncode != 0:
        return None
    info = json.loads(p.stdout)
    if info.get("stored_sizes"):
        return sum(info["stored_sizes"])
    if info.get("stored_sample_bytes"):
        return info["stored_sample_bytes"] * info["samples"]
    return None


def last(xs):
    return xs[-1] if xs else None


def served_per_node(stats_path):
    """Each node's transparent-mode counters from `solar run --stats-out`: [{node, served
    (fraction of the interposer's reads served from the buffer), miss_bytes, waited_reads}],
    or [] when the file is missing (srun)."""
    if not os.path.exists(stats_path):
        return []
    out = []
    for n in json.load(open(stats_path))["nodes"]:
        t = n.get("transparent") or {}
        reads = t.get("hit_reads", 0) + t.get("miss_reads", 0)
        out.append({"node": n["node"], "served": t.get("hit_reads", 0) / reads if reads else 0.0,
                    "miss_bytes": t.get("miss_bytes", 0),
                    "waited_reads": t.get("waited_reads", 0),
                    "waited_seconds": t.get("waited_seconds", 0),
                    "cpu_seconds": n.get("cpu_seconds") or 0,
                    # per epoch: the interposer's counts and how far ahead the agent was
                    "epochs": [{"file_reads": e.get("file_reads"), "lead": e.get("lead")}
                               for e in n.get("epochs", [])]})
    return out


def fmt_list(xs):
    return "[" + ", ".join(f"{x:.4f}" for x in xs) + "]"


def add_common_args(ap):
    ap.add_argument("--samples", type=int, default=800)
    ap.add_argument("--preset", default="small", help="solar gen preset [small: 256 KiB int16]")
    ap.add_argument("--ranks", type=int, default=4, help="ranks per node [4]")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--buffer", default="64%", help="solar's buffer per node [64%%]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--build", help="build directory with cli/solar, client/libsolar.so")
    ap.add_argument("--dataset", help="use this HDF5 file instead of generating one")
    ap.add_argument("--launcher", choices=["solar-run", "srun"], default="solar-run",
                    help="start the ranks with `solar run` (one machine) or with `srun "
                         "--solar-*` on a Slurm cluster with solar's plugin (SLURM_CONF as "
                         "usual; the baseline runs under plain srun) [solar-run]")
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--throttle", metavar="BPS[,IOPS]",
                    help="emulated shared storage: cap reads of the dataset's disk, e.g. "
                         "400M,2000 (blkio cgroup; root)")
    ap.add_argument("--zero-copy", action="store_true",
                    help="solar run's agents hand out cache slots (no per-rank rings)")
    ap.add_argument("--rank", choices=["baseline", "solar"], help=argparse.SUPPRESS)
    ap.add_argument("--warm", action="store_true", help=argparse.SUPPRESS)  # rank: keep cache
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--library", help=argparse.SUPPRESS)


def make_dataset(tool, a, tmp, name="data.h5", samples=None, seed=0):
    if a.dataset and name == "data.h5":
        return a.dataset
    if getattr(a, "layout", None) == "npz":
        return write_npz(os.path.join(tmp, name.removesuffix(".h5")), samples or a.samples,
                         a.npz_mean, seed)
    many = getattr(a, "layout", None) == "per-sample-files"
    path = os.path.join(tmp, name.removesuffix(".h5") if many else name)
    subprocess.run([tool, "gen", path, "--samples", str(samples or a.samples), "--preset",
                    a.preset, "--seed", str(seed), "--no-progress",
                    *(["--layout", "per-sample-files"] if many else [])], check=True,
                   capture_output=True)
    return path


# --- rank side -----------------------------------------------------------------------------------
class H5Samples:
    """The Dataset users write: one h5py read per sample, the file opened once per worker."""

    def __init__(self, path):
        import h5py
        self.path = path
        with h5py.File(path, "r") as f:
            self.n = len(f["data"])
        self.f = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import h5py
        import torch
        if self.f is None:
            self.f = h5py.File(self.path, "r")
        return torch.from_numpy(self.f["data"][i]), int(self.f["label"][i])


class H5Files:
    """The SOLAR artifact's Dataset (Cosmoflow): one file per sample, opened and closed in every
    __getitem__; paths are the sorted file list."""

    def __init__(self, root):
        self.paths = data_files(root)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import h5py
        import torch
        with h5py.File(self.paths[i], "r") as f:
            x = f[ARTIFACT_ARRAY][:]
            y = f[ARTIFACT_LABELS][:]
        return torch.from_numpy(x), torch.from_numpy(y)


class NpzFiles:
    """MLPerf Storage's UNet3D Dataset in small: one .npz a sample, np.load in __getitem__."""

    def __init__(self, root):
        self.paths = data_files(root)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch
        with np.load(self.paths[i]) as z:
            x, y = z["x"], z["y"]
        return torch.from_numpy(x).sum(), torch.from_numpy(y)  # sizes differ: no stacking


def baseline_loader(path, a, rank, world):
    import torch.utils.data as tud
    npz = os.path.isdir(path) and data_files(path)[0].endswith(".npz")
    ds = NpzFiles(path) if npz else H5Files(path) if os.path.isdir(path) else H5Samples(path)
    sampler = tud.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                     seed=a.seed)
    loader = tud.DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers)
    return sampler, loader


def rank_setup(a):
    """torch.distributed over gloo (barriers, loss averaging); returns (rank, world)."""
    if a.library:
        os.environ["SOLAR_LIBRARY"] = a.library  # solar run passes no SOLAR_* of ours through
    sys.path.insert(0, os.path.join(REPO, "python"))
    import torch.distributed as dist
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def dataset_path(a=None):
    if a is not None and a.data:
        spec = a.data
    else:
        spec = os.environ["SOLAR_DATASET"]
    if spec.endswith("/*.npz"):  # --layout npz: the folder of the glob
        return spec[:-len("/*.npz")]
    head, sep, tail = spec.rpartition(":")
    return head if sep and tail.startswith("/") else spec


def make_loader(a, rank, world):
    """(set_epoch, iterable) of the loader this rank measures."""
    path = dataset_path(a)
    if a.rank == "baseline":
        sampler, loader = baseline_loader(path, a, rank, world)
        return sampler.set_epoch, loader, (lambda batch: (batch[0], batch[1], 1.0))
    import solar.torch
    loader = solar.torch.Loader()
    a.using_agent = loader.using_agent
    return loader.set_epoch, loader, (lambda batch: (batch.data, batch.labels, batch.weight))


def rank_main(a):
    import torch.distributed as dist
    rank, world = rank_setup(a)
    set_epoch, loader, unpack = make_loader(a, rank, world)
    path = dataset_path(a)
    load = [0.0] * a.epochs
    samples = 0
    for epoch in range(a.epochs):
        set_epoch(epoch)
        dist.barrier()
        if rank == 0 and not a.warm:
            drop_cache(path)
        dist.barrier()
        t = time.perf_counter()
        for batch in loader:
            x, y, _ = unpack(batch)
            load[epoch] += time.perf_counter() - t
            samples += len(x)
            t = time.perf_counter()
    with open(os.path.join(a.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"load": load, "samples": samples,
                   "agent": bool(getattr(a, "using_agent", False))}, f)
    dist.destroy_process_group()


# --- driver --------------------------------------------------------------------------------------
def sample_bytes_of(path):
    import h5py
    if os.path.isdir(path) and data_files(path)[0].endswith(".npz"):  # their mean
        files = data_files(path)
        return sum(os.path.getsize(f) for f in files) // len(files)
    if os.path.isdir(path):  # one file a sample: its whole array
        with h5py.File(data_files(path)[0], "r") as f:
            d = f[ARTIFACT_ARRAY]
            return int(d.dtype.itemsize * max(1, int(np.prod(d.shape))))
    with h5py.File(path, "r") as f:
        d = f["data"]
        return int(d.dtype.itemsize * max(1, int(np.prod(d.shape[1:]))))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(ap)
    ap.add_argument("--workers", default="0,1,2,4",
                    help="DataLoader num_workers values to try for the baseline [0,1,2,4]")
    ap.add_argument("--repeat", type=int, default=5,
                    help="run every mode this many times, in rotation (baseline, transparent, "
                         "solar, baseline, ...), and report each rotation's ratio with the "
                         "median and the worst of them; the per-epoch figures shown are the "
                         "runs of median total (this machine is noisy) [5]")
    ap.add_argument("--modes", default="baseline,transparent,solar",
                    help="which loaders to run (baseline is always run); `floor` adds the "
                         "plain script with the dataset already in the page cache and never "
                         "dropped: the script's own cost (h5py, collate), which no loader that "
                         "serves the script's file reads can beat [baseline,transparent,solar]")
    ap.add_argument("--script-seed", type=int,
                    help="the seed the rank script's DistributedSampler shuffles with in the "
                         "transparent mode [--seed]: another one is an order solar is not told "
                         "(its plan, made with --seed, is then wrong in every step)")
    ap.add_argument("--order-unknown", action="store_true",
                    help="the transparent mode runs with solar run --order unknown (demand "
                         "mode from the start: the agents keep what the ranks read)")
    ap.add_argument("--peers", action="store_true",
                    help="agents share their buffers (solar run --peers; several --nodes)")
    ap.add_argument("--json", metavar="FILE",
                    help="also write every figure (per-epoch times, limits, bytes each mode "
                         "read from the disk under --throttle) here, for bench/sweep and "
                         "solar report")
    ap.add_argument("--npz-mean", type=int, default=256 << 10,
                    help="--layout npz: the files' mean array bytes (+-50%%) [262144]")
    ap.add_argument("--layout", choices=["file", "per-sample-files", "npz"], default="file",
                    help="the dataset: one HDF5 file of --samples samples, or the SOLAR "
                         "artifact's folder of one file per sample (solar gen --layout "
                         "per-sample-files: /split, /unitPar; the rank script opens and closes "
                         "a file in every __getitem__) [file]")
    a = ap.parse_args()
    if a.rank:
        a.workers = int(a.workers)
        return rank_main(a)
    if a.repeat < 1:
        sys.exit("pytorch_io: --repeat must be at least 1")
    modes = [m for m in a.modes.split(",") if m]
    if not set(modes) <= {"baseline", "transparent", "solar", "floor"}:
        sys.exit(f"pytorch_io: --modes {a.modes}: choose from baseline, transparent, solar, "
                 f"floor")
    many = a.layout in ("per-sample-files", "npz")
    npz = a.layout == "npz"
    if npz and (set(modes) & {"solar"}):
        sys.exit("pytorch_io: --layout npz: whole-file samples are served in the transparent "
                 "mode only; --modes baseline,transparent[,floor]")
    if many and a.dataset and not os.path.isdir(a.dataset):
        sys.exit(f"pytorch_io: --layout per-sample-files --dataset {a.dataset}: give the folder "
                 f"of per-sample files (solar gen OUT --layout per-sample-files)")
    a.labels = "/" + ARTIFACT_LABELS if many and not npz else None
    tool, lib = find_build(a.build)
    tmp = tempfile.mkdtemp(prefix="solar-bench-", dir=os.environ.get("SOLAR_BENCH_DIR"))
    global THROTTLE
    try:
        path = make_dataset(tool, a, tmp)
        if many:  # solar's index cache of a throwaway dataset goes with it
            os.environ.setdefault("SOLAR_INDEX_CACHE", os.path.join(tmp, "index-cache"))
        # What solar reads: the folder's every file, each one sample of /split (the trailing
        # slash is how the transparent mode's interposer tells a folder from a file).
        spec = (os.path.join(path, "*.npz") if npz else
                os.path.join(path, "") + ":/" + ARTIFACT_ARRAY if many else path)
        THROTTLE = make_throttle(a.throttle, path)
        files = data_files(path)
        nbytes = sum(os.path.getsize(f) for f in files)
        sb = sample_bytes_of(path)
        stored = None if npz else stored_bytes(tool, spec)  # compressed: planned by these bytes
        print(f"dataset {path}: {a.samples} samples" +
              (f" in {len(files)} .npz files (one a sample, np.load)" if npz else
               f" in {len(files)} files (one a sample, /split, labels /unitPar)" if many else "") +
              f", {nbytes / 2**20:.0f} MiB; {a.nodes}x{a.ranks} "
              f"ranks, batch {a.batch}, {a.epochs} epochs, solar buffer {a.buffer} per node, "
              f"cold storage every epoch" +
              (f"; {THROTTLE.describe()}" if THROTTLE else ""))
        me = os.path.abspath(__file__)
        if THROTTLE:  # programs and libraries share the disk: cache them before counting bytes
            subprocess.run([sys.executable, "-c", "import torch, torch.distributed, h5py, numpy"],
                           check=True, capture_output=True)
            subprocess.run([tool, "--version"], check=True, capture_output=True)
        workers = [int(x) for x in a.workers.split(",")]
        runs = {w: [] for w in workers}
        disk = {}  # mode -> bytes the cgroup read from the disk in each of its runs
        spread = {}  # transparent mode -> per run: each node's served fraction (served_per_node)
        if "transparent" in modes:
            runs.update({("transparent", w): [] for w in workers})
            spread.update({("transparent", w): [] for w in workers})
        if "solar" in modes:
            runs["solar"] = []
        if "floor" in modes:
            runs["floor"] = []
        agent_ranks = 0
        plans = {}
        head_start = None

        wall = {}  # mode -> each run's whole wall time, launch to exit (seconds)

        def run(mode, rank_argv, extra=()):
            before = THROTTLE.counters() if THROTTLE else None
            t0 = time.monotonic()
            log = solar_run(tool, spec, a, rank_argv, extra)
            wall.setdefault(mode, []).append(time.monotonic() - t0)
            if THROTTLE:
                disk.setdefault(mode, []).append(THROTTLE.counters()[0] - before[0])
            return log

        for k in range(a.repeat):  # in rotation, so that drifts in load hit every mode alike
            for w in workers:
                out = os.path.join(tmp, f"baseline-{w}-{k}")
                os.makedirs(out)
                drop_cache(path)
                run(("baseline", w), [me, "--rank", "baseline", "--workers", str(w), "--out",
                                      out, "--library", lib, "--seed", str(a.seed),
                                      "--batch", str(a.batch), "--epochs", str(a.epochs)],
                    extra=["--no-agent"])
                runs[w].append(gather(out, a.ranks * a.nodes)["load"])
                print(f"baseline num_workers={w}: total {sum(runs[w][-1]):.4f} s "
                      f"{fmt_list(runs[w][-1])}")
            if "floor" in modes:  # the script's own cost: its file in memory all along
                out = os.path.join(tmp, f"floor-{k}")
                os.makedirs(out)
                for file in files:
                    with open(file, "rb") as f:
                        while f.read(16 << 20):
                            pass
                w = workers[0]
                run("floor", [me, "--rank", "baseline", "--workers", str(w), "--out", out,
                              "--library", lib, "--seed", str(a.seed), "--batch", str(a.batch),
                              "--epochs", str(a.epochs), "--warm"], extra=["--no-agent"])
                runs["floor"].append(gather(out, a.ranks * a.nodes)["load"])
                print(f"floor (the script, dataset in the page cache) num_workers={w}: total "
                      f"{sum(runs['floor'][-1]):.4f} s {fmt_list(runs['floor'][-1])}")
            for w in workers if "transparent" in modes else []:
                # The very same rank program, unmodified, served transparently.
                out = os.path.join(tmp, f"transparent-{w}-{k}")
                os.makedirs(out)
                drop_cache(path)
                stats = os.path.join(out, "stats.json")
                script_seed = a.seed if a.script_seed is None else a.script_seed
                log = run(("transparent", w), [me, "--rank", "baseline", "--workers", str(w),
                                               "--out", out, "--library", lib, "--seed",
                                               str(script_seed), "--batch", str(a.batch),
                                               "--epochs", str(a.epochs)],
                          extra=["--transparent"] +
                          (["--order", "unknown"] if a.order_unknown else []) +
                          ([] if a.launcher == "srun" else ["--stats-out", stats]))
                plans["transparent"] = planned(log)
                if (npz or stored) and os.path.exists(stats):  # samples as stored: by bytes
                    pl = json.load(open(stats))["plan"]
                    plans["transparent-bytes"] = (pl["remote_bytes"],
                                                  a.epochs * (nbytes if npz else stored))
                runs[("transparent", w)].append(gather(out, a.ranks * a.nodes)["load"])
                print(f"transparent num_workers={w}: total {sum(runs[('transparent', w)][-1]):.4f} s "
                      f"{fmt_list(runs[('transparent', w)][-1])}")
                served = served_per_node(stats)
                spread[("transparent", w)].append(served)
                if served:
                    print("  file reads served per node: " + ", ".join(
                        f"{n['node']}: {100 * n['served']:.1f}%" for n in served) +
                        f"; fallen through {sum(n['miss_bytes'] for n in served) / 2**20:.1f} "
                        f"MiB, {sum(n['waited_reads'] for n in served)} reads waited for an "
                        f"in-flight fetch; agents' CPU {sum(n['cpu_seconds'] for n in served):.2f} "
                        f"s" + (f"; read {disk[('transparent', w)][-1] / 2**20:.1f} "
                                              f"MiB from the disk" if THROTTLE else ""))
                for line in log.splitlines():
                    if line.startswith("solar run: node") and ("fell through" in line or
                                                               "demand mode from" in line):
                        print("  " + line)
            if "solar" in modes:
                out = os.path.join(tmp, f"solar-{k}")
                os.makedirs(out)
                drop_cache(path)
                stats = os.path.join(out, "stats.json")
                log = run("solar", [me, "--rank", "solar", "--out", out, "--library", lib,
                                    "--workers", "0", "--epochs", str(a.epochs)],
                          extra=[] if a.launcher == "srun" else ["--stats-out", stats])
                plans["solar"] = planned(log)
                if os.path.exists(stats):  # what the agents did before the ranks asked
                    nodes = [n for n in json.load(open(stats))["nodes"] if "head_start" in n]
                    head_start = {
                        "seconds": max((n["head_start"].get("seconds") or 0) for n in nodes),
                        "fetched_bytes": sum(n["head_start"]["fetched_bytes"] for n in nodes)}
                    print(f"  agents' head start (not in the loading times): up to "
                          f"{head_start['seconds']:.2f} s from ready to the first request, "
                          f"{head_start['fetched_bytes'] / 2**20:.1f} MiB fetched by then")
                g = gather(out, a.ranks * a.nodes)
                runs["solar"].append(g["load"])
                agent_ranks = g["agent_ranks"]
                print(f"SOLAR: total {sum(g['load']):.4f} s {fmt_list(g['load'])}")
                for line in log.splitlines():
                    if line.startswith("solar run: node"):
                        print(line)
        # Each mode's run of median total; the baseline's best num_workers by that median.
        median = {m: median_run(rs) for m, rs in runs.items()}
        best = min(workers, key=lambda w: sum(median[w]))
        base = median[best]

        def walls(key):  # a mode's whole-run walls: the median and each rotation's
            return {"wall_s": median_run(wall[key], float), "wall_runs_s": wall[key]}
        result = {"config": {k: getattr(a, k) for k in ("samples", "preset", "nodes", "ranks",
                                                          "batch", "epochs", "buffer", "seed",
                                                          "throttle", "workers", "repeat",
                                                          "peers", "script_seed", "order_unknown")} |
                            ({"layout": a.layout, "files": len(files)} if many else {}),
                  "sample_bytes": sb, "dataset_bytes": nbytes,
                  "modes": {"baseline": {"per_epoch_s": base, "total_s": sum(base),
                                         "num_workers": best,
                                         "disk_bytes": last(disk.get(("baseline", best))),
                                         "disk_runs_bytes": disk.get(("baseline", best)),
                                         **walls(("baseline", best))}}}
        print()
        if a.repeat > 1:
            print(f"(each mode run {a.repeat} times in rotation; the runs of median total shown)")
        print(f"DataLoading time baseline each epoch: {fmt_list(base)}  "
              f"(num_workers={best}, the best of {a.workers})")
        shown = {}
        if "solar" in modes:
            shown["solar"] = median["solar"]
            print(f"DataLoading time SOLAR each epoch: {fmt_list(shown['solar'])}  ({agent_ranks} "
                  f"of {a.ranks * a.nodes} ranks served by a node agent, via {a.launcher})")
        if "transparent" in modes:
            best_t = min(workers, key=lambda w: sum(median[("transparent", w)]))
            shown["transparent"] = median[("transparent", best_t)]
            print(f"DataLoading time transparent each epoch: {fmt_list(shown['transparent'])}  "
                  f"(the baseline's DataLoader unmodified under solar run --transparent, "
                  f"num_workers={best_t})")
        for m, t in shown.items():
            speed = sum(base) / max(sum(t), 1e-9)
            line = (f"speedup {m}: {speed:.2f}x in total over {a.epochs} epochs "
                    f"({sum(base):.4f} s vs {sum(t):.4f} s)")
            key = m if m == "solar" else ("transparent", best_t)
            # Each rotation's own ratio: the baseline's and this mode's runs ran back to back.
            ratios = [sum(b) / max(sum(x), 1e-9) for b, x in zip(runs[best], runs[key])]
            entry = {"per_epoch_s": t, "total_s": sum(t), "speedup": speed,
                     "head_start": head_start if m == "solar" else None,
                     "disk_bytes": last(disk.get(key)), "disk_runs_bytes": disk.get(key),
                     "ratios": ratios, "median_ratio": sorted(ratios)[len(ratios) // 2],
                     "worst_ratio": min(ratios),
                     **walls(key)}
            if m == "transparent":
                entry["served_per_node_runs"] = spread[key]
            if m == "transparent" and plans.get("transparent-bytes"):
                fetched, plain = plans["transparent-bytes"]
                limit = plain / max(fetched, 1)
                line += (f"; limit {limit:.2f}x (plain bytes / planned bytes: "
                         f"{plain / 2**20:.1f} vs {fetched / 2**20:.1f} MiB), achieved "
                         f"{speed / limit:.2f} of it")
                entry.update(planned_bytes=fetched, plain_bytes=plain, limit=limit,
                             of_limit=speed / limit,
                             of_limit_runs=[r / limit for r in ratios])
            elif plans.get(m):
                fetches, accesses = plans[m]
                limit = accesses / max(fetches, 1)
                line += (f"; limit {limit:.2f}x (plain bytes / planned bytes: {accesses} vs "
                         f"{fetches} samples), achieved {speed / limit:.2f} of it")
                entry.update(planned_fetches=fetches, plain_accesses=accesses,
                             planned_bytes=fetches * sb, plain_bytes=accesses * sb,
                             limit=limit, of_limit=speed / limit)
            if entry["disk_bytes"] is not None:
                line += (f"; read {entry['disk_bytes'] / 2**20:.1f} MiB from the disk (cgroup "
                         f"count)" + (f" for {entry['planned_bytes'] / 2**20:.1f} MiB planned"
                                      if entry.get("planned_bytes") else ""))
            result["modes"][m] = entry
            print(line)
            if len(ratios) > 1:
                print(f"  {m} / baseline, each of {len(ratios)} rotations: "
                      + ", ".join(f"{x:.2f}" for x in ratios)
                      + f"; median {entry['median_ratio']:.2f}x, worst {entry['worst_ratio']:.2f}x")
            if len(entry.get("of_limit_runs", [])) > 1:
                ol = entry["of_limit_runs"]
                print(f"  {m} / its byte limit, each rotation: " + ", ".join(f"{x:.2f}" for x in ol)
                      + f"; median {sorted(ol)[len(ol) // 2]:.2f}, worst {min(ol):.2f}")
            # Per epoch, each rotation's baseline / this mode (the run back to back with it).
            per_epoch = [[b[e] / max(x[e], 1e-9) for b, x in zip(runs[best], runs[key])]
                         for e in range(a.epochs)]
            entry["per_epoch_ratio_runs"] = per_epoch
            if len(ratios) > 1:
                print(f"  {m} / baseline per epoch, median (worst) over the rotations: " + ", ".join(
                    f"{sorted(r)[len(r) // 2]:.2f} ({min(r):.2f})" for r in per_epoch))
            if m == "transparent" and any(spread[key]):
                least = [min(n["served"] for n in s) for s in spread[key] if s]
                full = sum(x >= 0.98 for x in least)
                print(f"  least-served node in each run: "
                      + ", ".join(f"{100 * x:.1f}%" for x in least)
                      + f"; every node served >= 98% of its reads in {full} of {len(least)} runs")
                entry["least_served_runs"] = least
            if entry["disk_runs_bytes"] and entry.get("planned_bytes"):
                over = [d / max(entry["planned_bytes"], 1) for d in entry["disk_runs_bytes"]]
                print(f"  disk bytes / planned bytes, each run: "
                      + ", ".join(f"{x:.2f}" for x in over) + f"; worst {max(over):.2f}")
                entry["disk_over_planned_runs"] = over
        if "floor" in modes:
            fl = median["floor"]
            ratios = [sum(b) / max(sum(x), 1e-9) for b, x in zip(runs[best], runs["floor"])]
            result["modes"]["floor"] = {"per_epoch_s": fl, "total_s": sum(fl), "ratios": ratios,
                                        "speedup": sum(base) / max(sum(fl), 1e-9)}
            print(f"floor (the plain script, its dataset in memory): {sum(fl):.4f} s "
                  f"{fmt_list(fl)}: at most {sum(base) / max(sum(fl), 1e-9):.2f}x for any "
                  f"loader serving the script's own reads (each rotation: "
                  + ", ".join(f"{x:.2f}" for x in ratios) + ")")
            if "transparent" in shown:
                of = [sum(f) / max(sum(x), 1e-9) for f, x in
                      zip(runs["floor"], runs[("transparent", best_t)])]
                result["modes"]["transparent"]["of_floor_runs"] = of
                print(f"  transparent achieved, of the floor, each rotation: "
                      + ", ".join(f"{x:.2f}" for x in of)
                      + f"; median {sorted(of)[len(of) // 2]:.2f}, worst {min(of):.2f}")
        # The whole job as a user waits for it: launch (solar run) to exit, planning, agents,
        # Python and torch start-up included.
        walls = ", ".join(f"{m} {e['wall_s']:.2f} s" for m, e in result["modes"].items()
                          if e.get("wall_s") is not None)
        print(f"whole run, launch to exit (median): {walls}")
        # Each rotation's own walls too: on a small shared machine the ranks' start-up swings
        # by more than a short run's loading saves, and a rotation's modes ran back to back.
        if a.repeat > 1:
            base_walls = result["modes"]["baseline"]["wall_runs_s"]
            for m in shown:
                mine = result["modes"][m]["wall_runs_s"]
                shorter = sum(x < b for x, b in zip(mine, base_walls))
                print(f"  each rotation, {m} / baseline: "
                      + ", ".join(f"{x:.2f}/{b:.2f}" for x, b in zip(mine, base_walls))
                      + f" s: {m} ended first in {shorter} of {len(mine)}")
        if result["modes"]["baseline"]["disk_bytes"] is not None:
            print(f"baseline read {result['modes']['baseline']['disk_bytes'] / 2**20:.1f} MiB "
                  f"from the disk (cgroup count)")
        if "solar" in shown and "transparent" in shown:
            print(f"transparent vs solar.torch.Loader: "
                  f"{sum(shown['transparent']) / max(sum(shown['solar']), 1e-9):.2f}x the "
                  f"loading time")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")
    finally:
        if THROTTLE:
            THROTTLE.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
