# SPDX-License-Identifier: Apache-2.0
"""Resume (issue 14 item 4): a job started again at an epoch and step — `solar run --start-epoch
E --start-step S` (or --resume-from a loader's state_dict) — whose agents begin at that step:
the ranks get exactly the rest of the plan, every byte checked, and the agents neither read nor
serve the steps before it."""
import json
import os
import subprocess

from test_data_path import RUN, dataset, recorded, standalone_agent  # noqa: F401
from testlib import SOLAR, TRAIN, plan_sequences, run

WORLD, NODES, RANKS_PER_NODE = 4, 2, 2


def resumed_run(tmp_path, name, dataset, *extra):
    d = tmp_path / name
    d.mkdir()
    env = dict(os.environ, TMPDIR=str(d))
    p = run(SOLAR, "run", *RUN, "--dataset", dataset, "--plan-out", d / "plan",
            "--stats-out", d / "stats.json", *extra, "--", TRAIN, "--verify",
            "--record", d / "rank-%r.txt", "--report", d / "report-%r.json", check=False, env=env)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    records = {r: recorded(d / f"rank-{r}.txt") for r in range(WORLD)}
    reports = {r: json.loads((d / f"report-{r}.json").read_text()) for r in range(WORLD)}
    stats = json.loads((d / "stats.json").read_text()) if (d / "stats.json").exists() else None
    return out, d / "plan", records, reports, stats


def test_run_started_at_epoch_and_step_gets_exactly_the_rest_of_the_plan(tmp_path, dataset):
    out, plan, full, full_reports, full_stats = resumed_run(tmp_path, "full", dataset)
    assert out.count("verified (0 wrong), from the node agent") == WORLD, out
    seq = plan_sequences(plan)
    spe = full_stats["nodes"][0]["steps_per_epoch"]
    total = 3 * spe
    assert spe > 4
    for node in full_stats["nodes"]:
        assert node["start_step"] == 0 and node["unplanned_fetched_samples"] == 0, node

    G = spe + 3  # epoch 1, step 3
    out, plan2, rest, reports, stats = resumed_run(tmp_path, "resumed", dataset,
                                                   "--start-epoch", 1, "--start-step", 3)
    assert plan_sequences(plan2) == seq  # the same plan
    assert out.count("verified (0 wrong), from the node agent") == WORLD, out
    assert "continuing from step" not in out, out  # no rank fell back to direct reads
    assert f"started at step {G}" in out, out
    for r in range(WORLD):
        # Exactly the steps >= G, each with the full run's samples (their bytes verified).
        assert sorted(rest[r]) == list(range(G, total)), r
        assert rest[r] == {s: v for s, v in full[r].items() if s >= G}, r
        assert reports[r]["wrong"] == 0
        assert reports[r]["epoch_samples"][0] == 0
        assert reports[r]["epoch_samples"][1] == sum(len(full[r][s]) for s in range(G, 2 * spe))
        assert reports[r]["epoch_samples"][2] == full_reports[r]["epoch_samples"][2]
    # The agents did not serve (or read for) a step before G; what the plan had in the buffer at
    # G was read when first needed, and is counted.
    unplanned = 0
    for node in stats["nodes"]:
        m = node["node"]
        assert node["start_step"] == G
        e0, e1, e2 = node["epochs"]
        assert e0["batches_served"] == 0 and e0["samples_served"] == 0 and not e0["started"]
        assert e0["fetched_samples"] == 0
        assert e1["batches_served"] == (spe - 3) * RANKS_PER_NODE
        assert e2["batches_served"] == spe * RANKS_PER_NODE
        served = sum(len(seq[m * RANKS_PER_NODE + r][s]) for r in range(RANKS_PER_NODE)
                     for s in range(G, total))
        assert node["totals"]["samples_served"] == served
        assert node["totals"]["hits"] + node["totals"]["fetched_samples"] == served
        unplanned += node["unplanned_fetched_samples"]
    assert unplanned > 0  # the plan keeps samples across steps; a restarted agent has none

    # The direct path starts there too.
    out, _, direct, _, _ = resumed_run(tmp_path, "direct", dataset, "--no-agent",
                                       "--start-epoch", 1, "--start-step", 3)
    assert out.count("verified (0 wrong), read directly") == WORLD, out
    assert direct == rest

    # A global step alone is the same start; the very end leaves nothing.
    out, _, same, _, _ = resumed_run(tmp_path, "global", dataset, "--start-step", G)
    assert same == rest
    out, _, none, _, _ = resumed_run(tmp_path, "end", dataset, "--start-epoch", 3)
    assert all(v == {} for v in none.values()), out


