#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""spank.lean: solar_spank.so loads nothing heavy into srun and slurmstepd (slurmstepd runs as
root): its DT_NEEDED list has no MPI, HDF5, libfabric, curl or CUDA, only the C/C++ runtime and
libfmt, and stripped it stays small. Usage: check_lean.py PLUGIN"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ALLOWED = {"libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libfmt.so.9",
           "ld-linux-x86-64.so.2"}
FORBIDDEN = re.compile(r"mpi|hdf5|fabric|curl|cuda|open-rte|open-pal|ibverbs|psm")
MAX_STRIPPED = 2 << 20

plugin = sys.argv[1]
dyn = subprocess.run(["readelf", "-d", plugin], capture_output=True, text=True, check=True).stdout
needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
print("DT_NEEDED:", " ".join(needed))
bad = [n for n in needed if FORBIDDEN.search(n) or n not in ALLOWED]
assert needed and not bad, f"{plugin} needs {bad}"
ldd = subprocess.run(["ldd", plugin], capture_output=True, text=True, check=True).stdout
heavy = [l.split()[0] for l in ldd.splitlines() if FORBIDDEN.search(l)]
assert not heavy, f"{plugin} loads {heavy} (through its dependencies)"
with tempfile.TemporaryDirectory() as d:
    copy = os.path.join(d, "p.so")
    shutil.copy(plugin, copy)
    subprocess.run(["strip", copy], check=True)
    size = os.path.getsize(copy)
print(f"stripped size: {size} bytes")
assert size < MAX_STRIPPED, f"stripped plugin is {size} bytes (limit {MAX_STRIPPED})"
print("lean")
