# SPDX-License-Identifier: Apache-2.0
"""`solar plan` / `solar plan-dump` from the outside: errors, JSON, determinism, and an
independent recount of every metric from the dumped rows."""
import csv
import io
import json
import os
from collections import defaultdict

import pytest

BASE = ["--samples", "400", "--epochs", "3", "--nodes", "2", "--ranks-per-node", "2",
        "--batch", "4", "--sample-bytes", "1K", "--buffer", "60K"]


@pytest.mark.parametrize("args,flag", [
    (["--samples", "0", "--epochs", "1", "--batch", "1", "--buffer", "1G"], "--samples"),
    (["--samples", "-3", "--epochs", "1", "--batch", "1", "--buffer", "1G"], "--samples"),
    (["--samples", "99999999999999999999", "--epochs", "1", "--batch", "1", "--buffer", "1G"], "--samples"),
    (["--samples", "100", "--epochs", "0", "--batch", "1", "--buffer", "1G"], "--epochs"),
    (["--samples", "100", "--epochs", "1", "--batch", "200", "--buffer", "1G"], "--batch"),
    (["--samples", "100", "--epochs", "1", "--batch", "1", "--buffer", "lots"], "--buffer"),
    (["--samples", "100", "--epochs", "1", "--batch", "1", "--buffer", "1K"], "--buffer"),
    (["--samples", "10", "--epochs", "1", "--batch", "1", "--nodes", "4", "--ranks-per-node", "4",
      "--buffer", "1G"], "--ranks-per-node"),
    (["--samples", "1000000", "--epochs", "9000", "--batch", "1", "--buffer", "1%"], "--epochs"),
    (["--samples", "100", "--epochs", "1", "--batch", "4", "--imbalance", "4", "--buffer", "1G"],
     "--imbalance"),
    (["--samples", "100", "--epochs", "1", "--batch", "1", "--buffer", "1G", "--order", "x"], "--order"),
    (["--samples", "100", "--epochs", "1", "--batch", "1", "--buffer", "1G", "--policy", "x"], "--policy"),
    (["--scenario", "nope"], "--scenario"),
    (["--scenario", "seed", "--sample-bytes", "0"], "--sample-bytes"),
])
def test_bad_input_is_one_line_exit_2_and_no_file(solar, tmp_path, args, flag):
    out = tmp_path / "x.plan"
    p = solar("plan", *args, "--out", out, check=False)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert flag in lines[0], lines[0]
    assert "allowed" in lines[0] or "choose" in lines[0] or "not" in lines[0], lines[0]
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_compare_json_has_every_policy_and_key(solar):
    p = solar("plan", "--scenario", "seed", "--policy", "all", "--json")
    doc = json.loads(p.stdout)
    got = {r["policy"]: r for r in doc["results"]}
    assert set(got) == {"none", "lru", "solar-paper", "nopfs", "solar", "sampler"}
    for r in got.values():
        for key in ("policy", "remote_fetches", "remote_bytes", "hits", "hit_rate",
                    "lower_bound_fetches", "ratio_to_lower_bound", "plan_seconds", "peak_rss_bytes"):
            assert key in r, key
        assert r["lower_bound_fetches"] == 800 + 2 * 288
        assert r["remote_bytes"] == r["remote_fetches"] * 16 * 2**20
        assert r["peak_rss_bytes"] > 0
    assert got["solar"]["remote_fetches"] <= min(r["remote_fetches"] for r in got.values())


def test_table_output(solar):
    p = solar("plan", "--scenario", "seed", "--compare")
    for name in ("none", "lru", "solar-paper", "nopfs", "solar", "sampler", "lower bound"):
        assert name in p.stdout


def test_same_inputs_same_bytes_other_seed_other_bytes(solar, tmp_path):
    a, b, c = tmp_path / "a.plan", tmp_path / "b.plan", tmp_path / "c.plan"
    solar("plan", *BASE, "--seed", "5", "--out", a)
    solar("plan", *BASE, "--seed", "5", "--out", b)
    solar("plan", *BASE, "--seed", "6", "--out", c)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.plan", "b.plan", "c.plan"]  # no temporaries


@pytest.mark.parametrize("extra", [[], ["--imbalance", "2"], ["--order", "torch", "--drop-last"],
                                   ["--policy", "lru"], ["--policy", "solar-paper"],
                                   ["--policy", "nopfs"], ["--policy", "sampler"],
                                   ["--peer-fetch"]])
