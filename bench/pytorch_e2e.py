#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""End-to-end training in the SOLAR artifact's format: a small CosmoFlow-like 3D CNN trained
with DDP (gloo, CPU) for 3 epochs, once with the PyTorch DataLoader (h5py Dataset,
DistributedSampler), once with solar.torch.Loader, and once on batches already in memory (pure
compute). Same seed, same model initialisation, same global batches (solar runs --order torch).

    /usr/bin/python3 bench/pytorch_e2e.py
    /usr/bin/python3 bench/pytorch_e2e.py --workers 2 --samples 800 --preset small

The target of each sample is its 4 per-channel means (standardised), as CosmoFlow regresses 4
cosmological parameters from a 4-channel volume. Validation: a separate 128-sample file, read
sharded by every rank, after each epoch. Prints per epoch the data-loading time, epoch time,
training loss (mean over the epoch's global batches) and validation loss, then the epoch-time
overhead of each loader over pure compute. Cold storage at every epoch start, as in
pytorch_io.py.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_io as io  # noqa: E402


def build_model(channels):
    import torch.nn as nn
    return nn.Sequential(
        nn.Conv3d(channels, 8, 3, stride=2, padding=1), nn.LeakyReLU(),
        nn.Conv3d(8, 16, 3, stride=2, padding=1), nn.LeakyReLU(), nn.MaxPool3d(2),
        nn.Conv3d(16, 16, 3, padding=1), nn.LeakyReLU(), nn.AdaptiveAvgPool3d(1),
        nn.Flatten(), nn.Linear(16, 32), nn.LeakyReLU(), nn.Linear(32, channels))


def prepare(x):
    """int16 volume -> (normalised float input, standardised per-channel means)."""
    xf = x.float() / 32768.0
    dims = tuple(range(2, xf.dim()))
    # Means of uniform noise over n voxels have std 1/sqrt(3n): standardise with that.
    n = 1
    for d in dims:
        n *= xf.shape[d]
    return xf, xf.mean(dim=dims) * (3.0 * n) ** 0.5


def rank_main(a):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank, world = io.rank_setup(a)
    torch.manual_seed(a.seed)
    torch.set_num_threads(1)
    path = io.dataset_path(a)
    import h5py
    with h5py.File(path, "r") as f:
        shape = f["data"].shape[1:]
    model = DDP(build_model(shape[0]))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()

    with h5py.File(a.val, "r") as f:  # this rank's shard of the validation set
        val_x = torch.from_numpy(f["data"][rank::world])
    if a.rank == "compute":
        # Pure compute: the same number of steps on batches already in memory.
        with h5py.File(path, "r") as f:
            mem = torch.from_numpy(f["data"][: a.batch])
        steps = len(io.baseline_loader(path, a, rank, world)[1])
        set_epoch, loader, unpack = (lambda e: None), [mem] * steps, (lambda b: (b, None, 1.0))
    else:
        set_epoch, loader, unpack = io.make_loader(a, rank, world)

    rep = {"load": [], "epoch": [], "train_loss": [], "val_loss": []}
    for epoch in range(a.epochs):
        set_epoch(epoch)
        dist.barrier()
        if rank == 0:
            io.drop_cache(path)
        dist.barrier()
        load = total = 0.0
        steps = 0
        t_epoch = t = time.perf_counter()
        model.train()
        for batch in loader:
            x, _, weight = unpack(batch)
            load += time.perf_counter() - t
            xf, target = prepare(x)
            opt.zero_grad()
            loss = loss_fn(model(xf), target)
            (loss * weight).backward()
            opt.step()
            total += loss.item()
            steps += 1
            t = time.perf_counter()
        dist.barrier()
        rep["epoch"].append(time.perf_counter() - t_epoch)
        rep["load"].append(load)
        model.eval()
        with torch.no_grad():
            xf, target = prepare(val_x)
            val = torch.tensor([loss_fn(model(xf), target).item() * len(xf), len(xf),
                                total, steps], dtype=torch.float64)
        dist.all_reduce(val)
        rep["val_loss"].append(float(val[0] / val[1]))
        rep["train_loss"].append(float(val[2] / val[3]))
    with open(os.path.join(a.out, f"rank-{rank}.json"), "w") as f:
        json.dump(rep | {"agent": bool(getattr(a, "using_agent", False))}, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    io.add_common_args(ap)
    ap.add_argument("--workers", type=int, default=2, help="baseline num_workers [2]")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the three modes this many times, in rotation, and report each "
                         "mode's run of median total epoch time (this machine is noisy) [1]")
    ap.add_argument("--val", help=argparse.SUPPRESS)
    ap.set_defaults(rank=None)
    ap._option_string_actions["--rank"].choices = ["baseline", "solar", "compute"]
    a = ap.parse_args()
    if a.rank:
        return rank_main(a)
    tool, lib = io.find_build(a.build)
    tmp = tempfile.mkdtemp(prefix="solar-bench-")
    try:
        path = io.make_dataset(tool, a, tmp)
        val = io.make_dataset(tool, a, tmp, name="val.h5", samples=128, seed=a.seed + 1)
        # --throttle: every mode on the same emulated shared storage (scripts/slow-storage).
        io.THROTTLE = io.make_throttle(a.throttle, path)
        print(f"dataset {path}: {a.samples} samples; {a.nodes}x{a.ranks} ranks, batch {a.batch}, "
              f"{a.epochs} epochs, seed {a.seed}, solar buffer {a.buffer}, baseline "
              f"num_workers={a.workers}, cold storage every epoch" +
              (f"; {io.THROTTLE.describe()}" if io.THROTTLE else ""))
        me = os.path.abspath(__file__)
        if a.repeat < 1:
            sys.exit("pytorch_e2e: --repeat must be at least 1")
        runs = {"compute": [], "baseline": [], "solar": []}
        for k, mode in [(k, m) for k in range(a.repeat) for m in runs]:
            out = os.path.join(tmp, f"{mode}-{k}")
            os.makedirs(out)
            io.drop_cache(path)
            argv = [me, "--rank", mode, "--out", out, "--library", lib, "--val", val,
                    "--workers", str(a.workers), "--seed", str(a.seed), "--batch", str(a.batch),
                    "--epochs", str(a.epochs), "--lr", str(a.lr)]
            io.solar_run(tool, path, a, argv, extra=[] if mode == "solar" else ["--no-agent"])
            g = io.gather(out, a.ranks * a.nodes)
            runs[mode].append(g["rank0"])
            if mode == "solar" and k == 0:
                print(f"SOLAR: {g['agent_ranks']} of {a.ranks * a.nodes} ranks served by a node "
                      f"agent, via {a.launcher}")
        # Each mode's run of median total epoch time.
        results = {m: io.median_run(rs, lambda r: sum(r["epoch"])) for m, rs in runs.items()}
        if a.repeat > 1:
            for m, rs in runs.items():
                print(f"{m}: total epoch time of each run: "
                      f"{io.fmt_list([sum(r['epoch']) for r in rs])}; the median run is shown")
        for mode, name in (("baseline", "baseline"), ("solar", "SOLAR"), ("compute", "compute")):
            r = results[mode]
            if mode != "compute":
                print(f"DataLoading time {name} each epoch: {io.fmt_list(r['load'])}")
            print(f"Epoch time {name} each epoch: {io.fmt_list(r['epoch'])}")
            print(f"Training loss {name} each epoch: {io.fmt_list(r['train_loss'])}")
            print(f"Validation loss {name} each epoch: {io.fmt_list(r['val_loss'])}")
        comp = sum(results["compute"]["epoch"])
        for mode in ("baseline", "solar"):
            e = sum(results[mode]["epoch"])
            print(f"{mode}: epoch time {e:.2f} s in total, {100 * (e / comp - 1):+.1f}% over pure "
                  f"compute ({comp:.2f} s)")
        diff = max(abs(x - y) / max(abs(x), 1e-12) for x, y in
                   zip(results["baseline"]["train_loss"], results["solar"]["train_loss"]))
        print(f"training loss, SOLAR vs baseline: largest relative difference {100 * diff:.2f}%")
    finally:
        if io.THROTTLE:
            io.THROTTLE.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
