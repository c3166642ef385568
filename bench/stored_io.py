#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""solar-stored against the raw fabric, every sample size and provider in one run.

    /usr/bin/python3 bench/stored_io.py                       # 256K, 2M, 16M x tcp;ofi_rxm, shm
    /usr/bin/python3 bench/stored_io.py --sizes 256K --providers 'tcp;ofi_rxm' --repeat 15
    /usr/bin/python3 bench/stored_io.py --placement shared --json out.json
    /usr/bin/python3 bench/stored_io.py --server-memory file,memory   # solar-stored --in-memory too

For each sample size it writes a dataset of --bytes (solar gen, contiguous), and for each
provider starts a solar-stored exporting it, runs `solar bench io fabric://... --warm
--fraction 1 --repeat N --json` against it (random one-sample reads from 8 threads, sorted
coalesced runs, a sequential read, each beside plain fi_reads of the same sizes on the same
server: the raw-fabric reference), stops the server, and prints solar's reads as a share of
the fabric's: the median of the runs' own ratios, and their range. The reference reads into
the same memory solar's reads land in; --reference-memory export has it read the export's
own mapping (the file's page cache) instead of plain memory the server lends.

Placement (--placement): solar-stored serves from another machine in a deployment, over
tcp;ofi_rxm or verbs; on one machine its thread and the reading threads share the cores, and
a reader's threads that wake on the server's core preempt it, which the reference's single
thread does not do (on 2 cores, 256 KiB one-sample reads: about 9300 involuntary context
switches of the server per 40000 reads against 185 for the reference). `apart` (default)
puts the server on CPU 0 and the bench on the others for every provider but shm; shm is the
same-host provider, and always shares. `shared` lets the scheduler place both everywhere.

Everything it starts it stops, and the datasets go with their temporary folder (unless
--data-dir names a folder to keep them in, where existing ones of the right size are reused).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SAME_HOST_PROVIDERS = {"shm"}
PRESET_SHAPES = {  # sample size -> (shape, dtype) for solar gen
    "4K": ("4,8,8,8", "int16"),
    "256K": ("4,32,32,32", "int16"),
    "2M": ("4,64,64,64", "int16"),
    "16M": ("4,128,128,128", "int16"),
}


def parse_size(text):
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}
    t = text.strip().upper()
    try:
        return int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)
    except (ValueError, KeyError):
        raise SystemExit(f"stored_io.py: '{text}' is not a size (e.g. 256K, 1G)") from None


def binary(build, sub, name):
    path = os.path.join(build, sub, name)
    if not os.access(path, os.X_OK):
        raise SystemExit(f"stored_io.py: {path} not found; build first (scripts/build) or pass "
                         "--build")
    return path


def pinned(cpus):
    """preexec_fn that puts the child on `cpus` (None: anywhere)."""
    if not cpus:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


