#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An ordinary, solar-unaware PyTorch DDP data pipeline over a dataset of many HDF5 files, read
the way real workloads read them: --layout files, the SOLAR artifact's CosmoFlow reader (one file
a sample, `split` and `unitPar`, opened and closed in every __getitem__, over the sorted file
list); --layout records, DLIO's (rows of a few files, every file kept open); --layout npz,
MLPerf Storage's UNet3D (one .npz file a sample, of its own size, read with np.load: arrays `x`
and `y`; a batch is its samples' `x` concatenated, with their lengths). DistributedSampler,
DataLoader with workers. Nothing in it knows about solar: run it under `solar run --transparent`
or `srun --solar-transparent` with the dataset as `ROOT/:/split --labels /unitPar` (or
`ROOT/:/records[] --labels /labels`, or `'ROOT/*.npz'`) and the same --seed/--batch/--epochs, and its reads of the
files are served from the node agent's buffer.

With --shuffle-list FILE (a .npy of shape (epochs, N)) it reads as the SOLAR artifact's
io_baseline.py does: epoch e's order is row e of a list computed up front (the artifact draws it
with numpy's global RNG and broadcasts it over MPI), read through
DistributedSampler(shuffle=False), rank r taking the list's positions r, r+W, ...; under solar,
give the same file as `--order-file` and the plan follows it.

With --sampler random each rank draws its own order of the whole dataset (RandomSampler): an
order no plan knows; under solar give `--order unknown` (with --peers, the nodes' buffers are
pooled: agent/README.md, "Demand mode").

With --digests FILE (%r: the rank) it writes per batch the SHA-256 of its inputs and labels, so
runs with and without solar can be compared bit for bit. Rank and world size come from the usual
variables (RANK/WORLD_SIZE, or Slurm's)."""
import argparse
import glob
import hashlib
import os

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler


class Universes(Dataset):
    """One file a sample, opened and closed in every __getitem__ (SC24-SOLAR's CosmoFlow)."""
    def __init__(self, root):
        self.paths = sorted(glob.glob(os.path.join(root, "*", "*.hdf5")))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with h5py.File(self.paths[i], "r") as f:
            x, y = f["split"][:], f["unitPar"][:]
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)


class Records(Dataset):
    """DLIO's: rows of a few files, every file kept open once a process first reads."""
    def __init__(self, root):
        self.paths = sorted(glob.glob(os.path.join(root, "*.hdf5")))
        counts = []
        for p in self.paths:
            with h5py.File(p, "r") as f:
                counts.append(f["records"].shape[0])
        self.starts = np.cumsum([0] + counts)
        self.files = None

    def __len__(self):
        return int(self.starts[-1])

    def __getitem__(self, i):
        if self.files is None:
            self.files = [h5py.File(p, "r") for p in self.paths]
        j = int(np.searchsorted(self.starts, i, side="right")) - 1
        k = i - int(self.starts[j])
        f = self.files[j]
        return (torch.from_numpy(f["records"][k].astype(np.float32)),
                torch.tensor(int(f["labels"][k]), dtype=torch.int64))


class NpzFiles(Dataset):
    """One .npz a sample (MLPerf Storage's UNet3D): np.load in every __getitem__."""
    def __init__(self, root):
        self.paths = sorted(glob.glob(os.path.join(root, "*.npz")))

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with np.load(self.paths[i]) as z:
            x, y = z["x"], z["y"]
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)


class Listed(Dataset):
    """The artifact's way of shuffling: item i of epoch e is sample order[e][i]."""
    def __init__(self, ds, order):
        self.ds, self.order, self.epoch = ds, order, 0

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        return self.ds[int(self.order[self.epoch][i])]


def concatenate(batch):
    """Samples of differing sizes: their inputs back to back, their lengths with the labels."""
    xs, ys = zip(*batch)
    lengths = torch.tensor([len(x) for x in xs], dtype=torch.int64)
    return torch.cat(xs), torch.cat([lengths, torch.cat(ys).to(torch.int64)])


p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("--layout", choices=["files", "records", "npz"], default="files")
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--workers", type=int, default=0)
p.add_argument("--digests", required=True)
p.add_argument("--shuffle-list", help="epochs x N .npy: each epoch's order (the artifact's)")
p.add_argument("--sampler", choices=["distributed", "random"], default="distributed",
               help="random: each rank draws its own order of the whole dataset (RandomSampler, "
                    "seeded with --seed and the rank)")
a = p.parse_args()
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))
ds = {"files": Universes, "records": Records, "npz": NpzFiles}[a.layout](a.root)
assert len(ds) > 0, a.root
if a.shuffle_list:
    ds = Listed(ds, np.load(a.shuffle_list))
if a.sampler == "random":
    sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(a.seed * 1000 + rank))
else:
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=not a.shuffle_list,
                                 seed=a.seed)
loader = DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers,
                    collate_fn=concatenate if a.layout == "npz" else None)
with open(a.digests.replace("%r", str(rank)), "w") as out:
    for epoch in range(a.epochs):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if a.shuffle_list:
            ds.epoch = epoch  # before the iterator: workers take the dataset as it is then
        for b, (x, y) in enumerate(loader):
            out.write(f"{epoch} {b} {hashlib.sha256(x.numpy().tobytes()).hexdigest()} "
                      f"{hashlib.sha256(y.numpy().tobytes()).hexdigest()}\n")
print(f"rank {rank}: done", flush=True)
