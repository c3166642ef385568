# SPDX-License-Identifier: Apache-2.0
"""An agent killed before it is ready (found by scripts/soak: `solar run` failed the whole job
with 'the agent of node N exited (137) before it was ready'): its ranks read directly, as when it
dies during the run; an agent that exits by itself (a setting it refuses) still stops the job
with its reason. `solar run` finds solar-agent beside itself, so a copy of `solar` in a folder
with a wrapper named solar-agent decides what each node's agent does, at a known moment."""
import os
import shutil

from test_data_path import check_sequences, shm_entries
from testlib import AGENT, SOLAR, TRAIN, run


def solar_with_agent(tmp_path, script):
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(SOLAR, d / "solar")
    wrapper = d / "solar-agent"
    wrapper.write_text("#!/bin/sh\n" + script.replace("AGENT", AGENT))
    wrapper.chmod(0o755)
    return d / "solar"


def job(tmp_path, solar):
    data = tmp_path / "d.h5"
    run(SOLAR, "gen", data, "--samples", "120", "--preset", "tiny", "--seed", "7", "--no-progress")
    env = dict(os.environ, TMPDIR=str(tmp_path))
    return run(solar, "run", "-n", "4", "--nodes", "2", "--buffer", "40%", "--epochs", "2",
               "--batch", "4", "--dataset", data, "--plan-out", tmp_path / "plan", "--", TRAIN,
               "--verify", "--record", tmp_path / "rank-%r.txt", check=False, env=env)


def test_agent_killed_before_ready_its_ranks_read_directly(tmp_path):
    before = shm_entries()
    solar = solar_with_agent(tmp_path, 'case " $* " in *" --node 1 "*) kill -KILL $$;; esac\n'
                                       'exec AGENT "$@"\n')
    p = job(tmp_path, solar)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "node 1: the agent was killed (signal 9) before it was ready; its ranks read directly" \
        in p.stderr, p.stderr
    assert out.count("verified (0 wrong), from the node agent") == 2, out
    assert out.count("verified (0 wrong), read directly") == 2, out
    check_sequences(tmp_path, tmp_path / "plan", 4)  # nothing lost, nothing twice
    assert shm_entries() == before
    assert not [d for d in os.listdir(tmp_path) if d.startswith("solar-run-")], "run folder left"


def test_agent_that_exits_by_itself_before_ready_still_stops_the_job(tmp_path):
    solar = solar_with_agent(tmp_path, 'case " $* " in *" --node 1 "*) echo "no, thanks" >&2; '
                                       'exit 1;; esac\nexec AGENT "$@"\n')
    p = job(tmp_path, solar)
    assert p.returncode != 0, p.stdout + p.stderr
    assert "the agent of node 1 exited (1) before it was ready" in p.stderr, p.stderr
