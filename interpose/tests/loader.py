# SPDX-License-Identifier: Apache-2.0
"""An unmodified h5py + PyTorch DataLoader job: prints a SHA-256 per batch of inputs and labels.

usage: loader.py FILE.h5 WORKERS {init|lazy} [SPAN] [EPOCHS]
  init: the file is opened in the Dataset's __init__ (workers read the inherited fd)
  lazy: opened on first __getitem__ in each process (workers reopen it)
  SPAN: samples per item, read as one slice d[i:i+SPAN] (one pread of SPAN rows)
"""
import hashlib
import sys

import h5py
import torch
from torch.utils.data import DataLoader, Dataset, RandomSampler

path, workers, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
span = int(sys.argv[4]) if len(sys.argv) > 4 else 1
epochs = int(sys.argv[5]) if len(sys.argv) > 5 else 1
N = 64


class H5(Dataset):
    def __init__(self):
        self.f = h5py.File(path, "r") if mode == "init" else None

    def __len__(self):
        return N - span + 1

    def __getitem__(self, i):
        if self.f is None:
            self.f = h5py.File(path, "r")
        x = self.f["data"][i:i + span] if span > 1 else self.f["data"][i]
        return torch.from_numpy(x), int(self.f["label"][i])


g = torch.Generator()
g.manual_seed(42)
sampler = RandomSampler(range(N - span + 1), generator=g)
loader = DataLoader(H5(), batch_size=8, sampler=sampler, num_workers=workers)
for epoch in range(epochs):
    for step, (x, y) in enumerate(loader):
        dx = hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]
        dy = hashlib.sha256(y.numpy().tobytes()).hexdigest()[:16]
        print(epoch, step, dx, dy, flush=True)
