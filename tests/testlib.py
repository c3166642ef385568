# SPDX-License-Identifier: Apache-2.0
"""What the Python tests share: the built programs' paths, `run`, `finish` and `wait_until`,
what /proc and the programs' files say (`proc_status`, `count_lines`, `plan_sequences`), and the
agent protocol's constants read from the C++ headers (so a test never carries a copy that can
drift from solar/protocol.h or solar/transparent.h).

Imported as `testlib`: tests/integration/conftest.py and tests/python/conftest.py put this
folder on sys.path (pytest loads a folder's conftest.py before its test files); the soak
(tests/soak), tests/storage/test_stored_faults.py and spank/tests put it there themselves."""
import contextlib
import csv
import io
import os
import pathlib
import re
import struct
import subprocess
import time
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parent.parent

# The programs under test: SOLAR_BIN etc. (what ctest sets, tests/CMakeLists.txt), else the
# default build folder (SOLAR_BIN_DIR, or build/ at the repository root).
BIN = os.environ.get("SOLAR_BIN_DIR", os.path.join(os.path.dirname(__file__), "..", "build"))
SOLAR = os.environ.get("SOLAR_BIN") or os.path.join(BIN, "cli", "solar")
AGENT = os.environ.get("SOLAR_AGENT") or os.path.join(BIN, "agent", "solar-agent")
TRAIN = (os.environ.get("SOLAR_EXAMPLE_TRAIN")
         or os.path.join(BIN, "slurm_examples", "solar-example-train"))
STORED = os.environ.get("SOLAR_STORED") or os.path.join(BIN, "storage", "solar-stored")
PEER_PROBE = os.environ.get("SOLAR_PEER_PROBE") or os.path.join(BIN, "tests", "solar_peer_probe")
PY = "/usr/bin/python3"  # Debian's: it has torch, numpy, h5py and pytest


def run(*args, check=True, timeout=300, **kw):
    """Runs a program (arguments str()-ed), capturing its output as text; with `check`, a
    non-zero status fails the test with both outputs."""
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                       **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def wait_until(pred, timeout=30, what="condition", step=0.02):
    """Polls `pred` every `step` seconds until it is true; fails after `timeout` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def reaped(p):
    """Kills and reaps the Popen `p` on the way out of the block if it still runs: a test never
    leaves it behind, whatever fails inside."""
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def finish(p, timeout=60):
    """Waits for the Popen `p` (started with stdout and stderr piped) to end, killing it if it
    still runs after `timeout` seconds (the test then fails with TimeoutExpired):
    (returncode, stdout, stderr)."""
    with reaped(p):
        out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def proc_status(pid):
    """/proc/PID/status as {field: [its words]}."""
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return fields


def count_lines(path):
    """The lines of a file, 0 when it does not exist (yet)."""
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def plan_sequences(plan):
    """rank -> step -> samples, from plan-dump."""
    rows = csv.DictReader(io.StringIO(run(SOLAR, "plan-dump", plan).stdout))
    seq = defaultdict(lambda: defaultdict(list))
    for r in rows:
        seq[int(r["rank"])][int(r["global_step"])].append(int(r["sample"]))
    return seq


# The agent protocol, from the headers: wherever they sit (<component>/include/solar/).
def _header(name):
    found = sorted(ROOT.glob(f"*/include/solar/{name}"))
    assert found, f"solar/{name} not found under {ROOT}"
    return found[0].read_text()


def _protocol():
    text = _header("protocol.h")
    magic = int(re.search(r"\bkMagic\s*=\s*(0x[0-9a-fA-F]+)", text).group(1), 16)
    version = int(re.search(r"\bkVersion\s*=\s*(\d+)", text).group(1))
    body = re.search(r"enum class Op\b[^{]*\{(.*?)\};", text, re.S).group(1)
    ops = {m.group(1): int(m.group(2)) for m in re.finditer(r"\b(\w+)\s*=\s*(\d+)", body)}
    return magic, version, ops


def _transparent():
    text = _header("transparent.h")
    return {m.group(1): int(m.group(2), 0)
            for m in re.finditer(r"#define (SOLAR_\w+) (0x[0-9a-fA-F]+|\d+)", text)}


MAGIC, VERSION, OPS = _protocol()
OP_HELLO, OP_HELLO_OK, OP_NEXT, OP_BATCH = OPS["hello"], OPS["hello_ok"], OPS["next"], OPS["batch"]
OP_STATS, OP_STATS_REPLY, OP_ERROR = OPS["stats"], OPS["stats_reply"], OPS["error"]
OP_RELEASE, OP_XHELLO, OP_XHELLO_OK = OPS["release"], OPS["xhello"], OPS["xhello_ok"]
TRANSPARENT = _transparent()  # SOLAR_XINDEX_MAGIC, SOLAR_PROTO_VERSION, ... from transparent.h
XINDEX_MAGIC = TRANSPARENT["SOLAR_XINDEX_MAGIC"]
assert TRANSPARENT["SOLAR_PROTO_VERSION"] == VERSION
assert TRANSPARENT["SOLAR_OP_XHELLO"] == OP_XHELLO
assert TRANSPARENT["SOLAR_OP_XHELLO_OK"] == OP_XHELLO_OK

HEADER = struct.Struct("<IHHII")  # magic, version, op, payload length, reserved


def frame(op, payload=b"", version=None):
    """One request frame: the header, then the payload."""
    version = VERSION if version is None else version
    return HEADER.pack(MAGIC, version, op, len(payload), 0) + payload
