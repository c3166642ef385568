#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An ordinary, solar-unaware PyTorch DDP data pipeline: an h5py Dataset, DistributedSampler,
DataLoader with workers, a small model. Nothing in it knows about solar; run it under
`solar run --transparent` or `srun --solar-transparent` (same --seed/--batch/--epochs as the
script's) and its reads of the HDF5 file are served from the node agent's buffer.

It prints one line per epoch and, with --digests FILE, writes per batch the SHA-256 of its
inputs and labels and the loss, so runs with and without solar can be compared bit for bit.
Rank and world size come from the usual variables (RANK/WORLD_SIZE, or Slurm's)."""
import argparse
import hashlib
import os

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class H5Samples(Dataset):
    def __init__(self, path, lazy):
        self.path = path
        self.file = None if lazy else h5py.File(path, "r")  # lazily: opened in each worker
        with h5py.File(path, "r") as f:
            self.n = f["data"].shape[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.file is None:
            self.file = h5py.File(self.path, "r")
        x = torch.from_numpy(self.file["data"][i].astype(np.float32))
        y = torch.tensor(int(self.file["label"][i]), dtype=torch.int64)
        return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--lazy", action="store_true", help="open the file in __getitem__")
    p.add_argument("--digests", help="write per-batch SHA-256 and losses here (%%r: rank)")
    a = p.parse_args()
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", 1)))
    torch.manual_seed(1234)
    torch.set_num_threads(1)

    ds = H5Samples(a.data, a.lazy)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=a.seed)
    loader = DataLoader(ds, batch_size=a.batch, sampler=sampler, num_workers=a.workers)
    model = None
    out = open(a.digests.replace("%r", str(rank)), "w") if a.digests else None
    for epoch in range(a.epochs):
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in loader:
            x = x.reshape(x.shape[0], -1)
            if model is None:
                model = torch.nn.Linear(x.shape[1], 8).double()
                opt = torch.optim.SGD(model.parameters(), lr=1e-6)
            loss = torch.nn.functional.cross_entropy(model(x.double() / 1000), y % 8)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item()
            batches += 1
            if out:
                out.write(f"{epoch} {batches} {hashlib.sha256(x.numpy().tobytes()).hexdigest()} "
                          f"{hashlib.sha256(y.numpy().tobytes()).hexdigest()} {loss.item()!r}\n")
        print(f"rank {rank}: epoch {epoch}: {batches} batches, mean loss {total / max(batches, 1):.6f}",
              flush=True)
    if out:
        out.close()


if __name__ == "__main__":
    main()
