# SPDX-License-Identifier: Apache-2.0
"""bench/stored_io.py, the one command behind issue 15's solar-stored-vs-fabric figures: it
runs on both providers, places the server as asked, leaves no server or dataset behind, and
refuses bad input with one line. No speed is asserted (bench/README.md)."""
import json
import os
import subprocess

from testlib import ROOT, SOLAR

SCRIPT = os.path.join(ROOT, "bench", "stored_io.py")
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(SOLAR)))


def stored_running():
    """PIDs of solar-stored processes whose parent is this test (none may be left)."""
    me = str(os.getpid())
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm == "solar-stored" and fields[1] == me:
            out.append(pid)
    return out


def test_every_provider_and_phase_is_measured_and_nothing_is_left(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run(["/usr/bin/python3", SCRIPT, "--build", BUILD, "--sizes", "256K",
                        "--bytes", "4M", "--repeat", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert [x["fabric_reference"]["provider"] for x in r] == ["tcp;ofi_rxm", "shm"]
    # tcp stands for a remote server (apart when there are 2 CPUs); shm shares the host.
    assert r[0]["placement"] == ("apart" if len(os.sched_getaffinity(0)) >= 2 else "shared")
    assert r[1]["placement"] == "shared"
    for x in r:
        assert x["sample_bytes"] == 256 << 10 and x["samples_read"] == 16 and x["repeat"] == 2
        for ph in x["phases"]:
            assert len(ph["vs_fabric_runs"]) == 2 and ph["vs_fabric"] > 0, ph
            assert len(ph["seconds_runs"]) == len(ph["fabric"]["seconds_runs"]) == 2, ph
        # What the disks read while the cell ran (the whole machine's: not asserted to be 0,
        # other tests may be reading), a count of bytes.
        assert isinstance(x["disk_read_bytes"], int) and x["disk_read_bytes"] >= 0, x
    # The table has a row per provider and phase, its last column the disk's MiB (marked * when
    # above 1% of a phase's bytes), explained below it.
    rows = [ln.split() for ln in p.stdout.splitlines() if ln.strip().startswith("256K")]
    assert len(rows) == 6, p.stdout
    for row in rows:
        assert row[-1].rstrip("*").isdigit(), row
    assert "disk MiB: read from any disk while the cell's bench ran" in p.stdout, p.stdout
    assert not stored_running()
    assert not any(n.startswith("stored-io") for n in os.listdir(tmp_path)), os.listdir(tmp_path)


def test_both_server_memories_side_by_side(tmp_path):
    """--server-memory file,memory: one solar-stored serving from its mapped file, one from its
    own copy (--in-memory), each as the server itself reports it (bench io's server_memory)."""
    out = tmp_path / "r.json"
    p = subprocess.run(["/usr/bin/python3", SCRIPT, "--build", BUILD, "--sizes", "256K",
                        "--bytes", "4M", "--repeat", "1", "--providers", "shm",
                        "--server-memory", "file,memory", "--json", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert [x["server_memory"] for x in r] == ["file", "memory"]
    rows = [ln.split() for ln in p.stdout.splitlines() if ln.strip().startswith("256K")]
    assert [row[2] for row in rows] == ["file"] * 3 + ["memory"] * 3, p.stdout
    assert not stored_running()


def test_bad_input_gets_one_line(tmp_path):
    for args, words in [(["--sizes", "3M"], "'3M' is not one of"),
                        (["--bytes", "lots"], "'lots' is not a size"),
                        (["--repeat", "0"], "--repeat must be in 1..100"),
                        (["--server-memory", "disk"], "give file, memory or file,memory"),
                        (["--build", str(tmp_path)], "build first")]:
        p = subprocess.run(["/usr/bin/python3", SCRIPT, "--build", BUILD, *args],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and words in p.stderr, (args, p.stderr)
        assert "Traceback" not in p.stderr, p.stderr
