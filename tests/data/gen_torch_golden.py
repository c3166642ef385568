#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes tests/data/torch_sampler_golden.json from real PyTorch.

Each case is DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=True, seed=s,
drop_last=d) after set_epoch(e), for every rank. The C++ tests compare solar's torch order mode
with these vectors; tests/python/test_torch_order.py repeats the check live when torch imports.
Run with Debian's interpreter: /usr/bin/python3 tests/data/gen_torch_golden.py
"""
import json
import os
import sys

import torch
from torch.utils.data.distributed import DistributedSampler

CASES = [
    # n, world, seed, epoch, drop_last
    (10, 1, 0, 0, False),
    (10, 4, 0, 0, False),
    (10, 4, 0, 0, True),
    (203, 3, 42, 1, False),
    (203, 3, 42, 1, True),
    (800, 4, 7, 2, False),
    (1000, 8, 123456789, 5, False),
    (4099, 16, 2**40 + 5, 3, True),
    (50000, 4, 3, 0, False),
]


def main():
    out = {"torch_version": torch.__version__, "cases": []}
    for n, w, seed, epoch, drop in CASES:
        ranks = []
        for r in range(w):
            s = DistributedSampler(list(range(n)), num_replicas=w, rank=r, shuffle=True,
                                   seed=seed, drop_last=drop)
            s.set_epoch(epoch)
            ranks.append(list(s))
        out["cases"].append({"n": n, "world": w, "seed": seed, "epoch": epoch,
                             "drop_last": drop, "ranks": ranks})
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_sampler_golden.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
