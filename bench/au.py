#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Accelerator utilisation (AU), MLPerf Storage's measure, for the plain PyTorch DataLoader,
solar.torch.Loader and the same DataLoader under `solar run --transparent`, side by side on the
same (capped) storage.

    /usr/bin/python3 bench/au.py                                  # cosmoflow, N = 1,2,4,8
    /usr/bin/python3 bench/au.py --workload unet3d --throttle 400M,2000
    /usr/bin/python3 bench/au.py --workload resnet50 --accelerators 2,4,8,16 --json au.json
    solar report au.json -o au.svg                                 # AU against N per loader

The method is MLPerf Storage's (mlcommons/storage, built on Argonne's DLIO): N emulated
accelerators, here N ranks of one node, each take a batch from their loader and then
"compute" for a fixed time (a sleep: no GPU needed); the accelerator is busy while it
computes and idle while it waits for its next batch. Per accelerator

    AU = sum(compute time) / (sum(compute time) + sum(time waiting for batches))

over every step of every epoch (both timed by the rank; the waits include the first batch of
each epoch); the run's AU is the mean over its accelerators (the worst one is printed too),
and a loader sustains N accelerators when that mean is at least the workload's threshold
(MLPerf Storage's Submission_guidelines.md: 90% for UNet3D and ResNet-50, 70% for
CosmoFlow). For each loader the bench runs every N of --accelerators (all loaders at one N,
then the next N: interleaved, so drifts hit every loader alike) and reports the largest N that
passes and the AU at each N.

The workloads: DLIO's configurations (configs/dlio/workload/*_h100.yaml), with this project's
layouts of them:

    workload   DLIO batch  read threads  compute/batch  sample            layout here
    cosmoflow  1           4             3.5 ms         2.83 MB TFRecord  one HDF5 file a sample
    unet3d     7           4             0.323 s        146 MB npz        one .npz a sample
    resnet50   400         8             0.224 s        114,660 B JPEG    one HDF5 file

Scaling to this machine. Samples here are smaller than DLIO's and storage is one capped disk,
not a cluster file system, so the compute time is scaled to keep what AU measures: how the
accelerators' demand compares with what the storage delivers. An accelerator consumes DLIO's
bytes per second of compute (batch bytes / compute time: 808 MB/s for CosmoFlow, 3.18 GB/s for
UNet3D, 205 MB/s for ResNet-50, on an H100) scaled by STORAGE / LINK, where STORAGE is the
storage bandwidth here (the --throttle cap; 400 MB/s when unthrottled, named as such) and LINK
the client node's link in an MLPerf Storage submission (--link, 12.5 GB/s: one 100 GbE port).
So a batch of B bytes computes for B / (DLIO rate * STORAGE / LINK) seconds: at 400 MB/s the
CosmoFlow accelerator consumes 25.9 MB/s, as many accelerators per node as a 100 GbE client
feeds H100s. --compute-scale multiplies every compute time. The DataLoader's num_workers is
DLIO's read threads, at most --max-workers (2: the cores of this machine); the batch is DLIO's
except ResNet-50's (16 here, --batch to change: 400 samples is more than a small dataset holds
per rank).

