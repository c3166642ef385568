# SPDX-License-Identifier: Apache-2.0
"""Demand mode (issue 38, items 2-4; agent/src/demand_cache.h): an unmodified script whose order
solar is not told. The SOLAR artifact's way of shuffling (a per-epoch list drawn with numpy's
global RNG, read through DistributedSampler(shuffle=False)) with no --order-file: the agents see
the ranks' reads complete no step of the plan, switch to demand mode within the first epoch and
keep what the ranks read; with --order unknown they start so. Real agents, the real interposer,
the unmodified script (slurm_examples/train_h5py_files_ddp.py) against the same script without
solar: per-batch SHA-256 identical, reads served from the second epoch on, and the switch
reported (stats and solar run's summary)."""
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
    (["--transparent", "--order", "unknown", "--peers"], "not built with --peers yet"),
    (["--transparent", "--order", "unknown", "--order-file", "x.npy"], "contradict"),
    (["--transparent", "--order", "random"], "'random' is not solar, torch or unknown"),
])
def test_order_unknown_is_refused_where_it_cannot_work(tmp_path, data, args, named):
    root, order = data
    p = script_run(tmp_path, root, order, "no", "--buffer", "50%", *args)
    assert p.returncode == 2, p.stderr
    assert named in p.stderr, p.stderr
