# SPDX-License-Identifier: Apache-2.0
"""Demand mode (issue 38, items 2-4; agent/src/demand_cache.h): an unmodified script whose order
solar is not told. The SOLAR artifact's way of shuffling (a per-epoch list drawn with numpy's
global RNG, read through DistributedSampler(shuffle=False)) with no --order-file: the agents see
the ranks' reads complete no step of the plan, switch to demand mode within the first epoch and
keep what the ranks read; with --order unknown they start so. Real agents, the real interposer,
the unmodified script (slurm_examples/train_h5py_files_ddp.py) against the same script without
solar: per-batch SHA-256 identical, reads served from the second epoch on, and the switch
reported (stats and solar run's summary). With --peers the nodes' buffers are pooled: each sample
kept by one node (its hash's), read by the others' ranks from it over RMA."""
import pytest

import test_order_file as order_file
from test_order_file import nodes
from test_transparent import digests

# An epoch of 64 steps a rank: the agent tells an order from the plan's by reads outside the
# plan's steps near the ranks' (16 steps past the furthest), so an epoch must be longer; and
# only once every rank has begun its step, which a batch of 8 makes early.
SAMPLES, EPOCHS, BATCH = 2048, 3, 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return order_file.artifact_dataset(tmp_path_factory.mktemp("demand"), SAMPLES, EPOCHS, 11)


def script_run(*args, **kw):
    return order_file.script_run(*args, epochs=EPOCHS, batch=BATCH, **kw)


def later_epochs_served(node):
    return sum(e["hit_reads"] for e in node["demand"]["epochs"][1:])


@pytest.mark.parametrize("workers", [0, 2])
def test_an_order_not_told_switches_to_demand_mode_in_the_first_epoch(tmp_path, data, workers):
    root, order = data
    plain = script_run(tmp_path, root, order, "plain", "--buffer", "100%", "--no-agent",
                       workers=workers)
    assert plain.returncode == 0, plain.stderr
    solar = script_run(tmp_path, root, order, "solar", "--transparent", "--buffer", "50%",
                       "--stats-out", tmp_path / "st.json", workers=workers)
    assert solar.returncode == 0, solar.stderr
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)
    for n in nodes(tmp_path / "st.json"):
        d = n["demand"]
        assert d["mode"] == "demand", n
        # Within the first epoch: before the node's ranks had read an epoch's samples.
        assert d["switched_after_reads"] < d["epoch_reads"], d
        assert "their order is not the plan's" in d["why"], d
        assert len(d["epochs"]) == EPOCHS, d
        assert later_epochs_served(n) > 0, d
        # What the plan read before the switch stays and is bounded by the buffer; nothing is
        # evicted in demand mode, so filled + the plan's reads fit the slots.
        assert d["plan_fetched_samples"] + d["taken_samples"] <= d["buffer_slots"], n
    assert solar.stderr.count("demand mode from ") == 2, solar.stderr
    assert "the script's order is not the plan's: demand mode" in solar.stderr, solar.stderr


def test_order_unknown_fills_the_buffer_from_the_ranks_reads_alone(tmp_path, data):
    root, order = data
    plain = script_run(tmp_path, root, order, "plain", "--buffer", "100%", "--no-agent",
                       ranks=2, nodes=1)
    assert plain.returncode == 0, plain.stderr
    solar = script_run(tmp_path, root, order, "solar", "--transparent", "--order", "unknown",
                       "--buffer", "50%", "--stats-out", tmp_path / "st.json", ranks=2, nodes=1)
    assert solar.returncode == 0, solar.stderr
    assert digests(tmp_path, "solar", 2) == digests(tmp_path, "plain", 2)
    [n] = nodes(tmp_path / "st.json")
    d = n["demand"]
    assert d["mode"] == "demand" and d["switched_after_reads"] == 0, d
    # No plan-order reads: only copies of what the ranks read.
    assert d["plan_fetched_samples"] == 0 and n["totals"]["fetched_samples"] == 0, n
    # About half the dataset's samples fit (the plan's 50% and its staging slots): the buffer
    # is full, a static set of what was read first.
    assert d["full"] and d["taken_samples"] == d["buffer_slots"], d
    assert SAMPLES // 2 <= d["taken_samples"] < SAMPLES, d
    assert 0 < d["filled_samples"] <= d["taken_samples"], d
    assert d["filled_bytes"] == d["filled_samples"] * n["sample_bytes"], d
    t = n["transparent"]
    hits, misses = t["hit_reads"], t["miss_reads"]
    assert hits + misses == EPOCHS * SAMPLES, t  # one read a sample an epoch
    # Only the static set is served, at most once an epoch after the first.
    assert 0 < hits <= (EPOCHS - 1) * d["filled_samples"], (hits, d)
    assert later_epochs_served(n) > 0, d