Every loader runs under `solar run` (the plain one with --no-agent); storage is cold at every
epoch start (the page cache of the dataset's files dropped after a barrier), as in
bench/pytorch_io.py, whose helpers this script uses. Over whole-file samples (unet3d's npz) the
batch-mode loader (solar.torch.Loader) hands each file's bytes and the rank decodes them with
np.load, as the plain loader's dataset does.
"""
import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pytorch_io as io  # noqa: E402

# DLIO's H100 configurations (mlcommons/storage configs/dlio/workload/*_h100.yaml).
WORKLOADS = {
    "cosmoflow": {"batch": 1, "threads": 4, "compute_s": 0.0035, "sample_bytes": 2_830_000,
                  "threshold": 0.70, "layout": "per-sample-files", "here_batch": 1},
    "unet3d": {"batch": 7, "threads": 4, "compute_s": 0.323, "sample_bytes": 146_600_000,
               "threshold": 0.90, "layout": "npz", "here_batch": 7},
    "resnet50": {"batch": 400, "threads": 8, "compute_s": 0.224, "sample_bytes": 114_660,
                 "threshold": 0.90, "layout": "file", "here_batch": 16},
}
LOADERS = ("baseline", "solar", "transparent")
UNCAPPED = 400 << 20  # the storage bandwidth the compute is scaled to when --throttle is not given


def dlio_rate(w):
    """Bytes per second of compute an H100 consumes in DLIO's configuration."""
    return w["batch"] * w["sample_bytes"] / w["compute_s"]


def accelerator_au(steps):
    """(AU, compute seconds, wait seconds) of one accelerator from its recorded steps:
    [[wait, compute, bytes], ...] per epoch."""
    wait = sum(s[0] for epoch in steps for s in epoch)
    compute = sum(s[1] for epoch in steps for s in epoch)
    return (compute / (compute + wait) if compute + wait > 0 else 0.0), compute, wait


# --- rank side -----------------------------------------------------------------------------------
class NpzFiles:
    """MLPerf Storage's UNet3D layout: one .npz a sample, np.load in every __getitem__."""

    def __init__(self, root):
        self.paths = sorted(glob.glob(os.path.join(root, "*.npz")))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        import torch
        with np.load(self.paths[i]) as z:
            return torch.from_numpy(z["x"]), int(z["y"][0])


def concatenate(batch):
    """npz samples differ in size: their arrays back to back."""
    import torch
    xs, ys = zip(*batch)
    return torch.cat(xs), torch.tensor(ys)


def data_files(path):
    """The dataset's files (an npz folder's .npz files, or pytorch_io's HDF5 files)."""
    if os.path.isdir(path) and glob.glob(os.path.join(path, "*.npz")):
        return sorted(glob.glob(os.path.join(path, "*.npz")))
    return io.data_files(path)


def nbytes_of(files):
    return sum(os.path.getsize(f) for f in files)


def drop_cache(path):
    """Cold storage: the page cache of every file of the dataset dropped."""
    for f in data_files(path):
        io.slow_storage.evict(f)


def make_loader(a, rank, world):
    """(set_epoch, iterable, batch -> data tensor) of the loader this rank measures."""
    if a.rank == "baseline" and a.layout == "npz":
        import torch.utils.data as tud
        ds = NpzFiles(io.dataset_path(a).removesuffix("*.npz"))
        sampler = tud.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                         seed=a.seed)
        loader = tud.DataLoader(ds, batch_size=a.batch, sampler=sampler,
                                num_workers=a.workers, collate_fn=concatenate)
        return sampler.set_epoch, loader, (lambda b: b[0])
    if a.rank == "solar" and a.layout == "npz":
        # Whole files in batch mode: each sample its file's bytes, decoded here as the plain
        # loader's np.load does (one array back to back, as concatenate gives).
        import io as bytes_io
        import torch
        import solar.torch

        def decode(batch):
            xs = []
            for t in batch.data:
                with np.load(bytes_io.BytesIO(memoryview(t.numpy()))) as z:
                    xs.append(torch.from_numpy(z["x"]))
            return torch.cat(xs)
        loader = solar.torch.Loader()
        a.using_agent = loader.using_agent
        return loader.set_epoch, loader, decode
    set_epoch, loader, unpack = io.make_loader(a, rank, world)
    return set_epoch, loader, (lambda b: unpack(b)[0])


def rank_main(a):
    import torch.distributed as dist
    rank, world = io.rank_setup(a)
    set_epoch, loader, data = make_loader(a, rank, world)
    path = io.dataset_path(a).removesuffix("*.npz")
    steps = []
    for epoch in range(a.epochs):
        set_epoch(epoch)
        dist.barrier()
        if rank == 0:
            drop_cache(path)
        dist.barrier()
        record = []
        t = time.perf_counter()
        for batch in loader:
            got = time.perf_counter()
            x = data(batch)
            nbytes = x.numel() * x.element_size()
            time.sleep(nbytes * a.compute_per_byte)  # the emulated accelerator's compute
            done = time.perf_counter()
            record.append([got - t, done - got, nbytes])
            t = done
        steps.append(record)
    with open(os.path.join(a.out, f"rank-{rank}.json"), "w") as f:
        json.dump({"steps": steps, "agent": bool(getattr(a, "using_agent", False))}, f)
    dist.destroy_process_group()


# --- driver --------------------------------------------------------------------------------------
def make_dataset(tool, a, tmp):
    """(what solar reads, the files' folder or file, bytes a sample on average)."""
    if a.dataset:
        path = a.dataset
    elif a.layout == "npz":
        path = io.write_npz(os.path.join(tmp, "unet3d"), a.samples, a.sample_size, a.seed)
    elif a.layout == "file":
        path = os.path.join(tmp, "resnet50.h5")
        io.subprocess.run([tool, "gen", path, "--samples", str(a.samples), "--shape",
                           str(a.sample_size), "--dtype", "uint8", "--seed", str(a.seed),
                           "--no-progress"], check=True, capture_output=True)
    else:
        path = os.path.join(tmp, "cosmoflow")
        io.subprocess.run([tool, "gen", path, "--samples", str(a.samples), "--preset",
                           a.preset, "--seed", str(a.seed), "--no-progress", "--layout",
                           "per-sample-files"], check=True, capture_output=True)
    if a.layout == "npz":
        return os.path.join(path, "*.npz"), path, data_files(path)
    if a.layout == "per-sample-files":
        return os.path.join(path, "") + ":/" + io.ARTIFACT_ARRAY, path, data_files(path)
    return path, path, [path]


def run_loader(tool, a, spec, loader, n, tmp, k):
    """One run of `loader` with n accelerators; returns the ranks' reports."""
    out = os.path.join(tmp, f"{loader}-{n}-{k}")
    os.makedirs(out)
    a.ranks = n
    workers = 0 if loader == "solar" else a.workers
    argv = [os.path.abspath(__file__), "--rank", "baseline" if loader != "solar" else "solar",
            "--workers", str(workers), "--out", out, "--library", a.lib, "--seed", str(a.seed),
            "--batch", str(a.batch), "--epochs", str(a.epochs), "--layout", a.layout,
            "--compute-per-byte", repr(a.compute_per_byte)]
    extra = {"baseline": ["--no-agent"], "transparent": ["--transparent"], "solar": []}[loader]
    if a.local_buffer and loader != "baseline":
        extra = [*extra, "--local-buffer", a.local_buffer, "--local-dir", a.local_dir]
    drop_cache(a.path)
    io.solar_run(tool, spec, a, argv, extra)
    reports = []
    for r in range(n):
        with open(os.path.join(out, f"rank-{r}.json")) as f:
            reports.append(json.load(f))
    return reports


def summarise(reports):
    """AU per accelerator, their mean and worst, compute and wait totals."""
    per = [accelerator_au(r["steps"]) for r in reports]
    aus = [p[0] for p in per]
    return {"au": sum(aus) / len(aus), "au_worst": min(aus), "au_per_accelerator": aus,
            "compute_s": [p[1] for p in per], "wait_s": [p[2] for p in per],
            "steps": [r["steps"] for r in reports],
            "agent_ranks": sum(bool(r.get("agent")) for r in reports)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    io.add_common_args(ap)
    ap.set_defaults(samples=None, batch=None, epochs=5)
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="cosmoflow",
                    help="DLIO's configuration and this project's layout of it [cosmoflow]")
    ap.add_argument("--accelerators", default="1,2,4,8",
                    help="the numbers of emulated accelerators (ranks of one node) to run, "
                         "e.g. 1,2,4,8 [1,2,4,8]")
    ap.add_argument("--loaders", default=",".join(LOADERS),
                    help=f"which loaders to run [{','.join(LOADERS)}]")
    ap.add_argument("--link", default="12500000000",
                    help="the MLPerf Storage client's link the compute time is scaled against, "
                         "bytes/s (K, M, G: powers of 1024) [12500000000: one 100 GbE port]")
    ap.add_argument("--compute-scale", type=float, default=1.0,
                    help="multiply every compute time by this [1]")
    ap.add_argument("--max-workers", type=int, default=2,
                    help="at most this many DataLoader workers per accelerator (DLIO's read "
                         "threads, capped) [2]")
    ap.add_argument("--sample-size", type=int,
                    help="bytes a sample (unet3d: the mean of the npz files; resnet50: "
                         "each) [unet3d 1 MiB, resnet50 114660]")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every (N, loader) this many times, interleaved; the run of "
                         "median AU is reported [1]")
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    ap.add_argument("--local-buffer", metavar="SPEC",
                    help="a local tier below solar's --buffer (solar run --local-buffer, e.g. "
                         "80%% with --buffer 20%%: MLPerf Storage's dataset of 5x the memory); "
                         "samples of one size only (not unet3d)")
    ap.add_argument("--local-disk", metavar="BYTES/S",
                    help="with --local-buffer and --throttle (root): the tier on an emulated "
                         "local disk of its own, capped at this rate both ways "
                         "(scripts/slow-storage --local-dir) [the tier in a folder of the "
                         "dataset's disk]")
    ap.add_argument("--layout", help=argparse.SUPPRESS)  # rank: the dataset's layout
    ap.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)  # rank
    ap.add_argument("--compute-per-byte", type=float, help=argparse.SUPPRESS)  # rank
    a = ap.parse_args()
    if a.rank:
        return rank_main(a)
    w = WORKLOADS[a.workload]
    a.layout = w["layout"]
    a.samples = a.samples or {"cosmoflow": 256, "unet3d": 448, "resnet50": 2048}[a.workload]
    a.batch = a.batch or w["here_batch"]
    a.sample_size = a.sample_size or {"unet3d": 1 << 20, "resnet50": 114_660}.get(a.workload)
    a.workers = min(w["threads"], a.max_workers)
    try:
        counts = sorted({int(x) for x in a.accelerators.split(",") if x})
        if not counts or counts[0] < 1:
            raise ValueError
    except ValueError:
        sys.exit(f"au: --accelerators {a.accelerators}: give positive numbers such as 1,2,4,8")
    loaders = [x for x in a.loaders.split(",") if x]
    if not loaders or not set(loaders) <= set(LOADERS):
        sys.exit(f"au: --loaders {a.loaders}: choose from {', '.join(LOADERS)}")
    skipped = []
    if a.local_buffer and a.layout == "npz":
        sys.exit("au: --local-buffer: the local tier holds samples of one size; unet3d's npz "
                 "files differ (use cosmoflow or resnet50)")
    if a.local_disk and not (a.local_buffer and a.throttle):
        sys.exit("au: --local-disk needs --local-buffer and --throttle (the disk's cap is set "
                 "on the throttle's cgroup)")
    if a.repeat < 1 or a.epochs < 1 or a.batch < 1 or a.samples < 1 or a.compute_scale <= 0:
        sys.exit("au: --repeat, --epochs, --batch, --samples and --compute-scale must be "
                 "positive")
    link = io.slow_storage.parse_size(a.link, "--link")
    tool, a.lib = io.find_build(a.build)
    tmp = tempfile.mkdtemp(prefix="solar-bench-", dir=os.environ.get("SOLAR_BENCH_DIR"))
    try:
        spec, a.path, files = make_dataset(tool, a, tmp)
        if a.layout == "per-sample-files":
            os.environ.setdefault("SOLAR_INDEX_CACHE", os.path.join(tmp, "index-cache"))
            a.labels = "/" + io.ARTIFACT_LABELS
        else:  # npz: no labels (whole-file samples); one file: solar's /label default
            a.labels = None
        io.THROTTLE = io.make_throttle(a.throttle, a.path)
        a.local_dir = os.path.join(tmp, "local")
        if a.local_disk:
            try:
                a.disk = io.slow_storage.LocalDisk(a.local_dir, 2 * nbytes_of(files) + (256 << 20))
            except io.slow_storage.Unavailable as e:
                sys.exit(f"au: --local-disk: {e}")
            rate_local = io.slow_storage.parse_size(a.local_disk, "--local-disk")
            io.THROTTLE.add_device(a.disk.majmin, rate_local, rate_local)
        elif a.local_buffer:
            os.makedirs(a.local_dir)
        storage = io.THROTTLE.bps if io.THROTTLE else UNCAPPED
        # The emulated accelerator: DLIO's bytes per second of compute, scaled by storage/link.
        rate = dlio_rate(w) * storage / link / a.compute_scale
        a.compute_per_byte = 1.0 / rate
        nbytes = nbytes_of(files)
        mean = nbytes / max(a.samples, 1)
        print(f"au: {a.workload} ({a.layout}): {a.samples} samples, {nbytes / 2**20:.1f} MiB "
              f"({mean / 2**10:.0f} KiB a sample on average); batch {a.batch}, {a.epochs} "
              f"epochs, DataLoader num_workers {a.workers} (DLIO: {w['threads']} read "
              f"threads), solar buffer {a.buffer}"
              + (f" and a local tier of {a.local_buffer} ("
                 + (f"a disk capped at {a.local_disk}/s" if a.local_disk else "a folder on "
                    "the dataset's disk") + ")" if a.local_buffer else "")
              + ", cold storage every epoch; "
              + (io.THROTTLE.describe() if io.THROTTLE else "storage not capped (compute scaled "
                 "as if capped at 400M)"))
        print(f"au: an accelerator computes {rate / 1e6:.1f} MB/s of batches (DLIO on an H100: "
              f"{dlio_rate(w) / 1e6:.0f} MB/s, scaled by {storage / 1e6:.0f} MB/s storage / "
              f"{link / 1e9:.1f} GB/s link), {a.batch * mean / rate * 1e3:.1f} ms a batch; "
              f"threshold AU {100 * w['threshold']:.0f}%")
        for s in skipped:
            print(f"au: left out: {s}")
        if io.THROTTLE:
            io.subprocess.run([sys.executable, "-c", "import torch, torch.distributed, h5py"],
                              check=True, capture_output=True)
        results = {m: {} for m in loaders}
        for n in counts:
            for k in range(a.repeat):
                for m in loaders:
                    s = summarise(run_loader(tool, a, spec, m, n, tmp, k))
                    results[m].setdefault(n, []).append(s)
                    print(f"  N={n:<3} {m:<12} AU {100 * s['au']:5.1f}% (worst accelerator "
                          f"{100 * s['au_worst']:.1f}%), waited "
                          f"{max(s['wait_s']):.2f} s, computed {max(s['compute_s']):.2f} s",
                          flush=True)
        table = {m: {n: sorted(rs, key=lambda s: s["au"])[len(rs) // 2]
                     for n, rs in by.items()} for m, by in results.items()}
        print()
        print(f"{'loader':<12}" + "".join(f"{'N=' + str(n):>9}" for n in counts)
              + f"  | largest N at AU >= {100 * w['threshold']:.0f}%")
        largest = {}
        for m in loaders:
            ok = [n for n in counts if table[m][n]["au"] >= w["threshold"]]
            largest[m] = max(ok) if ok else 0
            top = (f"{largest[m]}" + (" (every N tried)" if largest[m] == counts[-1] else "")
                   if ok else "none of those tried")
            print(f"{m:<12}" + "".join(f"{100 * table[m][n]['au']:8.1f}%" for n in counts)
                  + f"  | {top}")
        if "baseline" in largest:
            for m in loaders:
                if m != "baseline" and largest["baseline"]:
                    print(f"{m}: {largest[m] / largest['baseline']:.2f}x the accelerators of "
                          f"the plain DataLoader")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"kind": "au", "workload": a.workload, "layout": a.layout,
                           "threshold": w["threshold"], "accelerators": counts,
                           "config": {"samples": a.samples, "batch": a.batch,
                                      "epochs": a.epochs, "buffer": a.buffer,
                                      "local_buffer": a.local_buffer,
                                      "local_disk": a.local_disk,
                                      "throttle": a.throttle, "workers": a.workers,
                                      "link": link, "storage": storage,
                                      "compute_scale": a.compute_scale, "repeat": a.repeat,
                                      "dataset_bytes": nbytes},
                           "compute_bytes_per_s": rate, "left_out": skipped,
                           "largest": largest,
                           "loaders": {m: {str(n): s for n, s in by.items()}
                                       for m, by in table.items()}}, f, indent=1)
    finally:
        if getattr(a, "disk", None):  # unmounted before its folder goes
            a.disk.close()
        shutil.rmtree(tmp, ignore_errors=True)
        if io.THROTTLE:
            io.THROTTLE.close()


if __name__ == "__main__":
    main()
