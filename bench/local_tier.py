#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The local tier against memory only (issue 37), side by side in one run.

A dataset 5x the agents' memory (--buffer 20%) served by solar-stored with a per-client
bandwidth cap (--throttle-bandwidth, default 400M: the remote storage), read by
solar-example-train ranks in batch mode, 2 nodes x 2 ranks: memory only against memory plus a
local tier for the rest (--local-buffer 80%, in --local-dir, this machine's disk, not capped).
Runs alternate, pair by pair; per run the epoch's loading time is the slowest rank's. Prints
each run's epochs, and per pair memory-only / tiered over the whole run (median, worst).

    /usr/bin/python3 bench/local_tier.py [--samples 2048] [--epochs 5] [--runs 5]
        [--bandwidth 400M] [--local-dir DIR] [--build build]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=2048, help="256 KiB samples [2048: 512 MiB]")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--runs", type=int, default=5, help="pairs of runs [5]")
    ap.add_argument("--bandwidth", default="400M", help="storage cap per agent [400M]")
    ap.add_argument("--local-dir", help="folder on the local disk [a temporary folder]")
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    a = ap.parse_args()
    solar = os.path.join(a.build, "cli", "solar")
    train = os.path.join(a.build, "slurm_examples", "solar-example-train")
    stored = os.path.join(a.build, "storage", "solar-stored")
    with tempfile.TemporaryDirectory(prefix="solar-bench-tier-") as tmp:
        data = os.path.join(tmp, "d.h5")
        subprocess.run([solar, "gen", data, "--samples", str(a.samples), "--preset", "small"],
                       check=True, capture_output=True)
        local = a.local_dir or os.path.join(tmp, "nvme")
        os.makedirs(local, exist_ok=True)
        ready = os.path.join(tmp, "ready")
        srv = subprocess.Popen([stored, "--export", f"d={data}:/data", "--throttle-bandwidth",
                                a.bandwidth, "--ready-file", ready],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 30
            while not (os.path.exists(ready) and open(ready).read().strip()):
                if time.monotonic() > deadline or srv.poll() is not None:
                    sys.exit("solar-stored did not start")
                time.sleep(0.05)
            addr = open(ready).read().strip()

            def one(extra):
                p = subprocess.run([solar, "run", "-n", "4", "--nodes", "2", "--dataset",
                                    f"fabric://{addr}/d", "--buffer", "20%", *extra, "--epochs",
                                    str(a.epochs), "--batch", "8", "--", train],
                                   capture_output=True, text=True)
                ep = [list(map(float, m.split(","))) for m in
                      re.findall(r"each epoch: \[([^\]]*)\]", p.stdout + p.stderr)]
                if p.returncode != 0 or len(ep) != 4:
                    sys.exit(f"solar run failed ({p.returncode}):\n{p.stdout}{p.stderr}")
                return [max(r[e] for r in ep) for e in range(a.epochs)]

            mem, tier = [], []
            for _ in range(a.runs):
                mem.append(one([]))
                tier.append(one(["--local-buffer", "80%", "--local-dir", local]))
        finally:
            srv.terminate()
            srv.wait()
    fmt = lambda rows: [[round(x, 3) for x in r] for r in rows]
    ratios = [sum(m) / sum(t) for m, t in zip(mem, tier)]
    print(f"{a.samples} samples of 256 KiB, storage {a.bandwidth}/s per agent, 2 nodes x 2 "
          f"ranks, memory 20%, local tier 80%, {a.epochs} epochs")
    print("memory only, s per epoch (slowest rank):", fmt(mem))
    print("with the local tier:                     ", fmt(tier))
    print("memory only / with the local tier, whole run, per pair:",
          [round(r, 2) for r in ratios], f"median {statistics.median(ratios):.2f}",
          f"worst {min(ratios):.2f}")


if __name__ == "__main__":
    main()