class Server:
    """A solar-stored exporting one file; stopped however the caller ends."""

    def __init__(self, stored, provider, path, workdir, cpus, in_memory=False):
        self.ready = os.path.join(workdir, "stored.ready")
        self.log_path = os.path.join(workdir, "stored.log")
        if os.path.exists(self.ready):
            os.unlink(self.ready)
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [stored, "--provider", provider, "--export", f"s={path}", "--listen",
             "127.0.0.1:0", "--ready-file", self.ready, "--quiet"]
            + (["--in-memory"] if in_memory else []),
            stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=pinned(cpus))
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                self.stop()
                raise SystemExit(f"stored_io.py: solar-stored exited ({self.proc.returncode}):\n"
                                 + open(self.log_path).read())
            if os.path.exists(self.ready) and open(self.ready).read().strip():
                self.addr = open(self.ready).read().strip()
                return
            time.sleep(0.02)
        self.stop()
        raise SystemExit("stored_io.py: solar-stored was not ready within 60 s:\n"
                         + open(self.log_path).read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def pages_read_in():
    """Bytes the kernel has read from block devices so far, every device (/proc/vmstat pgpgin,
    KiB): a warm phase that reads the disk did not find the file in the page cache."""
    with open("/proc/vmstat") as f:
        for line in f:
            key, value = line.split()
            if key == "pgpgin":
                return int(value) * 1024
    return 0


def warm(path):
    """Reads `path` through the page cache, so that a --warm bench finds it there."""
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        buf = bytearray(16 << 20)
        while f.readinto(buf):
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256K,2M,16M",
                    help="sample sizes, of " + ", ".join(PRESET_SHAPES) + " [256K,2M,16M]")
    ap.add_argument("--providers", default="tcp;ofi_rxm,shm",
                    help="libfabric providers, comma-separated [tcp;ofi_rxm,shm]")
    ap.add_argument("--bytes", default="1G", help="size of each dataset [1G]: each phase reads "
                    "all of it; smaller ones give phases too short to time on a shared machine")
    ap.add_argument("--repeat", type=int, default=9, help="runs of each phase [9]")
    ap.add_argument("--placement", choices=["apart", "shared"], default="apart",
                    help="apart: solar-stored on CPU 0, the bench on the others, except for "
                    "shm; shared: anywhere [apart]")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "build"),
                    help="build directory [../build]")
    ap.add_argument("--reference-memory", choices=["plain", "export"], default="plain",
                    help="what the reference reads on the server: plain memory it lends (the "
                    "fabric's own limit) or the export's mapped file at solar's offsets (what "
                    "solar's read path costs, the server's page cache on both sides) [plain]")
    ap.add_argument("--server-memory", default="file",
                    help="what solar-stored serves from, comma-separated to measure both side "
                    "by side: file (the mapped file's page cache, its default) or memory (its "
                    "own copy, solar-stored --in-memory) [file]")
    ap.add_argument("--data-dir", help="keep the datasets here (reused when present)")
    ap.add_argument("--json", help="also write every bench io result to this file")
    a = ap.parse_args()

    solar = binary(a.build, "cli", "solar")
    stored = binary(a.build, "storage", "solar-stored")
    sizes = [s.strip().upper() for s in a.sizes.split(",") if s.strip()]
    for s in sizes:
        if s not in PRESET_SHAPES:
            raise SystemExit(f"stored_io.py: --sizes: '{s}' is not one of "
                             + ", ".join(PRESET_SHAPES))
    providers = [p.strip() for p in a.providers.split(",") if p.strip()]
    served = [m.strip() for m in a.server_memory.split(",") if m.strip()]
    if not served or any(m not in ("file", "memory") for m in served):
        raise SystemExit("stored_io.py: --server-memory: give file, memory or file,memory")
    if not 1 <= a.repeat <= 100:
        raise SystemExit("stored_io.py: --repeat must be in 1..100")
    total = parse_size(a.bytes)
    cpus = sorted(os.sched_getaffinity(0))
    if a.placement == "apart" and len(cpus) < 2:
        print("stored_io.py: one CPU here: --placement apart is not possible, sharing it",
              file=sys.stderr)

    tmp = tempfile.mkdtemp(prefix="solar-stored-io.")
    data_dir = a.data_dir or tmp
    os.makedirs(data_dir, exist_ok=True)
    results, rows = [], []
    try:
        paths = {}
        for size in sizes:
            sb = parse_size(size)
            samples = max(16, total // sb)
            shape, dtype = PRESET_SHAPES[size]
            paths[size] = path = os.path.join(data_dir, f"stored-io-{size}.h5")
            if not os.path.exists(path) or os.path.getsize(path) < samples * sb:
                print(f"== writing {samples} samples of {size} to {path}", file=sys.stderr)
                subprocess.run([solar, "gen", path, "--samples", str(samples), "--shape", shape,
                                "--dtype", dtype, "--force", "--no-progress"], check=True,
                               stdout=subprocess.DEVNULL)
        # The kernel writes the new files back in the background for many seconds, on the
        # cores the measurement needs: finish that first.
        os.sync()
        for size in sizes:
            path = paths[size]
            for provider, served_from in [(p, m) for p in providers for m in served]:
                apart = (a.placement == "apart" and provider not in SAME_HOST_PROVIDERS
                         and len(cpus) >= 2)
                server_cpus = {cpus[0]} if apart else None
                bench_cpus = set(cpus[1:]) if apart else None
                print(f"== {size} {provider} from {served_from} "
                      f"({'apart' if apart else 'shared cores'})",
                      file=sys.stderr)
                server = Server(stored, provider, path, tmp, server_cpus, served_from == "memory")
                try:
                    # Idle since an earlier cell, the file's pages may have left the page
                    # cache (here DAMON pages out memory left alone for a minute or so).
                    if served_from == "file":
                        warm(path)
                    disk_before = pages_read_in()
                    p = subprocess.run([solar, "bench", "io", f"fabric://{server.addr}/s",
                                        "--warm", "--fraction", "1", "--repeat", str(a.repeat),
                                        "--reference-memory", a.reference_memory, "--json"],
                                       capture_output=True, text=True,
                                       preexec_fn=pinned(bench_cpus), timeout=3600)
                finally:
                    server.stop()
                if p.returncode != 0:
                    raise SystemExit(f"stored_io.py: solar bench io failed ({p.returncode}):\n"
                                     f"{p.stdout}{p.stderr}\nsolar-stored's log:\n"
                                     + open(server.log_path).read())
                j = json.loads(p.stdout)
                j["placement"] = "apart" if apart else "shared"
                j["disk_read_bytes"] = disk = pages_read_in() - disk_before
                if j.get("server_memory") != served_from:
                    raise SystemExit(f"stored_io.py: asked solar-stored to serve from "
                                     f"{served_from}, and it served from "
                                     f"{j.get('server_memory')}")
                results.append(j)
                for ph in j["phases"]:
                    runs = ph["vs_fabric_runs"]
                    rows.append((size, provider, served_from, j["placement"], ph["name"],
                                 ph["gbps"],
                                 ph["fabric_gbps"], ph["vs_fabric"], min(runs), max(runs),
                                 disk))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    memory = "the export's" if a.reference_memory == "export" else "plain"
    print(f"solar-stored vs the raw fabric ({memory} memory): warm page cache, "
          f"{total >> 20} MiB a phase, median of {a.repeat} runs' own ratios "
          f"(range)\n")
    print(f"{'sample':>6}  {'provider':<12} {'server':<7} {'cores':<7} {'phase':<28} "
          f"{'GB/s':>6} {'fabric':>7} {'vs fabric':>10} {'range':>10} {'disk MiB':>9}")
    # Above 1% of one phase's bytes: more than the bench's own odds and ends.
    marked = total // 100
    for size, prov, served_from, place, name, g, f, v, lo, hi, disk in rows:
        mark = "*" if disk > marked else ""
        print(f"{size:>6}  {prov:<12} {served_from:<7} {place:<7} {name:<28} {g:>6.2f} "
              f"{f:>7.2f} {100 * v:>9.1f}% {f'{100 * lo:.0f}-{100 * hi:.0f}%':>10} "
              f"{f'{disk >> 20}{mark}':>9}")
    print("\ndisk MiB: read from any disk while the cell's bench ran (/proc/vmstat pgpgin), all "
          "three phases")
    if any(row[-1] > marked for row in rows):
        print("*: the disks read more than 1% of a phase's bytes during the cell (something "
              "else on the machine, or, in a file row, the page cache not holding the whole "
              "file, so that row measured the disk as well as the fabric, whose reference reads "
              "plain memory): run it again, or compare --server-memory memory")
    if a.json:
        with open(a.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
