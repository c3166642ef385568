#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The plugin's added start-up time per step, for the `cosmoflow` plan size (47,616 samples,
20 epochs, 8 nodes x 4 ranks, batch 16, 6.25% buffer): `srun true` with and without --solar-*
on a private 8-node test cluster, several runs each, medians. Not a ctest test (it takes a few
minutes and measures time); run as root from the repository root after building build-spank:

    /usr/bin/python3 spank/tests/measure_startup.py [BUILD_DIR] [RUNS]
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(repo, "build-spank"))
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 5
root = tempfile.mkdtemp(prefix="spank-startup-", dir=build)
os.chmod(root, 0o755)
env = dict(os.environ, SOLAR_CLUSTER_DIR=os.path.join(root, "cluster"), SOLAR_CLUSTER_NODES="8",
           SOLAR_SPANK=os.path.join(build, "spank", "solar_spank.so"),
           SOLAR_AGENT=os.path.join(build, "agent", "solar-agent"))
env["SLURM_CONF"] = os.path.join(env["SOLAR_CLUSTER_DIR"], "slurm.conf")
cluster = os.path.join(repo, "scripts", "test-cluster")


def idle():
    out = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], env=env,
                         capture_output=True, text=True).stdout.split()
    return len(set(out)) == 8


def timed(args):
    while not idle():
        time.sleep(0.1)
    t0 = time.monotonic()
    p = subprocess.run(args, env=env, capture_output=True, text=True, cwd=root)
    dt = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{p.stderr}")
    return dt, p.stderr


try:
    subprocess.run([cluster, "up"], env=env, check=True)
    data = os.path.join(root, "cosmoflow-shape.h5")
    subprocess.run([os.path.join(build, "cli", "solar"), "gen", data, "--samples", "47616",
                    "--preset", "tiny", "--no-progress"], check=True)
    base = ["srun", "-N8", "--ntasks-per-node=4"]
    solar = ["--solar-dataset=" + data, "--solar-buffer=6.25%", "--solar-epochs=20",
             "--solar-batch=16", "--solar-verbose"]
    plain, with_solar = [], []
    for _ in range(runs):
        plain.append(timed(base + ["true"])[0])
        dt, err = timed(base + solar + ["true"])
        with_solar.append(dt)
    last = [l for l in err.splitlines() if "planned in" in l or "ready in" in l]
    print("\n".join(last[:3]))
    print(f"srun -N8 --ntasks-per-node=4 true, {runs} runs: median {statistics.median(plain):.3f} s "
          f"without solar, {statistics.median(with_solar):.3f} s with --solar-* "
          f"(added {statistics.median(with_solar) - statistics.median(plain):.3f} s)")
finally:
    subprocess.run([cluster, "down"], env=env)
    shutil.rmtree(root, ignore_errors=True)
