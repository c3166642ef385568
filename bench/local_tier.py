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
        [--bandwidth 400M] [--local-dir DIR | --local-disk 2G] [--build build]

With --local-disk BYTES/S (root) the local tier is on a disk of its own, capped too: an ext4 file
system on a loop device (image in /dev/shm) whose reads and writes the kernel caps at that rate
(bench/slow_storage.py LocalDisk, scripts/slow-storage --local-dir), the two caps apart as on a
node with NVMe under a parallel file system. Then each tiered run is also set against its limit:
per epoch, the longer of its storage bytes over --bandwidth and its local reads over
--local-disk (the agents' own counts, --stats-out), summed.
"""
import argparse
import json
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
    ap.add_argument("--local-disk", metavar="BYTES/S",
                    help="put the tier on an emulated local disk capped at this rate (root)")
    ap.add_argument("--build", default=os.path.join(os.path.dirname(__file__), "..", "build"))
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import slow_storage  # noqa: E402
    storage_bps = slow_storage.parse_size(a.bandwidth, "--bandwidth")
    solar = os.path.join(a.build, "cli", "solar")
    train = os.path.join(a.build, "slurm_examples", "solar-example-train")
    stored = os.path.join(a.build, "storage", "solar-stored")
    with tempfile.TemporaryDirectory(prefix="solar-bench-tier-") as tmp:
        data = os.path.join(tmp, "d.h5")
        subprocess.run([solar, "gen", data, "--samples", str(a.samples), "--preset", "small"],
                       check=True, capture_output=True)
        local = a.local_dir or os.path.join(tmp, "nvme")
        throttle = disk = None
        if a.local_disk:
            local_bps = slow_storage.parse_size(a.local_disk, "--local-disk")
            # A cgroup for the runs: no cap on the storage's disk (solar-stored caps the
            # storage), the emulated local disk capped both ways.
            throttle = slow_storage.Throttle(data, 2**50)
            disk = slow_storage.LocalDisk(local, 2 * a.samples * (256 << 10) + (256 << 20))
            throttle.add_device(disk.majmin, local_bps, local_bps)
        else:
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

            stats = os.path.join(tmp, "stats.json")

            def one(extra):
                p = subprocess.run([solar, "run", "-n", "4", "--nodes", "2", "--dataset",
                                    f"fabric://{addr}/d", "--buffer", "20%", *extra, "--epochs",
                                    str(a.epochs), "--batch", "8", "--stats-out", stats, "--",
                                    train], capture_output=True, text=True,
                                   preexec_fn=throttle.enter if throttle else None)
                ep = [list(map(float, m.split(","))) for m in
                      re.findall(r"each epoch: \[([^\]]*)\]", p.stdout + p.stderr)]
                if p.returncode != 0 or len(ep) != 4:
                    sys.exit(f"solar run failed ({p.returncode}):\n{p.stdout}{p.stderr}")
                with open(stats) as f:
                    nodes = json.load(f)["nodes"]
                return [max(r[e] for r in ep) for e in range(a.epochs)], nodes

            def limit(nodes):
                """Per epoch the slower of the storage's and the local disk's share (the
                busiest node), summed."""
                total = 0.0
                for e in range(a.epochs):
                    total += max(max(n["epochs"][e]["fetched_samples"] * n["sample_bytes"]
                                     / storage_bps,
                                     n["epochs"][e].get("local_samples", 0) * n["sample_bytes"]
                                     / local_bps) for n in nodes)
                return total

            mem, tier, limits = [], [], []
            for _ in range(a.runs):
                mem.append(one([])[0])
                t, nodes = one(["--local-buffer", "80%", "--local-dir", local])
                tier.append(t)
                if a.local_disk:
                    limits.append(limit(nodes))
        finally:
            srv.terminate()
            srv.wait()
            if disk:
                disk.close()
            if throttle:
                throttle.close()
    fmt = lambda rows: [[round(x, 3) for x in r] for r in rows]
    ratios = [sum(m) / sum(t) for m, t in zip(mem, tier)]
    print(f"{a.samples} samples of 256 KiB, storage {a.bandwidth}/s per agent, 2 nodes x 2 "
          f"ranks, memory 20%, local tier 80% ({'a disk capped at ' + a.local_disk + '/s' if a.local_disk else 'this machine' + chr(39) + 's disk'}), {a.epochs} epochs")
    print("memory only, s per epoch (slowest rank):", fmt(mem))
    print("with the local tier:                     ", fmt(tier))
    print("memory only / with the local tier, whole run, per pair:",
          [round(r, 2) for r in ratios], f"median {statistics.median(ratios):.2f}",
          f"worst {min(ratios):.2f}")
    if limits:
        of = [lim / sum(t) for lim, t in zip(limits, tier)]
        print(f"local disk capped at {a.local_disk}/s: with the local tier, limit / achieved per "
              f"run: {[round(x, 2) for x in of]}, median {statistics.median(of):.2f}, worst "
              f"{min(of):.2f}")


if __name__ == "__main__":
    main()
