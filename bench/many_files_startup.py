#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Start-up against the number of files (issue 35), and what reaches the file system per sample.

    /usr/bin/python3 bench/many_files_startup.py                      # 10^3, 10^4, 10^5 files
    /usr/bin/python3 bench/many_files_startup.py --files 1000,10000 --runs 3
    /usr/bin/python3 bench/many_files_startup.py --skip-startup       # the per-sample syscalls only

Part 1, start-up. For each count N, a dataset of N tiny files in the SOLAR artifact's layout
(`solar gen --layout per-sample-files --shape 1,8,8`: one 128-byte sample a file, /split and
/unitPar; generating it is not measured) and, --runs times each:
  - `solar dataset-info DIR/:/split --labels /unitPar --index-out F` (what srun's plugin runs
    once per job step): wall time, peak RSS (/usr/bin/time %M), the index file's size;
    first with an empty index cache (every file opened and checked), then again (the next
    job: the last scan from $SOLAR_INDEX_CACHE, a stat a file), each run with its own cache;
  - `solar run --nodes 1 -n 1 ... -v -- solar-example-train --quiet` under `ulimit -n` of
    --nofile (1024): launch to the first batch and its parts as solar run prints them (solar
    start, plan: the dataset listed, checked and indexed and the plan computed; agent start:
    reading the index; ranks start; first fill), its indexing time, its peak RSS (the largest
    of solar run, its agent and rank), first and again as for dataset-info.
The medians of the runs are shown (the peak RSS: the largest), with the per-file cost in µs
(time / N) and an estimate for 10^6 files: the largest count's per-file cost times 10^6. The
files' metadata is in the inode cache (just written), as in a job's second step; a cold shared
file system costs its own stat latency per file on top.

Part 2, per sample: the artifact's rank script (bench/pytorch_io.py --rank baseline: one
h5py.File opened and closed per __getitem__) over a per-sample-files dataset of --preset
small (256 KiB) samples, 1 rank, 2 epochs, all samples, plain and under `solar run
--transparent` with the whole dataset resident (buffer 100%), the rank under `strace -f -y`:
each syscall on a dataset file (openat, reads, fstat) counted and divided by the samples read;
a read of at least a sample's bytes counts as a sample read, any shorter one as a metadata
read. The transparent run's own counters (--stats-out: interposer opens, reads served, reads
fallen through) are printed beside them. Syscalls strace sees reached the kernel: a read the
interposer serves from the buffer is no syscall.
"""
import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import pytorch_io as io  # noqa: E402  (find_build, the artifact's layout names)

SPEC_ARRAY = ":/" + io.ARTIFACT_ARRAY
LABELS = "/" + io.ARTIFACT_LABELS


def spec_of(folder):
    return os.path.join(folder, "") + SPEC_ARRAY


def gen(tool, out, samples, *shape_args):
    subprocess.run([tool, "gen", out, "--layout", "per-sample-files", "--samples", str(samples),
                    *shape_args, "--no-progress"], check=True, capture_output=True, text=True)


def timed(cmd, nofile=None, env=None):
    """(wall seconds, peak RSS in KiB, combined output) of cmd, or exits naming it."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as t:
        limit = None
        if nofile:
            def limit():
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        t0 = time.monotonic()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", t.name, *cmd], text=True,
                           capture_output=True, preexec_fn=limit,
                           env=dict(os.environ, **(env or {})))
        wall = time.monotonic() - t0
        if p.returncode != 0:
            sys.exit(f"many_files_startup: {' '.join(cmd)} failed ({p.returncode}):\n"
                     f"{p.stdout}\n{p.stderr}")
        rss = int(t.read().split()[-1])
    return wall, rss, p.stdout + p.stderr


STARTUP_PARTS = ("solar start", "plan", "agent start", "ranks start", "first fill")


def parse_run(log):
    """solar run -v's start-up figures: {first_batch, indexed, <part>: seconds}."""
    out = {}
    m = re.search(r"start-up: launch to first batch ([\d.]+) s", log)
    if not m:
        sys.exit(f"many_files_startup: no 'launch to first batch' line in solar run's output:\n"
                 f"{log}")
    out["first_batch"] = float(m.group(1))
    m = re.search(r"dataset: \d+ files, \d+ samples, indexed in ([\d.]+) s", log)
    out["indexed"] = float(m.group(1)) if m else None
    for part in STARTUP_PARTS:
        m = re.search(rf"^solar run:\s+{part}\s+([\d.]+) s", log, re.M)
        out[part] = float(m.group(1)) if m else None
    return out


