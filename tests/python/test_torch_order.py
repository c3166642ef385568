# SPDX-License-Identifier: Apache-2.0
"""Live check against real PyTorch: with `--order torch` and the DistributedSampler
assignment (policy lru), every rank's batches in every epoch are exactly what
DataLoader(dataset, batch_size=b, sampler=DistributedSampler(..., seed=s), drop_last=d)
yields after set_epoch(e)."""
import csv
import io
from collections import defaultdict

import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402


@pytest.mark.parametrize("n,nodes,rpn,b,seed,drop", [
    (103, 2, 2, 5, 0, False),
    (103, 2, 2, 5, 9, True),
    (64, 1, 4, 16, 3, False),
    (1000, 3, 2, 7, 2**33 + 1, False),
])
def test_batches_match_pytorch(solar, tmp_path, n, nodes, rpn, b, seed, drop):
    f = tmp_path / "t.plan"
    epochs = 3
    args = ["plan", "--samples", n, "--epochs", epochs, "--nodes", nodes, "--ranks-per-node", rpn,
            "--batch", b, "--seed", seed, "--order", "torch", "--policy", "lru",
            "--sample-bytes", "1", "--buffer", str(rpn * b * 2), "--out", f]
    if drop:
        args.append("--drop-last")
    solar(*args)
    rows = csv.DictReader(io.StringIO(solar("plan-dump", f).stdout))
    ours = defaultdict(list)  # (epoch, rank, step) -> samples in order
    for r in rows:
        ours[(int(r["epoch"]), int(r["rank"]), int(r["step"]))].append(int(r["sample"]))
    world = nodes * rpn
    for e in range(epochs):
        for rank in range(world):
            sampler = DistributedSampler(list(range(n)), num_replicas=world, rank=rank,
                                         shuffle=True, seed=seed, drop_last=drop)
            sampler.set_epoch(e)
            loader = DataLoader(list(range(n)), batch_size=b, sampler=sampler, drop_last=drop)
            for step, batch in enumerate(loader):
                assert ours[(e, rank, step)] == batch.tolist(), (e, rank, step)
            assert (e, rank, step + 1) not in ours
