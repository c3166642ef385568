#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A rank program for the tests: iterates every epoch through solar.Loader (or
solar.torch.Loader), checks every sample's bytes and label against solar gen's content, and
records each step's samples and weight.

  rank_check.py --record DIR [--torch] [--views]
Writes DIR/rank-R.txt: one line per step "step epoch weight idx idx ...". Exit 3 on bad data."""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from content import expected  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--record", required=True)
    ap.add_argument("--torch", action="store_true")
    ap.add_argument("--views", action="store_true", help="also check the zero-copy views")
    ap.add_argument("--library", help="libsolar.so to use (solar run drops SOLAR_* variables)")
    ap.add_argument("--stop-after-step", type=int,
                    help="after this global step, save state_dict() as JSON (--state) and stop")
    ap.add_argument("--state", help="the state file (%%r: the rank): written with "
                    "--stop-after-step, else loaded (load_state_dict) when it exists")
    a = ap.parse_args()
    if a.library:
        os.environ["SOLAR_LIBRARY"] = a.library
    import solar
    import solar.loader
    if a.torch:
        import solar.torch
        loader = solar.torch.Loader()
    else:
        loader = solar.Loader()
    import h5py
    path, _ = solar.loader.split_dataset_spec(os.environ["SOLAR_DATASET"])
    with h5py.File(path, "r") as f:
        seed = int(f["data"].attrs["solar_seed"])
    bad = batches = 0
    state = a.state.replace("%r", str(loader.rank)) if a.state else None
    if state and a.stop_after_step is None and os.path.exists(state):
        import json
        with open(state) as f:
            loader.load_state_dict(json.load(f))
    stopped = False
    with loader, open(os.path.join(a.record, f"rank-{loader.rank}.txt"), "w") as rec:
        for epoch in range(loader.epoch, loader.epochs):
            if stopped:
                break
            loader.set_epoch(epoch)
            kept = []  # this epoch's copies: none may change while held (pooled memory)
            for batch in loader:
                data, labels = batch
                kept.append((batch.indices.copy(), data))
                data, labels = np.asarray(data), np.asarray(labels)
                assert data.shape == (len(batch),) + loader.shape
                for k, idx in enumerate(batch.indices):
                    raw, label = expected(seed, int(idx), loader.sample_bytes)
                    ok = data[k].tobytes() == raw and int(labels[k]) == label
                    if a.views:
                        ok = ok and np.asarray(batch.sample(k)).tobytes() == raw
                    bad += not ok
                rec.write(f"{batch.step} {batch.epoch} {batch.weight!r} "
                          + " ".join(map(str, batch.indices)) + "\n")
                batches += 1
                if a.stop_after_step is not None and batch.step == a.stop_after_step:
                    import json
                    with open(state, "w") as f:
                        json.dump(loader.state_dict(), f)
                    stopped = True
                    break
            for indices, data in kept:
                for k, idx in enumerate(indices):
                    bad += np.asarray(data[k]).tobytes() != expected(seed, int(idx),
                                                                     loader.sample_bytes)[0]
        where = "from the node agent" if loader.using_agent else "read directly"
    print(f"rank {loader.rank}: {batches} batches, {bad} wrong, {where}")
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
