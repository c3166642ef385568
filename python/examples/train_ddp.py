#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A DDP training script on solar.torch.Loader, with checkpoints that resume mid-epoch.

    solar gen data.h5 --samples 800 --preset tiny
    solar run --nodes 2 --ranks-per-node 2 --dataset data.h5 --epochs 3 --batch 16 -- \\
        python3 train_ddp.py --checkpoint ckpt.pt --stop-after-step 20     # "preempted"
    solar run ... (the same) -- python3 train_ddp.py --checkpoint ckpt.pt  # resumes at step 21

What differs from a DataLoader + DistributedSampler script: the loader line (batch size, seed,
epochs and this rank's share come from the plan), `loader.set_epoch` instead of
`sampler.set_epoch`, and the loader's state in the checkpoint. Rank 0 saves the checkpoint;
every rank loads it: the loader's state is the run's global step, the same on every rank.

--log DIR writes DIR/rank-R.txt, one line per step: "step epoch label_dtype sha1(data) sha1(labels)
indices...", and a last line "params sha1(model parameters)". --stop-after-step N saves a
checkpoint after step N and exits (a preempted job).
"""
import argparse
import hashlib
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import solar
import solar.torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", help="resume from this file if it exists; save to it")
    ap.add_argument("--stop-after-step", type=int, help="checkpoint after this global step, exit")
    ap.add_argument("--log", help="directory for per-rank step logs")
    ap.add_argument("--classes", type=int, default=10)
    a = ap.parse_args()

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same arithmetic in every run: resumed runs end identical
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT: set by solar run / srun

    loader = solar.torch.Loader()  # was: DataLoader(dataset, batch_size=.., sampler=DistributedSampler(..))
    rank = dist.get_rank()
    assert rank == loader.rank and dist.get_world_size() == loader.world_size
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(int(torch.Size(loader.shape).numel()), a.classes)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)

    start_epoch = 0
    if a.checkpoint and os.path.exists(a.checkpoint):
        ckpt = torch.load(a.checkpoint)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])  # the next batch is the one after the saved step
        start_epoch = ckpt["epoch"]

    log = open(os.path.join(a.log, f"rank-{rank}.txt"), "a") if a.log else None
    try:
        return train(a, loader, model, opt, start_epoch, rank, log)
    finally:
        if log:
            log.close()


def train(a, loader, model, opt, start_epoch, rank, log):
    if log:
        log.write(f"library {solar.library_path} agent {int(loader.using_agent)} "
                  f"batch_size {loader.batch_size} samples {len(loader.dataset)}\n")
    for epoch in range(start_epoch, loader.epochs):
        loader.set_epoch(epoch)  # was: sampler.set_epoch(epoch)
        for batch in loader:
            x, y = batch  # data (len, *shape) and int64 labels, as a DataLoader gives them
            loss = F.cross_entropy(model(x.float()), y % a.classes) * batch.weight
            opt.zero_grad()
            loss.backward()
            opt.step()
            if log:
                log.write(f"{batch.step} {batch.epoch} {y.dtype} "
                          f"{hashlib.sha1(x.numpy().tobytes()).hexdigest()} "
                          f"{hashlib.sha1(y.numpy().tobytes()).hexdigest()} "
                          + " ".join(map(str, batch.indices.tolist())) + "\n")
            if batch.step == a.stop_after_step:
                if rank == 0:
                    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                                "loader": loader.state_dict(), "epoch": epoch}, a.checkpoint)
                dist.barrier()
                print(f"rank {rank}: checkpoint after step {batch.step}, stopping", flush=True)
                return 0
    if log:
        params = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
        log.write(f"params {hashlib.sha1(params).hexdigest()}\n")
    print(f"rank {rank}: done, {'from the node agent' if loader.using_agent else 'read directly'}",
          flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