def test_run_resumed_from_a_state_dict_file(tmp_path, dataset):
    out, _, full, _, full_stats = resumed_run(tmp_path, "full", dataset)
    spe = full_stats["nodes"][0]["steps_per_epoch"]
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"format": "solar.Loader/1", "step": 2 * spe + 1, "epochs": 3,
                                 "steps_per_epoch": spe, "world_size": WORLD}))
    out, _, rest, _, stats = resumed_run(tmp_path, "resumed", dataset, "--resume-from", state)
    assert out.count("verified (0 wrong), from the node agent") == WORLD, out
    for r in range(WORLD):
        assert rest[r] == {s: v for s, v in full[r].items() if s > 2 * spe}, r
    assert all(n["start_step"] == 2 * spe + 1 for n in stats["nodes"])


def test_start_beyond_the_plan_is_refused_naming_its_length(tmp_path, dataset):
    def refused(*extra):
        p = run(SOLAR, "run", *RUN, "--dataset", dataset, *extra, "--", TRAIN, check=False,
                env=dict(os.environ, TMPDIR=str(tmp_path)))
        assert p.returncode == 2, p.stdout + p.stderr
        return p.stderr

    err = refused("--start-epoch", 3, "--start-step", 1)
    assert "beyond the end of the plan" in err and "the plan has" in err and "3 epochs of" in err
    err = refused("--start-step", 100000)
    assert "--start-step" in err and "beyond the end of the plan" in err, err
    err = refused("--start-epoch", 1, "--start-step", 10000)
    assert "does not exist" in err and "steps within an epoch are 0.." in err, err
    wrong = tmp_path / "other-state.json"
    wrong.write_text(json.dumps({"step": 3, "world_size": 8}))
    err = refused("--resume-from", wrong)
    assert "world_size 8" in err, err
    # The agent itself refuses a start beyond its plan.
    plan = tmp_path / "p"
    run(SOLAR, "plan", "--samples", 600, "--sample-bytes", 4096, "--epochs", 2, "--batch", 6,
        "--buffer", "40%", "--out", plan)
    from test_data_path import AGENT
    p = run(AGENT, "--plan", plan, "--node", 0, "--dataset", dataset, "--socket",
            tmp_path / "a.sock", "--start-step", 10 ** 6, check=False, timeout=60)
    assert p.returncode == 1 and "--start-step 1000000 is beyond the end of the plan" in p.stderr, \
        p.stderr


def test_rank_starts_where_its_agent_starts(tmp_path, dataset):
    """An agent started by hand at --start-step 7: a rank without SOLAR_START_* learns the start
    from the agent's hello; a rank told a later start (SOLAR_START_STEP=9) takes and releases the
    agent's steps in between. Both get the plan's batches from the agent, every byte verified."""
    with standalone_agent(tmp_path, dataset, "--start-step", 7) as (_, sock, log, plan):
        seq = plan_sequences(plan)
        total = max(seq[0]) + 1
        ranks = []
        for r, start in ((0, None), (1, "9")):
            env = {k: v for k, v in os.environ.items() if not k.startswith("SOLAR_")}
            env.update(SOLAR_PLAN=str(plan), SOLAR_NODE="0", SOLAR_LOCAL_RANK=str(r),
                       SOLAR_DATASET=str(dataset), SOLAR_SOCKET=str(sock))
            if start:
                env["SOLAR_START_STEP"] = start
            ranks.append(subprocess.Popen([str(TRAIN), "--verify", "--record",
                                           str(tmp_path / f"rank-{r}.txt")], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate(timeout=120)[0] for p in ranks]
        for p, out in zip(ranks, outs):
            assert p.returncode == 0 and "verified (0 wrong), from the node agent" in out, out
        assert recorded(tmp_path / "rank-0.txt") == {s: v for s, v in seq[0].items() if s >= 7}
        assert recorded(tmp_path / "rank-1.txt") == {s: v for s, v in seq[1].items() if s >= 9}
        assert total > 9
    assert "starting at step 7" in log.read_text()
