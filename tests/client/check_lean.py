#!/usr/bin/python3
"""client.lean: libsolar.so, loaded into every rank, brings no MPI (it would clash with the
user's own) and no CUDA runtime (opened on first use instead): neither in its DT_NEEDED list
nor anywhere in what the loader pulls in. It has a versioned SONAME. Usage: check_lean.py LIB"""
import re
import subprocess
import sys

lib = sys.argv[1]
dyn = subprocess.run(["readelf", "-d", lib], capture_output=True, text=True, check=True).stdout
soname = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", dyn)
assert soname and re.fullmatch(r"libsolar\.so\.\d+", soname.group(1)), dyn
ldd = subprocess.run(["ldd", lib], capture_output=True, text=True, check=True).stdout
print(ldd)
heavy = [l.split()[0] for l in ldd.splitlines()
         if re.search(r"libmpi|open-rte|open-pal|hdf5_openmpi|cudart|libcuda\.", l)]
assert not heavy, f"{lib} loads {heavy}"
print(f"lean: SONAME {soname.group(1)}")