def test_the_plans_order_is_not_taken_for_another(tmp_path, data):
    root, order = data
    solar = script_run(tmp_path, root, order, "solar", "--transparent", "--buffer", "50%",
                       "--order-file", order, "--stats-out", tmp_path / "st.json", workers=2)
    assert solar.returncode == 0, solar.stderr
    for n in nodes(tmp_path / "st.json"):
        assert n["demand"]["mode"] == "plan", (n["demand"], n["transparent"], solar.stderr)
        assert n["transparent"]["consumed_steps"] == n["epochs_planned"] * n["steps_per_epoch"], n
    assert "demand mode" not in solar.stderr, solar.stderr


@pytest.mark.parametrize("args, named", [
    (["--order", "unknown"], "unknown is for an unmodified script (--transparent)"),
    (["--transparent", "--order", "unknown", "--local-buffer", "10%"],
     "not built with --local-buffer yet"),
    (["--transparent", "--order", "unknown", "--order-file", "x.npy"], "contradict"),
    (["--transparent", "--order", "random"], "'random' is not solar, torch or unknown"),
])
def test_order_unknown_is_refused_where_it_cannot_work(tmp_path, data, args, named):
    root, order = data
    p = script_run(tmp_path, root, order, "no", "--buffer", "50%", *args)
    assert p.returncode == 2, p.stderr
    assert named in p.stderr, p.stderr


def home(x, n):
    """solar_home_node (solar/transparent.h): splitmix64 of the sample id, modulo the nodes."""
    m = (1 << 64) - 1
    z = (x + 0x9e3779b97f4a7c15) & m
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & m
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & m
    return (z ^ (z >> 31)) % n


def pooled(path, n_nodes):
    """The nodes' pooled blocks, checked: each sample kept by one node only, its home's."""
    keeper, blocks = {}, []
    for n in nodes(path):
        d = n["demand"]
        assert d["mode"] == "demand", d
        p = d["pooled"]
        assert p["nodes"] == n_nodes and len(p["held"]) == p["held_samples"] > 0, p
        for x in p["held"]:
            assert home(x, n_nodes) == p["node"], (x, p["node"])
            assert x not in keeper, f"sample {x} kept by nodes {keeper[x]} and {p['node']}"
            keeper[x] = p["node"]
        blocks.append((n, p))
    return blocks


def test_across_the_nodes_each_sample_is_kept_once_and_read_from_its_node(tmp_path, data):
    # 4 nodes x 1 rank, an order the plan does not know: each agent switches, drops what the
    # plan had read of other nodes' samples, keeps its own, and its rank's misses of the
    # others' are read from their buffers over RMA (tcp;ofi_rxm on loopback).
    root, order = data
    plain = script_run(tmp_path, root, order, "plain", "--buffer", "100%", "--no-agent",
                       ranks=4, nodes=4)
    assert plain.returncode == 0, plain.stderr
    solar = script_run(tmp_path, root, order, "solar", "--transparent", "--peers", "--buffer",
                       "30%", "--stats-out", tmp_path / "st.json", ranks=4, nodes=4)
    assert solar.returncode == 0, solar.stderr
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)
    blocks = pooled(tmp_path / "st.json", 4)
    for n, p in blocks:
        d = n["demand"]
        assert d["switched_after_reads"] < d["epoch_reads"], d
        t = n["transparent"]
        # The interposer asked only for others' samples it missed; what the agent read for it
        # from their buffers it copied (a transit slot stays until then).
        assert t["asked_served"] <= t["asked_reads"] and p["fetched_samples"] <= p["asked"], (t, p)
    assert sum(p["fetched_samples"] for _, p in blocks) > 0, blocks
    assert sum(n["transparent"]["asked_served"] for n, _ in blocks) > 0, blocks
    assert sum(p["dropped_foreign"] for _, p in blocks) > 0, blocks  # the plan had read them
    assert "read from their buffers" in solar.stderr, solar.stderr


def test_random_sampler_on_two_nodes_keeps_each_sample_once(tmp_path, data):
    # RandomSampler: every rank reads the whole dataset in an order of its own, each epoch.
    root, _ = data
    args = dict(ranks=4, nodes=2, epochs=2, script_args=("--sampler", "random", "--seed", "5"))
    plain = order_file.script_run(tmp_path, root, None, "plain", "--buffer", "100%",
                                  "--no-agent", batch=BATCH, **args)
    assert plain.returncode == 0, plain.stderr
    solar = order_file.script_run(tmp_path, root, None, "solar", "--transparent", "--peers",
                                  "--order", "unknown", "--buffer", "60%", "--stats-out",
                                  tmp_path / "st.json", batch=BATCH, **args)
    assert solar.returncode == 0, solar.stderr
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)
    blocks = pooled(tmp_path / "st.json", 2)
    # Each node's two ranks read every sample each epoch: once the first has read one placed
    # here it is kept, and a sample placed on the other node is read from there once it has it.
    assert sum(p["held_samples"] for _, p in blocks) > SAMPLES // 2, blocks
    assert all(p["fetched_samples"] > 0 for _, p in blocks), blocks