def test_dump_recount_matches_metrics(solar, tmp_path, extra):
    f = tmp_path / "p.plan"
    solar("plan", *BASE, *extra, "--out", f)
    meta = json.loads(solar("plan-dump", f, "--format", "json").stdout)
    rows = list(csv.DictReader(io.StringIO(solar("plan-dump", f, "--format", "csv").stdout)))
    cfg = meta["config"]
    b, d = cfg["batch"], cfg["imbalance"]
    assert len(rows) == meta["metrics"]["accesses"] == len(meta["accesses"])
    hits = sum(int(r["hit"]) for r in rows)
    m = meta["metrics"]
    assert hits == m["hits"]
    assert len(rows) - hits == m["remote_fetches"] + m["peer_fetches"]
    per_epoch = defaultdict(lambda: [0, 0])
    per_rank_step = defaultdict(int)
    per_epoch_samples = defaultdict(list)
    for r in rows:
        e = int(r["epoch_position"])
        per_epoch[e][0] += 1
        per_epoch[e][1] += int(r["hit"])
        per_rank_step[(int(r["global_step"]), int(r["rank"]))] += 1
        per_epoch_samples[e].append(int(r["sample"]))
    for e, pe in enumerate(m["per_epoch"]):
        assert per_epoch[e] == [pe["accesses"], pe["hits"]]
    steps = meta["steps_per_epoch"]
    for (t, rank), n in per_rank_step.items():
        if t % steps != steps - 1 or "--drop-last" in extra:  # full steps
            assert b - d <= n <= b + d, (t, rank, n)
    if "--drop-last" not in extra:  # 400 samples, 4 ranks: every epoch is a permutation
        for e, samples in per_epoch_samples.items():
            assert sorted(samples) == list(range(400)), e


def test_dump_one_node_only(solar, tmp_path):
    f = tmp_path / "p.plan"
    solar("plan", *BASE, "--out", f)
    rows = list(csv.DictReader(io.StringIO(solar("plan-dump", f, "--node", "1").stdout)))
    assert rows and all(r["node"] == "1" for r in rows)
    p = solar("plan-dump", f, "--node", "2", check=False)
    assert p.returncode == 2 and "--node" in p.stderr


