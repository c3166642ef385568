# SPDX-License-Identifier: Apache-2.0
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


def test_an_emulated_local_disk_of_its_own_is_capped_counted_and_removed(tmp_path):
    """--local-dir: a second device (ext4 on a loop device, its image in /dev/shm) capped apart
    from the storage's disk: direct writes to it take at least bytes over its cap, its counter
    sees them, the storage's disk sees none of them, and nothing is left mounted or attached."""
    data = tmp_path / "d.bin"
    data.write_bytes(b"x" * 4096)
    controller_or_skip(data)
    mnt, out = tmp_path / "nvme", tmp_path / "count.json"
    size, cap = 32 * 2**20, 16 * 2**20
    t0 = time.monotonic()
    p = subprocess.run([SCRIPT, "--bandwidth", "1G", "--data", data, "--local-dir", mnt,
                        "--local-size", "128M", "--local-bandwidth", str(cap), "--json", out, "--",
                        "dd", "if=/dev/zero", f"of={mnt}/x", "bs=1M", "count=32", "oflag=direct"],
                       capture_output=True, text=True, timeout=120)
    wall = time.monotonic() - t0
    if p.returncode == 2 and ("losetup" in p.stderr or "mount" in p.stderr):
        pytest.skip(f"no loop device here: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert r["local"]["write_bytes"] >= size, r
    assert r["read_bytes"] < size / 4, r  # the storage's disk: not the local disk's traffic
    assert wall >= (size - cap) / cap, (wall, r)
    assert "local disk" in p.stderr and "wrote 32.0 MiB" in p.stderr, p.stderr
    assert not os.path.ismount(mnt) and list(mnt.iterdir()) == []
    attached = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    assert "solar-local-disk" not in attached, attached
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("solar-local-disk")]


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


def test_disk_bytes_of_a_solar_run_agree_with_its_plan(tmp_path):
    """The limit benchmarks print (plain bytes / planned bytes) rests on the plan's fetches
    being what is read: under the cap, agents reading with O_DIRECT, the cgroup's own count
    of bytes read from the disk is the plan's fetches (HDF5 metadata and O_DIRECT alignment
    aside), and so is what the agents say they fetched."""
    solar, train = os.environ.get("SOLAR_BIN"), os.environ.get("SOLAR_EXAMPLE_TRAIN")
    if not solar or not train:
        pytest.skip("needs SOLAR_BIN and SOLAR_EXAMPLE_TRAIN (ctest sets them)")
    data = tmp_path / "d.h5"
    subprocess.run([solar, "gen", data, "--samples", "96", "--preset", "small", "--no-progress"],
                   check=True, capture_output=True, timeout=120)
    controller_or_skip(data)
    count, stats = tmp_path / "count.json", tmp_path / "stats.json"
    job = [solar, "run", "-v", "-n", "2", "--nodes", "2", "--dataset", data, "--buffer", "50%",
           "--epochs", "3", "--batch", "4", "--direct-io", "--stats-out", stats, "--", train,
           "--verify"]
    # The programs and libraries live on the same disk: run the job once uncapped so that their
    # pages are cached and the count below is the dataset's alone.
    subprocess.run(job, check=True, capture_output=True, timeout=300)
    p = subprocess.run([SCRIPT, "--bandwidth", "1G", "--data", data, "--evict", "--json", count,
                        "--", *job], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("verified (0 wrong), from the node agent") == 2, p.stdout
    import re
    fetches = int(re.search(r"plan: (\d+) remote fetches", p.stderr).group(1))
    sample_bytes = 256 * 1024
    planned = fetches * sample_bytes
    nodes = json.loads(stats.read_text())["nodes"]
    # At most the plan's fetches: a sample the plan re-reads but still in one of the agent's
    # look-ahead slots (agent_budget.h) is a hit; a few percent at this size.
    fetched = sum(e["fetched_bytes"] for n in nodes for e in n["epochs"])
    assert 0.9 * planned <= fetched <= planned, (fetched, planned)
    disk = json.loads(count.read_text())["read_bytes"]
    assert fetched <= disk <= planned * 1.03 + 2 * 2**20, (disk, fetched, planned)


def test_bench_loader_under_the_cap_counts_what_each_phase_read(tmp_path):
    """`solar bench loader --throttle`: both phases under one kernel cap, reading with O_DIRECT;
    the cgroup's counts of each phase's disk bytes agree with what each plan asked for (the
    baseline every sample every epoch, solar the plan's fetches), and the printed limit is
    those planned bytes at the cap."""
    solar = os.environ.get("SOLAR_BIN")
    if not solar or not os.environ.get("SOLAR_EXAMPLE_TRAIN"):
        pytest.skip("needs SOLAR_BIN and SOLAR_EXAMPLE_TRAIN (ctest sets them)")
    data = tmp_path / "d.h5"
    subprocess.run([solar, "gen", data, "--samples", "96", "--preset", "small", "--no-progress"],
                   check=True, capture_output=True, timeout=120)
    controller_or_skip(data)
    job = [solar, "bench", "loader", "--dataset", data, "--nodes", "2", "-n", "2", "--buffer",
           "50%", "--epochs", "3", "--batch", "4", "--verify", "--json"]
    # Once uncapped, so that the programs' own pages are cached and the counts are the data's.
    subprocess.run(job, check=True, capture_output=True, timeout=300)
    p = subprocess.run([*job, "--throttle", "1G,100000"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    sample = 256 * 1024
    planned = r["planned_bytes"]
    assert planned["baseline"] == 96 * 3 * sample
    assert 0 < planned["solar"] < planned["baseline"]
    for phase in ("baseline", "solar"):
        disk = r["disk"][phase]["bytes"]
        # solar: up to a few percent less than planned (its agents' look-ahead slots, above)
        least = planned[phase] * (0.9 if phase == "solar" else 1)
        assert least <= disk <= planned[phase] * 1.03 + 2 * 2**20, (phase, disk, planned)
        assert r["disk"][phase]["requests"] > 0
    # Bandwidth-bound at this cap: the limit is the ratio of planned bytes.
    assert r["bandwidth_bytes_per_s"] == 2**30 and r["iops"] == 100000
    assert abs(r["limit_speedup"] - planned["baseline"] / planned["solar"]) < 1e-6, r
    assert abs(sum(r["limit_seconds"]) - planned["solar"] / 2**30) < 1e-6, r
    assert r["of_limit"] == pytest.approx(r["speedup"] / r["limit_speedup"])
    assert r["head_start"]["fetched_bytes"] <= planned["solar"]


@pytest.mark.parametrize("extra,named", [
    (["--throttle", "lots"], "--throttle: "),
    (["--throttle", "1G,x"], "--throttle (requests/s after the comma)"),
    (["--throttle", "1G", "--remote-bandwidth", "1M"], "use one"),
    (["--throttle", "1G", "--remote-latency", "2"], "use one"),
])
def test_bench_loader_bad_throttle_is_named(tmp_path, extra, named):
    solar = os.environ.get("SOLAR_BIN")
    if not solar:
        pytest.skip("needs SOLAR_BIN (ctest sets it)")
    data = tmp_path / "d.h5"
    subprocess.run([solar, "gen", data, "--samples", "8", "--preset", "tiny", "--no-progress"],
                   check=True, capture_output=True, timeout=120)
    p = subprocess.run([solar, "bench", "loader", "--dataset", data, *extra],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert named in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
