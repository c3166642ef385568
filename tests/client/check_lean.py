#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""client.lean: libsolar.so, loaded into every rank, brings nothing heavy at load time: no MPI
(it would clash with the user's own), no CUDA runtime (opened on first use), no HDF5 and no
libfabric (0.2 s of a rank's start for libfabric's providers alone; the direct path opens them
in libsolar-direct.so on first use). Neither in its DT_NEEDED list nor anywhere in what the
loader pulls in, nor mapped into a process that loads it. It has a versioned SONAME and exports
only the solar_* C API; the direct path's module is beside it and exports only its entry point.
Usage: check_lean.py LIB"""
import os
import re
import subprocess
import sys

HEAVY = r"libmpi|open-rte|open-pal|hdf5|libfabric|cudart|libcuda\."

lib = sys.argv[1]
dyn = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
soname = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", dyn)
assert soname and re.fullmatch(r"libsolar\.so\.\d+", soname.group(1)), dyn
needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
print("NEEDED:", " ".join(needed))
assert not [n for n in needed if re.search(HEAVY, n)], f"{lib} needs {needed}"
ldd = subprocess.run(["ldd", lib], capture_output=True, text=True, check=True).stdout
print(ldd)
heavy = [l.split()[0] for l in ldd.splitlines() if re.search(HEAVY, l)]
assert not heavy, f"{lib} loads {heavy}"


def exported(path):
    """Defined dynamic symbols, less GNU unique ones ('u': the static locals of libstdc++'s
    inline functions, which the toolchain keeps global so that one copy exists per process)."""
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True,
                         check=True).stdout
    return {l.split()[-1] for l in out.splitlines() if l.split()[1] not in ("A", "u")}


others = sorted(s for s in exported(lib) if not s.startswith("solar_"))
assert not others, f"{lib} exports more than the solar_* API: {others[:20]}"

# Loaded into a process (as ctypes does), nothing heavy is mapped. Not for a sanitized build
# (scripts/sanitize): its runtime must come first in a process, which an uninstrumented
# Python is not (the checks above still hold for it).
sanitizer = [n for n in needed if re.match(r"lib[atu]san|libubsan", n)]
if sanitizer:
    print(f"sanitized build ({sanitizer[0]}): not loaded into Python")
else:
    maps = subprocess.run(
        [sys.executable, "-c",
         f"import ctypes; ctypes.CDLL({os.path.abspath(lib)!r}); "
         f"print(open('/proc/self/maps').read())"],
        capture_output=True, text=True, check=True).stdout
    mapped = sorted({l.split()[-1] for l in maps.splitlines() if re.search(HEAVY, l)})
    assert not mapped, f"loading {lib} maps {mapped}"

module = os.path.join(os.path.dirname(os.path.realpath(lib)), "libsolar-direct.so")
assert os.path.isfile(module), f"{module} missing: libsolar's direct path needs it beside it"
assert exported(module) == {"solar_direct_open_v1"}, sorted(exported(module))[:20]
print(f"lean: SONAME {soname.group(1)}, exports {len(exported(lib))} solar_* symbols; "
      f"{os.path.basename(module)} beside it")
