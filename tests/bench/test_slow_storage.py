"""scripts/slow-storage, the emulated shared storage every benchmark runs on: the kernel really
caps a cold read (a lower bound on time, which noise cannot break), its own counter sees the
bytes, and bad use gets one clear line."""
import json
import os
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "slow-storage")
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import slow_storage  # noqa: E402


def controller_or_skip(path):
    try:
        slow_storage.Throttle(path, 2**30).close()
    except slow_storage.Unavailable as e:
        pytest.skip(f"no read cap possible here: {e}")


def test_a_cold_read_takes_at_least_bytes_over_cap(tmp_path):
    data = tmp_path / "cold.bin"
    size = 24 * 2**20
    with open(data, "wb") as f:
        f.write(os.urandom(size))
    controller_or_skip(data)
    cap = 12 * 2**20
    out = tmp_path / "count.json"
    t0 = time.monotonic()
    p = subprocess.run([SCRIPT, "--bandwidth", str(cap), "--data", data, "--evict",
                        "--json", out, "--", "cat", data], capture_output=True, timeout=120)
    wall = time.monotonic() - t0
    assert p.returncode == 0, p.stderr.decode()
    assert len(p.stdout) == size
    r = json.loads(out.read_text())
    # The kernel's counter saw the whole file come from the disk (readahead may add a little).
    assert size <= r["read_bytes"] <= size + 16 * 2**20, r
    assert r["read_requests"] > 0
    # At most one second's burst may pass before the throttle bites.
    assert wall >= (size - cap) / cap, (wall, r)
    assert b"capped at" in p.stderr and b"MiB in" in p.stderr


def test_iops_cap_counts_requests(tmp_path):
    data = tmp_path / "small.bin"
    with open(data, "wb") as f:
        f.write(os.urandom(2**20))
    controller_or_skip(data)
    out = tmp_path / "count.json"
    # 64 reads of 4 KiB spread over 1 MiB with O_DIRECT: one request each.
    reader = ("import os,mmap,sys;fd=os.open(sys.argv[1],os.O_RDONLY|os.O_DIRECT);"
              "b=mmap.mmap(-1,4096);[os.preadv(fd,[b],i*16384) for i in range(64)]")
    p = subprocess.run([SCRIPT, "--iops", "50", "--data", data, "--json", out, "--",
                        sys.executable, "-c", reader, data], capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    r = json.loads(out.read_text())
    assert r["cap_iops"] == 50 and r["read_requests"] >= 64, r
    # 64 requests at 50/s: well over one second after the burst.
    assert r["wall_s"] >= (64 - 50) / 50, r


@pytest.mark.parametrize("args,named", [
    (["--", "true"], "--bandwidth"),
    (["--bandwidth", "lots", "--", "true"], "--bandwidth: 'lots'"),
    (["--bandwidth", "1M"], "command"),
    (["--bandwidth", "1M", "--data", "/nonexistent/x", "--", "true"], "/nonexistent/x"),
    (["--iops", "0", "--", "true"], "--iops"),
])
def test_bad_use_is_named(args, named):
    p = subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert named in p.stderr, p.stderr


def test_unthrottled_runs_the_command_and_passes_its_status(tmp_path):
    p = subprocess.run([SCRIPT, "--unthrottled", "--data", tmp_path, "--", "sh", "-c", "exit 3"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr


def test_no_cgroup_is_left_behind(tmp_path):
    controller_or_skip(tmp_path)
    before = set(os.listdir(slow_storage.V1_ROOT)) if os.path.isdir(slow_storage.V1_ROOT) else set()
    # CMD leaves a child running in the cgroup: slow-storage ends it and removes the cgroup.
    p = subprocess.run([SCRIPT, "--bandwidth", "1G", "--data", tmp_path, "--", "sh", "-c",
                        "sleep 60 & echo $!"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    pid = int(p.stdout.strip())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    after = set(os.listdir(slow_storage.V1_ROOT)) if os.path.isdir(slow_storage.V1_ROOT) else set()
    assert not [d for d in after - before if d.startswith("solar-slow-")]