def median_of(runs):
    return {k: statistics.median(r[k] for r in runs) if runs[0][k] is not None else None
            for k in runs[0]}


# A job's first scan of a dataset opens every file; the next job over the same files finds the
# last scan in the user's index cache ($SOLAR_INDEX_CACHE) and stats each file instead.
JOBS = ("first", "again")


def startup(tool, build, a, tmp):
    train = os.path.join(build, "slurm_examples", "solar-example-train")
    if not os.access(train, os.X_OK):
        sys.exit(f"many_files_startup: {train} is missing: build the target solar-example-train")
    rows = []
    for n in [int(x) for x in a.files.split(",")]:
        folder = os.path.join(tmp, f"files-{n}")
        t0 = time.monotonic()
        gen(tool, folder, n, "--shape", "1,8,8")
        gen_s = time.monotonic() - t0
        index = os.path.join(tmp, f"files-{n}.index")
        info = {j: [] for j in JOBS}
        runs = {j: [] for j in JOBS}
        rss = {"info": 0, "run": 0}
        for k in range(a.runs):
            for what in ("info", "run"):
                # A cache of its own for each command and run: the first job scans, the next
                # finds the index.
                env = {"SOLAR_INDEX_CACHE": os.path.join(tmp, f"cache-{n}-{what}-{k}")}
                for job in JOBS:
                    if what == "info":
                        wall, peak, _ = timed([tool, "dataset-info", spec_of(folder), "--labels",
                                               LABELS, "--index-out", index], env=env)
                        info[job].append(wall)
                    else:
                        wall, peak, log = timed(
                            [tool, "run", "--nodes", "1", "-n", "1", "--dataset",
                             spec_of(folder), "--labels", LABELS, "--buffer", "100%",
                             "--epochs", "1", "--batch", "16", "-v", "--", train, "--quiet"],
                            nofile=a.nofile, env=env)
                        runs[job].append(parse_run(log) | {"wall": wall})
                    if job == "first":
                        rss[what] = max(rss[what], peak)
        row = {"files": n, "gen_s": gen_s, "index_bytes": os.path.getsize(index),
               "info_rss_kib": rss["info"], "run_rss_kib": rss["run"]}
        for job in JOBS:
            row[f"info_{job}_s"] = statistics.median(info[job])
            row[f"info_{job}_runs_s"] = info[job]
            row[f"run_{job}"] = median_of(runs[job])
            row[f"run_{job}_runs"] = runs[job]
        rows.append(row)
        print(f"{n} files (generated in {gen_s:.1f} s, not counted): dataset-info first "
              + ", ".join(f"{x:.3f}" for x in info["first"]) + " s, again "
              + ", ".join(f"{x:.3f}" for x in info["again"]) + " s; solar run first batch, "
              "first job " + ", ".join(f"{r['first_batch']:.3f}" for r in runs["first"])
              + " s, again " + ", ".join(f"{r['first_batch']:.3f}" for r in runs["again"])
              + " s", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    print()
    print(f"Start-up against the number of files (medians of {a.runs} runs; peak RSS: the "
          f"largest, first jobs; 'first': a fresh index cache, every file opened and checked; "
          f"'again': the next job, the last scan in the index cache, a stat a file; files' "
          f"inodes in the kernel's cache):")
    head = ("| files | dataset-info --index-out, first | µs/file | again | µs/file | peak RSS "
            "| index file |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        n = r["files"]
        print(f"| {n} | {r['info_first_s']:.3f} s | {1e6 * r['info_first_s'] / n:.1f} | "
              f"{r['info_again_s']:.3f} s | {1e6 * r['info_again_s'] / n:.1f} | "
              f"{r['info_rss_kib'] / 1024:.1f} MiB | {r['index_bytes'] / 1024:.0f} KiB "
              f"({r['index_bytes'] / n:.0f} B/file) |")
    print()
    head = ("| files | job | solar run: launch to first batch | plan (index + plan) | µs/file "
            "| agent start | ranks start | first fill | peak RSS |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        n = r["files"]
        for job in JOBS:
            m = r[f"run_{job}"]
            print(f"| {n} | {job} | {m['first_batch']:.3f} s | {m['plan']:.3f} s | "
                  f"{1e6 * m['plan'] / n:.1f} | {m['agent start']:.3f} s | "
                  f"{m['ranks start']:.3f} s | {m['first fill']:.3f} s | " +
                  (f"{r['run_rss_kib'] / 1024:.1f} MiB |" if job == "first" else "|"))
    # 10^6 by a line through the two largest counts: a fixed part (libraries, launch) and a
    # part per file; with one count, all of it per file.
    zero = {"files": 0, "info_first_s": 0, "info_again_s": 0, "info_rss_kib": 0,
            "index_bytes": 0, "run_first": {"plan": 0, "first_batch": 0},
            "run_again": {"plan": 0, "first_batch": 0}}
    lo, hi = (rows[-2], rows[-1]) if len(rows) > 1 else (zero, rows[-1])

    def at_million(get):
        slope = (get(hi) - get(lo)) / (hi["files"] - lo["files"])
        return get(hi) + slope * (10**6 - hi["files"]), slope

    est = {}
    for key, get in {"dataset-info, first": lambda r: r["info_first_s"],
                     "dataset-info, again": lambda r: r["info_again_s"],
                     "solar run's first batch, first job": lambda r: r["run_first"]["first_batch"],
                     "solar run's first batch, again": lambda r: r["run_again"]["first_batch"],
                     }.items():
        est[key] = at_million(get)
    rss, _ = at_million(lambda r: r["info_rss_kib"])
    index, _ = at_million(lambda r: r["index_bytes"])
    print(f"10^6 files, an ESTIMATE (not measured: a line through the {lo['files']}- and "
          f"{hi['files']}-file figures): " +
          ", ".join(f"{k} {v:.1f} s ({1e6 * per:.1f} µs a file)" for k, (v, per) in est.items())
          + f"; index file {index / 2**20:.0f} MiB, dataset-info peak RSS {rss / 2**20:.2f} GiB")
    return rows


# --- part 2: the per-sample syscalls ------------------------------------------------------------
TRACED = "openat,open,pread64,read,preadv,preadv2,lseek,fstat,newfstatat,statx"
CALL = re.compile(r"^(?:\[pid\s+)?\d*\]?\s*(\w+)\((.*?)(?:\)\s*=\s*(-?\d+)|<unfinished)")


def count_calls(log, folder, sample_bytes):
    """Syscalls on the dataset's files in an strace -y log: {opens, sample_reads,
    metadata_reads, read_bytes, fstats, seeks}."""
    c = dict(opens=0, sample_reads=0, metadata_reads=0, read_bytes=0, fstats=0, seeks=0)
    with open(log, errors="replace") as f:
        for line in f:
            # A dataset file's path: quoted (openat) or after the fd (strace -y); os.walk's
            # opens of the folders are the script's listing, not per sample.
            path = re.search(rf'["<]({re.escape(folder)}[^">]*)[">]', line)
            if not path or not path.group(1).endswith(io.HDF5_SUFFIXES) or "resumed>" in line:
                continue
            m = CALL.match(line.split(" ", 1)[1] if line[:1].isdigit() else line)
            if not m:
                continue
            name, ret = m.group(1), int(m.group(3)) if m.group(3) else 0
            if name in ("openat", "open"):
                c["opens"] += ret >= 0
            elif name in ("pread64", "read", "preadv", "preadv2"):
                c["sample_reads" if ret >= sample_bytes else "metadata_reads"] += 1
                c["read_bytes"] += max(ret, 0)
            elif name in ("fstat", "newfstatat", "statx"):
                c["fstats"] += 1
            elif name == "lseek":
                c["seeks"] += 1
    return c


def per_sample(tool, lib, a, tmp):
    folder = os.path.join(tmp, "per-sample")
    gen(tool, folder, a.samples, "--preset", "small")
    sample_bytes = io.sample_bytes_of(folder)
    epochs, results = 2, {}
    for mode in ("plain", "transparent"):
        out = os.path.join(tmp, f"trace-{mode}")
        os.makedirs(out)
        log, stats = os.path.join(out, "strace.log"), os.path.join(out, "stats.json")
        cmd = [tool, "run", "--nodes", "1", "-n", "1", "--dataset", spec_of(folder), "--labels",
               LABELS, "--buffer", "100%", "--epochs", str(epochs), "--batch", "8", "--seed",
               "0", "--order", "torch",
               *(["--no-agent"] if mode == "plain" else ["--transparent", "--stats-out", stats]),
               "--", "strace", "-f", "-qq", "-y", "-e", f"trace={TRACED}", "-o", log,
               sys.executable, os.path.join(HERE, "pytorch_io.py"), "--rank", "baseline",
               "--warm", "--workers", "0", "--out", out, "--library", lib, "--seed", "0",
               "--batch", "8", "--epochs", str(epochs), "--data", spec_of(folder)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"many_files_startup: {' '.join(cmd)} failed ({p.returncode}):\n"
                     f"{p.stdout}\n{p.stderr}")
        with open(os.path.join(out, "rank-0.json")) as f:
            samples = json.load(f)["samples"]
        c = count_calls(log, folder, sample_bytes)
        x = {}
        if os.path.exists(stats):
            x = (json.load(open(stats))["nodes"][0].get("transparent") or {})
        results[mode] = {"samples": samples, "counts": c, "transparent": x}
    print()
    print(f"Syscalls on the dataset's files per sample read (the artifact's script, one h5py.File "
          f"per __getitem__, {a.samples} files of {sample_bytes // 1024} KiB, 1 rank, {epochs} "
          f"epochs; transparent: buffer 100%, strace -f -y of the rank):")
    print("| | opens | sample reads | metadata reads | bytes read | fstat | lseek |")
    print("|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        s, c = r["samples"], r["counts"]
        print(f"| {mode} | {c['opens'] / s:.2f} | {c['sample_reads'] / s:.2f} | "
              f"{c['metadata_reads'] / s:.2f} | {c['read_bytes'] / s / 1024:.1f} KiB | "
              f"{c['fstats'] / s:.2f} | {c['seeks'] / s:.2f} |")
    x, s = results["transparent"]["transparent"], results["transparent"]["samples"]
    if x:
        print(f"transparent, the interposer's counters: {x.get('opens', 0) / s:.2f} opens per "
              f"sample, reads served {x.get('hit_reads', 0)} ({x.get('hit_bytes', 0) / 2**20:.1f} "
              f"MiB), sample reads fallen through {x.get('miss_reads', 0)} "
              f"({x.get('miss_bytes', 0) / 2**20:.1f} MiB), over {s} samples")
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", default="1000,10000,100000",
                    help="dataset sizes in files, comma-separated [1000,10000,100000]")
    ap.add_argument("--runs", type=int, default=3, help="runs of each command per size [3]")
    ap.add_argument("--nofile", type=int, default=1024,
                    help="ulimit -n for solar run (issue 35: 1024 must work with 10^5 files) "
                         "[1024]")
    ap.add_argument("--samples", type=int, default=64,
                    help="part 2: files (samples) of the per-sample syscall count [64]")
    ap.add_argument("--skip-startup", action="store_true", help="part 2 only")
    ap.add_argument("--skip-syscalls", action="store_true", help="part 1 only")
    ap.add_argument("--build", help="build directory with cli/solar, client/libsolar.so")
    ap.add_argument("--json", metavar="FILE", help="also write every figure here")
    a = ap.parse_args()
    if a.runs < 1:
        sys.exit("many_files_startup: --runs must be at least 1")
    tool, lib = io.find_build(a.build)
    build = os.path.dirname(os.path.dirname(tool))
    if not a.skip_syscalls and not shutil.which("strace"):
        sys.exit("many_files_startup: the per-sample count needs strace (apt-get install "
                 "strace), or pass --skip-syscalls")
    tmp = tempfile.mkdtemp(prefix="solar-bench-files-", dir=os.environ.get("SOLAR_BENCH_DIR"))
    # solar's index cache of these throwaway datasets goes with them, not to ~/.cache/solar.
    os.environ.setdefault("SOLAR_INDEX_CACHE", os.path.join(tmp, "index-cache"))
    result = {}
    try:
        if not a.skip_startup:
            result["startup"] = startup(tool, build, a, tmp)
        if not a.skip_syscalls:
            result["per_sample"] = per_sample(tool, lib, a, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
