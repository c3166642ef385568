#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Samples held per GiB, compressed against raw (issue 36), and the sizes a planner by bytes
works with.

Writes a CosmoFlow-like dataset in the SOLAR artifact's layout (one HDF5 file per sample,
/split int16 4×S³ and /unitPar float32[4]) once per storage filter: raw (contiguous), gzip,
shuffle+gzip and lzf, each sample one chunk. The content is deterministic and compressible the
way CosmoFlow's is: particle counts per voxel of a log-normal density field (mostly small
integers, many zeros, smooth in space), numpy seeded by --seed. For every variant it reads
each file's stored bytes of /split (h5py's chunk table: what a reader of the file's bytes,
the transparent mode, would hold in memory), and prints the samples a GiB holds, raw and
compressed, and the ratio. With --sizes-out it writes each variant's per-sample stored sizes,
one per line, for `solar plan --sample-sizes FILE`, and with --plan it runs that plan beside
the equal-size one: what the same buffer then holds and fetches.

    /usr/bin/python3 bench/compressed_sizes.py [--samples 256] [--side 64] [--seed 0]
        [--filters raw,gzip,shuffle-gzip,lzf] [--sizes-out DIR] [--plan] [--json]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILTERS = {
    "raw": {},
    "gzip": {"compression": "gzip", "compression_opts": 4},
    "shuffle-gzip": {"compression": "gzip", "compression_opts": 4, "shuffle": True},
    "lzf": {"compression": "lzf"},
}


def cosmoflow_like(rng, side):
    """One sample: 4 redshift channels of particle counts of a smooth log-normal field."""
    k = np.fft.fftfreq(side)
    kk = np.sqrt(k[:, None, None] ** 2 + k[None, :, None] ** 2 + k[None, None, :] ** 2)
    power = np.zeros_like(kk)
    np.power(kk, -1.5, out=power, where=kk > 0)  # a red spectrum: large-scale structure
    out = np.empty((4, side, side, side), dtype=np.int16)
    base = np.fft.ifftn(np.sqrt(power) * np.fft.fftn(rng.standard_normal((side,) * 3))).real
    base /= base.std() or 1.0
    for c in range(4):  # the channels: the same field at growing contrast
        density = np.exp((0.6 + 0.3 * c) * base)
        out[c] = np.minimum(rng.poisson(0.5 * density / density.mean()), 32767)
    return out


def write(path, sample, par, opts):
    with h5py.File(path, "w") as f:
        f.create_dataset("split", data=sample, chunks=sample.shape if opts else None, **opts)
        f.create_dataset("unitPar", data=par)


