#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Issue 40's start-up figure: a step of 10^6 samples x 100 epochs (10^8 accesses) on the
private test cluster, 2 nodes x 2 ranks, each rank taking its first batch and exiting
(solar-example-train --batches 1): srun's wall time from launch to the step's end, and the
largest file in plan_dir while the ranks ran, with --solar-plan=streamed against
--solar-plan=whole, in interleaved runs (median and worst). Not a ctest test (it takes
minutes and measures time); run as root from the repository root after building:

    /usr/bin/python3 spank/tests/measure_plan_startup.py [BUILD_DIR] [RUNS]
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "build"))
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
root = tempfile.mkdtemp(prefix="spank-plan-startup-", dir=build)
os.chmod(root, 0o755)
env = dict(os.environ, SOLAR_CLUSTER_DIR=os.path.join(root, "cluster"), SOLAR_CLUSTER_NODES="2",
           SOLAR_SPANK=os.path.join(build, "spank", "solar_spank.so"),
           SOLAR_AGENT=os.path.join(build, "agent", "solar-agent"),
           SOLAR_BIN=os.path.join(build, "cli", "solar"))
env["SLURM_CONF"] = os.path.join(env["SOLAR_CLUSTER_DIR"], "slurm.conf")
cluster = os.path.join(repo, "scripts", "test-cluster")
train = os.path.join(build, "slurm_examples", "solar-example-train")
plans = os.path.join(env["SOLAR_CLUSTER_DIR"], "plans")


def idle():
    out = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], env=env,
                         capture_output=True, text=True).stdout.split()
    return len(set(out)) == 2


def step(mode, data, listing):
    while not idle():
        time.sleep(0.1)
    t0 = time.monotonic()
    p = subprocess.run(
        ["srun", "-N2", "--ntasks-per-node=2", f"--solar-dataset={data}:/data",
         "--solar-buffer=10%", "--solar-epochs=100", "--solar-batch=32", f"--solar-plan={mode}",
         "sh", "-c", f'[ "$SLURM_PROCID" = 0 ] && find {plans} -type f -printf "%s\\n" '
         f'> {listing}; exec "$0" "$@"', train, "--verify", "--batches", "1"],
        env=env, capture_output=True, text=True, cwd=root)
    dt = time.monotonic() - t0
    if p.returncode != 0 or (p.stdout + p.stderr).count("verified (0 wrong)") != 4:
        raise SystemExit(f"the {mode} step failed:\n{p.stdout}{p.stderr}")
    with open(listing) as f:
        largest = max(int(l) for l in f)
    return dt, largest


try:
    subprocess.run([cluster, "up"], env=env, check=True)
    data = os.path.join(root, "million.h5")
    subprocess.run([env["SOLAR_BIN"], "gen", data, "--samples", "1000000", "--shape", "16",
                    "--dtype", "int16", "--no-progress"], check=True)
    os.chmod(data, 0o644)
    listing = os.path.join(root, "listing.txt")
    times = {"streamed": [], "whole": []}
    largest = {"streamed": 0, "whole": 0}
    for i in range(runs):
        for mode in ("streamed", "whole"):
            dt, big = step(mode, data, listing)
            times[mode].append(dt)
            largest[mode] = max(largest[mode], big)
            print(f"run {i + 1} {mode}: {dt:.2f} s, largest file in plan_dir {big} bytes",
                  flush=True)
    for mode in ("streamed", "whole"):
        print(f"{mode:>8}: launch to the step's end (first batch, then exit), {runs} runs: "
              f"median {statistics.median(times[mode]):.2f} s, worst {max(times[mode]):.2f} s; "
              f"largest file in plan_dir {largest[mode]} bytes")
    ratio = [w / s for s, w in zip(times["streamed"], times["whole"])]
    print(f"whole / streamed, pair by pair: median {statistics.median(ratio):.1f}x, "
          f"worst {min(ratio):.1f}x")
finally:
    subprocess.run([cluster, "down"], env=env)
    shutil.rmtree(root, ignore_errors=True)
