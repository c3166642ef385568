#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Demand mode's eviction policy (issue 38 item 2; agent/src/demand_cache.h): a node buffer of a
share of the dataset, filled from the reads of a script whose order solar is not told, under
two policies, replayed over orders a training script really reads:

  static  keep the first samples read until the buffer is full, then nothing changes (what
          the agent does)
  lru     on a miss, evict the least recently read sample

and Belady's clairvoyant optimum (of the held samples and the incoming one, the one read again
last is not kept) as the bound a plan reaches when it knows the order. Orders:

  shuffle     a new permutation every epoch (DistributedSampler, the artifact's shuffle lists)
  weighted    WeightedRandomSampler with replacement, weights Zipf-like (s = 1)
  sliding     a curriculum: epoch e reads a window of half the dataset that moves by an eighth
              each epoch, shuffled within

Prints each policy's hit rate over the epochs after the first. Example:
  bench/demand_policies.py --samples 20000 --epochs 5 --share 0.26 0.5 0.64
"""
import argparse
import collections
import json
import math
import sys

import numpy as np


def orders(kind, n, epochs, rng):
    if kind == "shuffle":
        return [rng.permutation(n) for _ in range(epochs)]
    if kind == "weighted":
        w = 1.0 / np.arange(1, n + 1)
        w /= w.sum()
        ids = rng.permutation(n)  # which samples are the heavy ones
        return [ids[rng.choice(n, size=n, p=w)] for _ in range(epochs)]
    if kind == "sliding":
        width, step = n // 2, n // 8
        return [rng.permutation(np.arange(e * step, e * step + width) % n) for e in range(epochs)]
    raise ValueError(kind)


def static(seq, cap):
    held, hits = set(), []
    for x in seq:
        hit = x in held
        if not hit and len(held) < cap:
            held.add(x)
        hits.append(hit)
    return hits


def lru(seq, cap):
    held, hits = collections.OrderedDict(), []
    for x in seq:
        hit = x in held
        if hit:
            held.move_to_end(x)
        else:
            if len(held) >= cap:
                held.popitem(last=False)
            held[x] = True
        hits.append(hit)
    return hits


def belady(seq, cap):
    nxt = [0] * len(seq)  # the next position each access's sample is read again
    last = {}
    for i in range(len(seq) - 1, -1, -1):
        nxt[i] = last.get(seq[i], math.inf)
        last[seq[i]] = i
    import heapq
    held, heap, hits = {}, [], []  # held: sample -> its next use; heap of (-next use, sample)
    for i, x in enumerate(seq):
        hit = x in held
        hits.append(hit)
        if not hit and len(held) >= cap:
            while -heap[0][0] != held.get(heap[0][1]):  # entries no longer current
                heapq.heappop(heap)
            if -heap[0][0] <= nxt[i]:  # the incoming sample is needed last: not kept
                continue
            del held[heapq.heappop(heap)[1]]
        held[x] = nxt[i]
        heapq.heappush(heap, (-nxt[i], x))
    return hits


POLICIES = {"static": static, "lru": lru, "belady": belady}


def measure(kind, n, epochs, share, seed=0):
    rng = np.random.default_rng(seed)
    seq = [int(x) for o in orders(kind, n, epochs, rng) for x in o]
    cap = max(1, int(share * n))
    out = {}
    for name, policy in POLICIES.items():
        h = policy(seq, cap)
        later = h[n:]  # the epochs after the first (every order reads n samples an epoch)
        out[name] = sum(later) / len(later)
    return out


def lru_shuffle_estimate(share):
    """LRU over independent permutations: a sample at fraction p of one epoch and q of the next
    is still held when the samples read in between, about N(1 - (p)(1 - q))... fewer than the
    buffer: P(p(1 - q) > 1 - f) = f + (1 - f) ln(1 - f) for uniform p, q."""
    t = 1 - share
    return share + t * math.log(t) if t > 0 else 1.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--share", type=float, nargs="+", default=[0.26, 0.5, 0.64],
                    help="the buffer's share of the dataset (0..1)")
    ap.add_argument("--orders", nargs="+", default=["shuffle", "weighted", "sliding"],
                    choices=["shuffle", "weighted", "sliding"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    a = ap.parse_args(argv)
    if a.samples < 8 or a.epochs < 2 or not all(0 < s <= 1 for s in a.share):
        ap.error("--samples at least 8, --epochs at least 2, --share in (0, 1]")
    rows = []
    for kind in a.orders:
        for share in a.share:
            r = measure(kind, a.samples, a.epochs, share, a.seed)
            rows.append({"order": kind, "share": share, **r})
    if a.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    print(f"hit rate over epochs 2..{a.epochs}, {a.samples} samples")
    print(f"{'order':9} {'share':>6} {'static':>7} {'lru':>7} {'belady':>7}  better")
    for r in rows:
        better = ("tie" if abs(r["static"] - r["lru"]) < 0.005
                  else "static" if r["static"] > r["lru"] else "lru")
        print(f"{r['order']:9} {r['share']:6.2f} {100 * r['static']:6.1f}% {100 * r['lru']:6.1f}% "
              f"{100 * r['belady']:6.1f}%  {better}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