def stored_bytes(path):
    """Bytes of /split as they lie in the file (its one chunk, or the contiguous array)."""
    with h5py.File(path, "r") as f:
        d = f["split"]
        if d.chunks is None:
            return d.id.get_storage_size()
        return sum(d.id.get_chunk_info(i).size for i in range(d.id.get_num_chunks()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--side", type=int, default=64, help="voxels a side (the artifact: 128)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--filters", default="raw,gzip,shuffle-gzip,lzf")
    ap.add_argument("--sizes-out", help="write DIR/<filter>.sizes, one stored size a line")
    ap.add_argument("--plan", action="store_true",
                    help="plan each variant's sizes with solar plan (1 node x 4 ranks, batch 4, "
                         "3 epochs, a buffer of 25%% of the raw bytes)")
    ap.add_argument("--solar", default=os.environ.get("SOLAR_BIN", os.path.join(ROOT, "build", "cli", "solar")))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--write", metavar="DIR",
                    help="keep the first --filters variant's dataset in DIR (the artifact's "
                         "layout: DIR/000/univ0000_000.hdf5 ..., /split and /unitPar), e.g. for "
                         "bench/pytorch_io.py --layout per-sample-files --dataset DIR")
    a = ap.parse_args()
    filters = a.filters.split(",")
    for f in filters:
        if f not in FILTERS:
            sys.exit(f"--filters: {f!r} is not one of {', '.join(FILTERS)}")
    if a.samples < 64 or a.side < 4:
        sys.exit("--samples must be at least 64 (--plan's buffer holds a step of 16) and --side "
                 "at least 4")
    rng = np.random.default_rng(a.seed)
    samples = [(cosmoflow_like(rng, a.side), rng.random(4, dtype=np.float32)) for _ in range(a.samples)]
    raw_bytes = samples[0][0].nbytes
    results = {}
    with tempfile.TemporaryDirectory(prefix="solar-compressed-") as tmp:
        for name in filters:
            d = os.path.join(tmp, name)
            os.makedirs(d)
            sizes = []
            for i, (x, par) in enumerate(samples):
                sub = os.path.join(d, f"{i // 64:03d}")
                os.makedirs(sub, exist_ok=True)
                p = os.path.join(sub, f"univ{i // 64:04d}_{i % 64:03d}.hdf5")
                write(p, x, par, FILTERS[name])
                sizes.append(stored_bytes(p))
                with h5py.File(p, "r") as f:  # it reads back as written
                    assert np.array_equal(f["split"][()], x), p
            total = sum(sizes)
            results[name] = {"samples": a.samples, "raw_sample_bytes": raw_bytes,
                             "stored_bytes": total, "mean_stored": total / a.samples,
                             "min_stored": min(sizes), "max_stored": max(sizes),
                             "samples_per_gib": 2**30 / (total / a.samples),
                             "vs_raw": raw_bytes * a.samples / total}
            if a.write and name == filters[0]:
                if os.path.exists(a.write):
                    sys.exit(f"--write: {a.write} exists; give a new folder")
                shutil.copytree(d, a.write)
            if a.sizes_out:
                os.makedirs(a.sizes_out, exist_ok=True)
                with open(os.path.join(a.sizes_out, f"{name}.sizes"), "w") as out:
                    out.write(f"# {name}: stored bytes of /split, one per sample\n")
                    out.write("".join(f"{s}\n" for s in sizes))
            if a.plan:
                with tempfile.NamedTemporaryFile("w", suffix=".sizes", dir=tmp, delete=False) as sf:
                    sf.write("".join(f"{s}\n" for s in sizes))
                buffer = raw_bytes * a.samples // 4
                p = subprocess.run([a.solar, "plan", "--sample-sizes", sf.name, "--epochs", "3",
                                    "--ranks-per-node", "4", "--batch", "4", "--buffer",
                                    str(buffer), "--policy", "sampler", "--json", "--no-progress"],
                                   capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"--plan: solar plan refused the {name} sizes: {p.stderr.strip()}")
                r = json.loads(p.stdout)["results"][0]
                results[name]["plan"] = {"buffer_bytes": buffer,
                                         "remote_bytes": r["remote_bytes"],
                                         "lower_bound_bytes": r["lower_bound_bytes"],
                                         "ratio_bytes_to_lower_bound": r["ratio_bytes_to_lower_bound"],
                                         "hit_rate": r["hit_rate"]}
    if a.json:
        print(json.dumps({"side": a.side, "seed": a.seed, "results": results}, indent=2))
        return
    print(f"{a.samples} CosmoFlow-like samples of 4x{a.side}^3 int16 ({raw_bytes / 2**20:.2f} MiB raw), "
          f"one HDF5 file each, seed {a.seed}")
    print(f"{'filter':<14} {'stored mean':>12} {'min..max':>21} {'samples/GiB':>12} {'vs raw':>7}"
          + (f" {'plan hit rate':>14} {'bytes/bound':>12}" if a.plan else ""))
    for name, r in results.items():
        line = (f"{name:<14} {r['mean_stored'] / 2**10:>9.1f} KiB {r['min_stored'] / 2**10:>9.1f}.."
                f"{r['max_stored'] / 2**10:<9.1f} {r['samples_per_gib']:>12.0f} {r['vs_raw']:>6.2f}×")
        if a.plan:
            line += f" {100 * r['plan']['hit_rate']:>13.1f}% {r['plan']['ratio_bytes_to_lower_bound']:>11.3f}×"
        print(line)
    if a.plan:
        print(f"(plan: 1 node x 4 ranks, batch 4, 3 epochs, policy sampler, buffer {results[filters[0]]['plan']['buffer_bytes'] / 2**20:.1f} MiB"
              " = 25% of the raw bytes, counted in stored bytes)")


if __name__ == "__main__":
    main()
