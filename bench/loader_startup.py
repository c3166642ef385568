#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""How long constructing `solar.torch.Loader()` takes in a fresh rank process (issue 15: at most
20 ms), with a node agent and reading directly. Each run is one `solar run` of one rank over a
small `solar gen` file; the rank times `import solar.torch` and then `solar.torch.Loader()`
(the import, torch's own start, is reported apart) and says whether h5py got imported.

  bench/loader_startup.py [--runs 7] [--solar build/cli/solar] [--library LIBSOLAR]
                          [--package DIR]

Prints every run's times and the medians, per mode."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def rank(out, library, package):
    if library:
        os.environ["SOLAR_LIBRARY"] = library
    sys.path.insert(0, package)
    t0 = time.perf_counter()
    import solar.torch
    t1 = time.perf_counter()
    loader = solar.torch.Loader()
    t2 = time.perf_counter()
    res = {"import_s": t1 - t0, "loader_s": t2 - t1, "agent": loader.using_agent,
           "h5py": "h5py" in sys.modules}
    loader.close()
    with open(out, "w") as f:
        json.dump(res, f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--solar", default=os.environ.get("SOLAR_BIN",
                                                      os.path.join(REPO, "build", "cli", "solar")))
    ap.add_argument("--library", default=os.environ.get("SOLAR_LIBRARY"),
                    help="libsolar.so the ranks load")
    ap.add_argument("--package", default=os.path.join(REPO, "python"),
                    help="the folder with the solar Python package [python/ of this checkout]")
    ap.add_argument("--rank", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank:
        return rank(a.rank, a.library, a.package)
    with tempfile.TemporaryDirectory(prefix="solar-startup-") as d:
        data = os.path.join(d, "tiny.h5")
        subprocess.run([a.solar, "gen", data, "--samples", "2000", "--preset", "tiny",
                        "--no-progress"], check=True, stdout=subprocess.DEVNULL)
        lib = os.path.abspath(a.library) if a.library else None
        results = {"agent": [], "direct": []}
        for i in range(a.runs):
            for mode in ("agent", "direct"):  # alternating: the machine's noise hits both
                out = os.path.join(d, f"{mode}-{i}.json")
                cmd = [a.solar, "run", "--nodes", "1", "--ranks-per-node", "1", "--dataset", data,
                       "--epochs", "1", "--batch", "16", "--buffer", "50%"]
                if mode == "direct":
                    cmd.append("--no-agent")
                cmd += ["--", sys.executable, os.path.abspath(__file__), "--rank", out]
                if lib:
                    cmd += ["--library", lib]
                cmd += ["--package", os.path.abspath(a.package)]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
                with open(out) as f:
                    r = json.load(f)
                assert r["agent"] == (mode == "agent"), r
                results[mode].append(r)
        for mode, rs in results.items():
            ms = [1e3 * r["loader_s"] for r in rs]
            imp = [1e3 * r["import_s"] for r in rs]
            print(f"{mode:6s} solar.torch.Loader(): median {statistics.median(ms):.1f} ms "
                  f"(runs: {' '.join(f'{x:.1f}' for x in ms)}); import solar.torch: median "
                  f"{statistics.median(imp):.0f} ms; h5py imported: "
                  f"{sorted({r['h5py'] for r in rs})}")


if __name__ == "__main__":
    main()
