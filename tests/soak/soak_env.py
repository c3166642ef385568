# SPDX-License-Identifier: Apache-2.0
"""The soak's settings: the programs under test (SOLAR_BIN etc., else ./build), the sizes, limits
and timeouts of its jobs, the fault kinds, the event that stops it, and its log line."""
import os
import sys
import threading
import time


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
BUILD = os.environ.get("SOLAR_BIN_DIR") or os.path.join(ROOT, "build")
SOLAR = os.environ.get("SOLAR_BIN") or os.path.join(BUILD, "cli", "solar")
TRAIN = os.environ.get("SOLAR_EXAMPLE_TRAIN") or os.path.join(BUILD, "slurm_examples",
                                                              "solar-example-train")
STORED = os.environ.get("SOLAR_STORED") or os.path.join(BUILD, "storage", "solar-stored")
SCRIPT = os.path.join(ROOT, "slurm_examples", "train_h5py_ddp.py")
PY = "/usr/bin/python3"

SAMPLES = {"tiny": 600, "small": 96,  # one file each: 4 KiB and 256 KiB samples
           "files": 256,                # the SOLAR artifact's layout: a file a sample (1 KiB)
           "dlio": 390}                 # DLIO's: 8 files of 50 rows of 4 KiB, the last of 40
# The datasets of many files: `--dataset DIR/SUFFIX --labels LABELS` (what solar gen prints).
MANY = {"files": (":/split", "/unitPar"), "dlio": (":/records[]", "/labels")}
# The job kinds, and their weights once each has run once (the first jobs take every kind in
# turn, so that a soak of any length runs them all).
KINDS = ("hdf5", "fabric", "transparent", "files", "dlio", "peers", "peers_files")
KIND_WEIGHTS = (3, 3, 2, 2, 2, 2, 2)
JOB_TIMEOUT_S = 240        # a job still running after this is a hang
GRACE_S = 10               # processes, descriptors, threads: back within this after a job
AGENT_TIMEOUT_S = 3        # SOLAR_AGENT_TIMEOUT of the ranks: a longer SIGSTOP makes them go direct
STORED_RSS_LIMIT = 64 << 20
STOPPING = threading.Event()  # set on the way out: no fault or restart starts after it
FAULTS = ("agent_kill", "agent_stop", "rank_kill", "stored_kill", "stored_stop", "slow_storage",
          "memory_pressure")


def log(msg):
    print(f"soak {time.strftime('%H:%M:%S')}: {msg}", file=sys.stderr, flush=True)
