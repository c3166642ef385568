# SPDX-License-Identifier: Apache-2.0
"""Streamed plans (issue 40): `solar run --plan streamed` writes the plan's inputs alone (a file
of a few KiB, whatever the epochs) and each agent and rank computes its node's share as the run
goes. The ranks must get exactly the whole plan's batches, every byte verified, the agents must
hit and fetch exactly as they do with the whole plan, in every mode (rings, zero copy, no agent,
resume, an agent killed mid-run, the transparent mode)."""
import json
import os

import pytest

from test_data_path import (RUN, agents_up, at_line, check_sequences, dataset, interrupt,  # noqa: F401
                            kill_agent, recorded, solar_run)
from test_transparent import SERVED, digests, run_script
from testlib import SOLAR, TRAIN, plan_sequences, run

WORLD = 4


def run_with(tmp_path, name, dataset, mode, *extra):
    d = tmp_path / name
    d.mkdir()
    p = solar_run(d, dataset, "--plan", mode, "--stats-out", d / "stats.json", *extra)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    records = {r: recorded(d / f"rank-{r}.txt") for r in range(WORLD)}
    stats = json.loads((d / "stats.json").read_text()) if (d / "stats.json").exists() else None
    return out, d / "plan", records, stats


def planned(stats):
    """What the plan decides, per node and epoch: the batches and samples served. (The hits
    measured also count a sample the plan evicted but still in its slot when it is read again:
    timing, not the plan; they are checked against the plan's whole-run figures in core.)"""
    keys = ("batches_served", "samples_served")
    return [[{k: e[k] for k in keys} for e in node["epochs"]] for node in stats["nodes"]]


@pytest.mark.parametrize("extra", [[], ["--zero-copy"], ["--no-agent"]],
                         ids=["rings", "zero-copy", "no-agent"])
def test_streamed_plan_gives_the_whole_plans_batches_hits_and_fetches(tmp_path, dataset, extra):
    out_w, plan_w, whole, stats_w = run_with(tmp_path, "whole", dataset, "whole", *extra)
    out_s, plan_s, streamed, stats_s = run_with(tmp_path, "streamed", dataset, "streamed", *extra)
    how = "read directly" if "--no-agent" in extra else "from the node agent"
    assert out_s.count(f"verified (0 wrong), {how}") == WORLD, out_s
    assert streamed == whole
    # The file is the inputs alone; plan-dump computes the same plan from it.
    assert os.path.getsize(plan_s) < 4096 < os.path.getsize(plan_w)
    assert plan_sequences(plan_s) == plan_sequences(plan_w)
    check_sequences(tmp_path / "streamed", plan_w, WORLD)
    if "--no-agent" not in extra:
        assert planned(stats_s) == planned(stats_w)
        for node in stats_s["nodes"]:
            assert node["totals"]["hits"] > 0 and node["unplanned_fetched_samples"] == 0, node
            for e in node["epochs"]:
                assert e["hits"] + e["fetched_samples"] == e["samples_served"], e


def test_streamed_plan_resumed_run_gets_the_rest(tmp_path, dataset):
    _, _, whole, stats = run_with(tmp_path, "whole", dataset, "whole")
    spe = stats["nodes"][0]["steps_per_epoch"]
    G = spe + 3
    out, _, rest, stats = run_with(tmp_path, "resumed", dataset, "streamed", "--start-epoch", "1",
                                   "--start-step", "3")
    assert out.count("verified (0 wrong), from the node agent") == WORLD, out
    for r in range(WORLD):
        assert rest[r] == {s: v for s, v in whole[r].items() if s >= G}, r
    assert all(node["start_step"] == G for node in stats["nodes"])


def test_streamed_plan_agent_killed_mid_run_ranks_compute_the_rest(tmp_path, dataset):
    p = solar_run(tmp_path, dataset, "--plan", "streamed", train_args=["--compute-ms", "15"],
                  popen=True)
    rc, out, err = interrupt(p, kill_agent, agents_up(p), at_line(tmp_path / "rank-0.txt", 10))
    assert rc == 0, err
    assert "went away" in err, err
    assert (out + err).count("verified (0 wrong)") == WORLD
    check_sequences(tmp_path, tmp_path / "plan", WORLD)  # nothing lost, nothing twice


def test_streamed_plan_unmodified_script_same_bytes(tmp_path):
    data = tmp_path / "d.h5"
    run(SOLAR, "gen", data, "--samples", "96", "--preset", "tiny", "--seed", "4", "--no-progress")
    plain = run_script(tmp_path, data, "plain", "--buffer", "100%", "--no-agent")
    assert plain.returncode == 0, plain.stderr
    solar = run_script(tmp_path, data, "solar", "--buffer", "50%", "--transparent", "--plan",
                       "streamed", workers=2)
    assert solar.returncode == 0, solar.stdout + solar.stderr
    assert digests(tmp_path, "solar", WORLD) == digests(tmp_path, "plain", WORLD)
    hits = sum(int(m.group(1)) for m in SERVED.finditer(solar.stderr))
    assert hits > 0, solar.stderr


def test_streamed_plan_with_peers_same_peer_reads_and_bytes(tmp_path):
    """--peers over a streamed plan: each agent computes its node's whole share and what the
    other nodes read from it in one pass (not their shares); the ranks get the whole plan's
    batches, every byte verified, and the same samples come from peers' buffers."""
    from test_peers import peer_counts
    data = tmp_path / "p.h5"
    run(SOLAR, "gen", data, "--samples", "192", "--preset", "small", "--seed", "4",
        "--no-progress")
    results = {}
    for mode in ("whole", "streamed"):
        d = tmp_path / mode
        d.mkdir()
        p = run(SOLAR, "run", "-n", "4", "--nodes", "4", "--dataset", data, "--epochs", "3",
                "--batch", "4", "--buffer", "26%", "--peers", "--plan", mode, "--", TRAIN,
                "--verify", "--record", d / "rank-%r.txt", check=False,
                env=dict(os.environ, TMPDIR=str(d)))
        out = p.stdout + p.stderr
        assert p.returncode == 0, out
        assert out.count("verified (0 wrong), from the node agent") == 4, out
        counts = peer_counts(p.stderr)
        assert sum(n for n, _ in counts.values()) > 0, p.stderr
        results[mode] = ({r: recorded(d / f"rank-{r}.txt") for r in range(4)}, counts)
    assert results["streamed"][0] == results["whole"][0]
    # What each node planned to read from peers is the same; a read that found its peer not
    # ready in time falls back to storage (timing), so compare the sums.
    assert {n: sum(c) for n, c in results["streamed"][1].items()} == \
        {n: sum(c) for n, c in results["whole"][1].items()}


def test_plan_mode_is_checked_and_what_cannot_stream_is_named(tmp_path, dataset):
    p = solar_run(tmp_path, dataset, "--plan", "sometimes")
    assert p.returncode == 2 and "--plan" in p.stderr and "auto, whole or streamed" in p.stderr
    d = tmp_path / "ld"
    d.mkdir()
    p = solar_run(tmp_path, dataset, "--plan", "streamed", "--local-buffer", "20%")
    assert p.returncode == 2 and "--local-buffer" in p.stderr, p.stderr
    assert "computed whole" in p.stderr, p.stderr
