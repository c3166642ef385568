# SPDX-License-Identifier: Apache-2.0
"""solar.Loader and solar.torch.Loader in rank programs under a real `solar run`: real agents
(zero copy from the node buffer), the direct path, the torch order and per-batch weights."""
import os
import sys
from collections import Counter, defaultdict

import pytest

import solar
from conftest import SAMPLES, SOLAR, run
from test_loader import plan_sequences

RANK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_check.py")


def solar_run(workdir, name, dataset, *run_args, rank_args=()):
    d = os.path.join(workdir, name)
    os.makedirs(d)
    plan = os.path.join(d, "plan")
    # A private TMPDIR: solar run's run directory (plan, sockets, logs) must be gone after.
    # (The agents' buffers are memfds: nothing to check in /dev/shm.)
    tmp = os.path.join(d, "tmp")
    os.makedirs(tmp)
    env = dict(os.environ, TMPDIR=tmp)
    p = run(SOLAR, "run", "--ranks-per-node", 2, "--nodes", 2, "--dataset", dataset, "--epochs", 2,
            "--batch", 6, "--plan-out", plan, *run_args, "--", sys.executable, RANK,
            "--record", d, "--library", solar.library_path, *rank_args, check=False, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert os.listdir(tmp) == []
    records = {}
    for rank in range(4):
        with open(os.path.join(d, f"rank-{rank}.txt")) as f:
            rows = [line.split() for line in f]
        records[rank] = {int(r[0]): (int(r[1]), float(r[2]), list(map(int, r[3:]))) for r in rows}
    return p.stdout + p.stderr, plan, records


def check_plan(plan, records):
    seq = plan_sequences(plan)
    for rank, rows in records.items():
        assert {s: v[2] for s, v in rows.items()} == seq[rank], f"rank {rank} differs from plan"


def test_numpy_loader_zero_copy_from_agents(workdir, dataset):
    out, plan, records = solar_run(workdir, "agents", dataset, "--buffer", "40%",
                                   rank_args=["--views"])
    assert out.count("0 wrong, from the node agent") == 4, out
    check_plan(plan, records)


def test_numpy_loader_without_agents(workdir, dataset):
    out, plan, records = solar_run(workdir, "direct", dataset, "--buffer", "40%", "--no-agent",
                                   rank_args=["--views"])
    assert out.count("0 wrong, read directly") == 4, out
    check_plan(plan, records)


def test_torch_order_global_batches_and_weights(workdir, dataset):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DistributedSampler
    out, plan, records = solar_run(workdir, "torch-order", dataset, "--buffer", "30%",
                                   "--order", "torch", "--imbalance", 2, "--seed", 11,
                                   rank_args=["--torch"])
    assert out.count("0 wrong, from the node agent") == 4, out
    check_plan(plan, records)
    steps = defaultdict(list)
    for rows in records.values():
        for step, (epoch, weight, samples) in rows.items():
            steps[step].append((epoch, weight, samples))
    # Weights keep a weighted mean of per-rank losses unbiased: they sum to the world size.
    for step, parts in steps.items():
        assert sum(w for _, w, _ in parts) == pytest.approx(4), step
        for _, w, samples in parts:
            assert w * sum(len(s) for _, _, s in parts) / 4 == pytest.approx(len(samples))
    # Every step's global batch is DistributedSampler's (membership; ranks may differ).
    per_epoch = len(steps) // 2
    for epoch in range(2):
        per_rank = []
        for r in range(4):
            s = DistributedSampler(range(SAMPLES), num_replicas=4, rank=r, shuffle=True, seed=11)
            s.set_epoch(epoch)
            per_rank.append(list(s))
        for j in range(per_epoch):
            want = Counter(i for lst in per_rank for i in lst[j * 6:(j + 1) * 6])
            got = Counter(i for _, _, smp in steps[epoch * per_epoch + j] for i in smp)
            assert got == want, f"epoch {epoch} step {j}"
    del torch


def test_state_dict_resume_under_solar_run_starts_the_agents_there(workdir, dataset):
    """A checkpoint's state_dict saved as JSON, and the job launched again with `solar run
    --resume-from` it: the agents start at its step, load_state_dict is a cursor move (nothing
    re-read), and every batch from there is the uninterrupted run's, every byte checked."""
    import json
    out, plan, full = solar_run(workdir, "resume-full", dataset, "--buffer", "40%")
    spe = max(full[0]) // 2 + 1
    stop = spe + spe // 2  # mid-epoch 1
    state = os.path.join(workdir, "resume-state-%r.json")
    out, _, first = solar_run(workdir, "resume-first", dataset, "--buffer", "40%",
                              rank_args=["--stop-after-step", stop, "--state", state])
    for rank in range(4):
        assert first[rank] == {s: v for s, v in full[rank].items() if s <= stop}, rank
    saved = json.load(open(state.replace("%r", "0")))
    assert saved["step"] == stop + 1
    stats = os.path.join(workdir, "resume-stats.json")
    out, _, rest = solar_run(workdir, "resume-second", dataset, "--buffer", "40%",
                             "--resume-from", state.replace("%r", "0"), "--stats-out", stats,
                             rank_args=["--state", state])
    assert out.count("0 wrong, from the node agent") == 4, out
    assert "continuing from step" not in out, out
    for rank in range(4):
        assert rest[rank] == {s: v for s, v in full[rank].items() if s > stop}, rank
    for node in json.load(open(stats))["nodes"]:
        assert node["start_step"] == stop + 1
        e0, e1 = node["epochs"]
        assert e0["batches_served"] == 0 and e0["fetched_samples"] == 0
        assert e1["batches_served"] == (2 * spe - stop - 1) * 2
