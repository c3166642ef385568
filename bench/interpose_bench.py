#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The interposer's own costs, one process, ratios from one run:

- a resident read: pread of 256 KiB samples served from the agent's buffer by
  libsolar_preload.so, against memcpy of the same samples in the same process (target: >= 80%);
- miss-only overhead: the same preads under the preload when nothing is served — no agent at
  all, and an agent whose buffer holds only a few samples — against plain preads of the same
  file from the page cache (target: <= 3%).

    /usr/bin/python3 bench/interpose_bench.py [--samples 200] [--preset small] [--repeat 5]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def build_paths(build):
    b = os.path.abspath(build or os.path.join(REPO, "build"))
    paths = {"solar": os.path.join(b, "cli", "solar"),
             "reader": os.path.join(b, "bench", "solar-interpose-read"),
             "preload": os.path.join(b, "interpose", "libsolar_preload.so")}
    for name, p in paths.items():
        if not os.path.exists(p):
            sys.exit(f"interpose bench: {p} is missing; build first (scripts/build) or --build DIR")
    return paths


def measure(cmd, env=None):
    """(pread GB/s, memcpy GB/s) of one interpose_read run."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"interpose bench: {' '.join(map(str, cmd))} failed:\n{p.stdout}\n{p.stderr}")
    line = [l for l in p.stdout.splitlines() if l and l[0].isdigit()][-1]
    reads, nbytes, t_read, t_copy, _ = line.split()
    return int(nbytes) / float(t_read) / 1e9, int(nbytes) / float(t_copy) / 1e9, p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--preset", default="small", help="solar gen preset [small: 256 KiB]")
    ap.add_argument("--passes", type=int, default=20, help="reads of every sample per run [20]")
    ap.add_argument("--repeat", type=int, default=5, help="runs per mode, median reported [5]")
    ap.add_argument("--build", help="build directory [./build]")
    a = ap.parse_args()
    paths = build_paths(a.build)
    tmp = tempfile.mkdtemp(prefix="solar-ibench-")
    try:
        data = os.path.join(tmp, "d.h5")
        subprocess.run([paths["solar"], "gen", data, "--samples", str(a.samples), "--preset",
                        a.preset, "--no-progress"], check=True, capture_output=True)
        import h5py
        with h5py.File(data, "r") as f:
            offset = f["data"].id.get_offset()
            sample_bytes = f["data"][0].nbytes
        reader = [paths["reader"], data, str(offset), str(sample_bytes), str(a.samples),
                  str(a.passes)]
        with open(data, "rb") as f:  # the plain reads come from the page cache
            while f.read(1 << 24):
                pass
        # Waits until the node agent holds every sample, then runs the reader.
        wait = os.path.join(tmp, "wait-resident.sh")
        with open(wait, "w") as f:
            f.write(f"#!/bin/sh\nuntil {paths['solar']} stat \"$SOLAR_SOCKET\" --json | "
                    f"{sys.executable} -c 'import json,sys; s=json.load(sys.stdin); "
                    "sys.exit(s[\"ready_steps\"] < s[\"total_steps\"])'; do sleep 0.05; done\n"
                    "exec \"$@\"\n")
        os.chmod(wait, 0o755)
        env = dict(os.environ, TMPDIR=tmp)

        def under_agent(buffer, resident):
            # resident: wait until the agent holds every sample. Otherwise (a buffer of a few
            # samples) the agent holds what fits and stops there, since this reader does not
            # follow the plan: nearly every read misses after an index lookup.
            cmd = [paths["solar"], "run", "-n", "1", "--dataset", data, "--epochs", "1",
                   "--batch", "1", "--buffer", buffer, "--transparent", "--",
                   *([wait] if resident else []), *reader]
            return measure(cmd, env)

        no_agent_env = dict(env, LD_PRELOAD=paths["preload"], SOLAR_DATASET=data,
                            SOLAR_SOCKET=os.path.join(tmp, "nobody-listens.sock"))
        modes = {"plain": lambda: measure(reader, env),
                 "resident": lambda: under_agent("1G", True),
                 "no agent": lambda: measure(reader, no_agent_env),
                 "3-sample buffer": lambda: under_agent(str(3 * (sample_bytes + 4096)), False)}
        results = {m: [] for m in modes}
        for _ in range(a.repeat):  # in rotation: drifts in load hit every mode alike
            for m, run in modes.items():
                results[m].append(run()[:2])
        med = {m: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
               for m, rs in results.items()}
        print(f"{a.samples} samples of {sample_bytes} B, {a.passes} passes each, median of "
              f"{a.repeat} runs per mode (pread GB/s, memcpy GB/s in the same process):")
        for m, (r, c) in med.items():
            print(f"  {m:16s} pread {r:6.2f} GB/s   memcpy {c:6.2f} GB/s")
        r, c = med["resident"]
        print(f"resident read through the interposer: {r / c:.2f} of memcpy (target >= 0.80)")
        base = med["plain"][0]
        for m in ("no agent", "3-sample buffer"):
            print(f"miss-only overhead, {m}: {(base / med[m][0] - 1) * 100:+.1f}% over plain "
                  f"preads (target <= 3%)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