def test_dump_rejects_damaged_files(solar, tmp_path):
    f = tmp_path / "p.plan"
    solar("plan", *BASE, "--out", f)
    data = f.read_bytes()
    (tmp_path / "trunc.plan").write_bytes(data[: len(data) // 2])
    p = solar("plan-dump", tmp_path / "trunc.plan", check=False)
    assert p.returncode == 1 and "truncated" in p.stderr, p.stderr
    bad = bytearray(data)
    bad[-50] ^= 0xFF
    (tmp_path / "bad.plan").write_bytes(bytes(bad))
    p = solar("plan-dump", tmp_path / "bad.plan", check=False)
    assert p.returncode == 1 and "checksum" in p.stderr, p.stderr
    p = solar("plan-dump", tmp_path / "missing.plan", check=False)
    assert p.returncode == 1 and "missing.plan" in p.stderr


# Samples of differing sizes (issue 36): the sizes from a file, the bytes recounted here from the
# dumped rows (a miss reads its sample's bytes), the bound on bytes recomputed from its formula.
SIZED = ["--epochs", "3", "--nodes", "1", "--ranks-per-node", "2", "--batch", "4"]


def _sizes_file(tmp_path, n=300):
    sizes = [1000 + (i * 7919) % 1001 for i in range(n)]  # 1000..2000 bytes, spread
    f = tmp_path / "sizes.txt"
    f.write_text("# bytes per sample\n" + "\n".join(map(str, sizes)) + "\n")
    return f, sizes


@pytest.mark.parametrize("policy", ["sampler", "solar", "lru"])
def test_sized_plan_counts_bytes_and_its_dump_recounts_them(solar, tmp_path, policy):
    f, sizes = _sizes_file(tmp_path)
    plan = tmp_path / "s.plan"
    p = solar("plan", *SIZED, "--sample-sizes", f, "--buffer", "40%", "--policy", policy,
              "--out", plan, "--json")
    doc = json.loads(p.stdout)
    cfg, r = doc["config"], doc["results"][0]
    total = sum(sizes)
    assert cfg["samples"] == 300 and cfg["sized"] and cfg["dataset_bytes"] == total
    assert cfg["buffer_bytes"] == int(0.40 * total)
    assert r["lower_bound_bytes"] == total + 2 * (total - cfg["buffer_bytes"])
    assert json.loads(solar("plan-dump", plan, "--format", "json").stdout)["sample_sizes"] == sizes
    rows = list(csv.DictReader(io.StringIO(solar("plan-dump", plan).stdout)))
    missed = sum(sizes[int(x["sample"])] for x in rows if x["hit"] == "0")
    assert missed == r["remote_bytes"]
    assert r["remote_bytes"] >= r["lower_bound_bytes"]
    assert r["ratio_bytes_to_lower_bound"] == pytest.approx(r["remote_bytes"] / r["lower_bound_bytes"])
    # Fragmentation: the samples as best-fit extents of one region need a little more.
    assert 0.9 < r["extent_arena_over_buffer"] < 1.2, r
    assert r["extent_arena_bytes"] == pytest.approx(r["extent_arena_over_buffer"] * cfg["buffer_bytes"])
    if policy == "sampler":  # one node, Belady by bytes: at the bound but for a sample's slack
        assert r["ratio_bytes_to_lower_bound"] <= 1.05
    table = solar("plan", *SIZED, "--sample-sizes", f, "--buffer", "40%", "--policy", policy).stdout
    assert "remote bytes" in table and "byte bound" in table and "best-fit extents" in table


def test_sized_plan_refusals_name_what_is_wrong(solar, tmp_path):
    f, sizes = _sizes_file(tmp_path)
    p = solar("plan", *SIZED, "--sample-sizes", f, "--buffer", "1500", check=False)
    assert p.returncode == 2
    assert "smaller than the largest sample" in p.stderr, p.stderr
    assert "1.46 KiB" in p.stderr and "1.95 KiB" in p.stderr, p.stderr  # 1500 and 2000 bytes
    p = solar("plan", *SIZED, "--sample-sizes", f, "--samples", "299", "--buffer", "1M",
              check=False)
    assert p.returncode == 2 and "300 sizes for 299 samples" in p.stderr.replace("lists ", ""), p.stderr
    bad = tmp_path / "bad.txt"
    bad.write_text("100\n12x\n")
    p = solar("plan", *SIZED, "--sample-sizes", bad, "--buffer", "1M", check=False)
    assert p.returncode == 2 and "line 2" in p.stderr, p.stderr
    p = solar("plan", *SIZED, "--samples", "300", "--size-spread", "50%", "--sample-bytes", "1K",
              "--buffer", "40%", "--policy", "nopfs", check=False)
    assert p.returncode == 2 and "nopfs" in p.stderr and "--policy" in p.stderr, p.stderr
    # --compare leaves the two equal-size policies out, and says so.
    p = solar("plan", *SIZED, "--samples", "300", "--size-spread", "50%", "--sample-bytes", "1K",
              "--buffer", "40%", "--compare", "--json")
    assert {r["policy"] for r in json.loads(p.stdout)["results"]} == {"none", "lru", "solar", "sampler"}
    assert "left out" in p.stderr


def test_sized_plans_are_repeatable_and_refused_by_an_agent_of_one_size_samples(solar, tmp_path):
    a, b = tmp_path / "a.plan", tmp_path / "b.plan"
    args = [*SIZED, "--samples", "300", "--size-spread", "30%", "--sample-bytes", "4K",
            "--buffer", "50%", "--seed", "3"]
    solar("plan", *args, "--out", a)
    solar("plan", *args, "--out", b)
    assert a.read_bytes() == b.read_bytes()
    import subprocess
    import testlib
    assert os.access(testlib.AGENT, os.X_OK), f"no agent at {testlib.AGENT}: build first"
    solar("gen", tmp_path / "one.h5", "--samples", "300", "--shape", "4096", "--dtype", "uint8",
          "--no-progress")
    p = subprocess.run([testlib.AGENT, "--plan", str(a), "--node", "0",
                        "--dataset", str(tmp_path / "one.h5"),
                        "--socket", str(tmp_path / "s.sock")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "differing sizes" in p.stderr and "one size" in p.stderr, p.stderr


def test_local_tier_plans_meet_both_bounds_and_are_replayed(solar):
    """--local-buffer: s1 with 7.5% of N in memory and 15% on local disk per node."""
    args = ["plan", "--scenario", "s1", "--imbalance", "1", "--buffer", "7.5%", "--local-buffer",
            "15%"]
    doc = json.loads(solar(*args, "--compare", "--json").stdout)
    c = doc["config"]
    assert c["local_samples"] == 1228 and c["buffer_samples"] == 614, c
    got = {r["policy"]: r for r in doc["results"]}
    assert set(got) == {"lru", "solar-paper", "nopfs", "solar", "sampler"}  # none: no buffer
    n, e, m = 8192, 10, 4
    for r in got.values():
        assert r["lower_bound_fetches"] == n + (e - 1) * (n - m * (614 + 1228))
        t = r["local_tier"]
        assert t["local_reads"] >= t["local_reads_bound"]
        assert t["memory_hits"] + t["local_reads"] + r["remote_fetches"] == r["accesses"], r
        assert sum(t["local_reads_per_epoch"]) == t["local_reads"]
        assert t["local_writes"] <= t["local_reads"], t  # only what is read back is written
    assert got["solar"]["ratio_to_lower_bound"] <= 1.02
    assert got["solar"]["local_tier"]["local_reads_over_bound"] <= 1.01
    assert all(x > 0 for x in got["solar"]["local_tier"]["local_reads_per_epoch"][1:])
    text = solar(*args, "--policy", "solar").stdout
    assert "local tier: 19.2 GiB per node (1228 samples)" in text, text
    assert "local reads" in text and "recounted, equal" in text, text


@pytest.mark.parametrize("extra,says", [
    (["--local-buffer", "lots"], "--local-buffer"),
    (["--local-buffer", "1K"], "smaller than one sample"),
    (["--local-buffer", "10%", "--peer-fetch"], "--peer-fetch"),
    (["--local-buffer", "10%", "--policy", "none"], "policy none"),
    (["--local-buffer", "10%", "--size-spread", "20"], "differing sizes"),
])
def test_local_tier_refusals_name_what_is_wrong(solar, tmp_path, extra, says):
    extra = [str(tmp_path / a) if a == "x.plan" else a for a in extra]
    p = solar("plan", "--scenario", "seed", *extra, check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and says in line, line
    assert list(tmp_path.iterdir()) == []


def test_node_share_streamed_has_the_whole_plans_metrics_and_writes_nothing(solar, tmp_path):
    """`solar plan --node M` computes node M's share step by step (issue 40): the metrics are the
    whole plan's, the node's accesses are its ranks' share of them, and no file appears."""
    whole = json.loads(solar("plan", *BASE, "--peer-fetch", "--json").stdout)["results"][0]
    for node in (0, 1):
        out = json.loads(solar("plan", *BASE, "--peer-fetch", "--node", str(node), "--window",
                               "3", "--json").stdout)["results"][0]
        for key in ("remote_fetches", "hits", "accesses", "peer_fetches", "per_epoch"):
            assert out[key] == whole[key], key
        s = out["streamed"]
        assert s["node"] == node and s["window_steps"] == 3 and s["bytes_written"] == 0
        assert s["first_step_seconds"] > 0 and s["node_accesses"] == whole["accesses"] // 2


def test_streamed_file_is_the_inputs_alone_and_dumps_as_the_whole_plan(solar, tmp_path):
    whole, streamed = tmp_path / "whole.plan", tmp_path / "streamed.plan"
    solar("plan", *BASE, "--out", whole)
    p = solar("plan", *BASE, "--streamed", "--out", streamed, "--json")
    info = json.loads(p.stdout)["streamed"]
    assert info["bytes"] == os.path.getsize(streamed) < 4096 < os.path.getsize(whole)
    assert solar("plan-dump", streamed).stdout == solar("plan-dump", whole).stdout
    head = json.loads(solar("plan-dump", streamed, "--format", "json").stdout)
    assert head["streamed"] is True and head["metrics"]["remote_fetches"] == 0
    assert head["metrics"]["lower_bound_fetches"] > 0


@pytest.mark.parametrize("args,flag", [
    (["--node", "2"], "--node"),
    (["--window", "4"], "--window"),
    (["--node", "0", "--window", "0"], "--window"),
    (["--node", "0", "--out", "OUT"], "--out"),
    (["--node", "0", "--streamed"], "--streamed"),
    (["--streamed", "--compare"], "--streamed"),
    (["--streamed", "--local-buffer", "40K"], "--local-buffer"),
    (["--node", "0", "--local-buffer", "40K"], "--node"),
])
def test_streamed_refusals_name_the_option(solar, tmp_path, args, flag):
    out = tmp_path / "x.plan"
    p = solar("plan", *BASE, *[out if a == "OUT" else a for a in args], check=False)
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and flag in lines[0], p.stderr
    assert not out.exists()
