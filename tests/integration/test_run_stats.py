# SPDX-License-Identifier: Apache-2.0
"""solar run --stats-out and solar report with real agents and ranks: the merged per-node
statistics of a 2-node run, and the picture drawn from them, parsed back."""
import json
import os
import re
import xml.etree.ElementTree as ET

import pytest

from testlib import SOLAR, TRAIN, run

SAMPLES, EPOCHS = 400, 3
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def stats(tmp_path_factory):
    d = tmp_path_factory.mktemp("stats")
    data = d / "d.h5"
    run(SOLAR, "gen", data, "--samples", SAMPLES, "--preset", "tiny", "--no-progress")
    out = d / "run.json"
    run(SOLAR, "run", "-n", "4", "--nodes", "2", "--dataset", data, "--buffer", "40%",
        "--epochs", EPOCHS, "--batch", "8", "--stats-out", out, "--", TRAIN, "--verify")
    return out


def test_stats_out_merges_every_nodes_epochs(stats):
    doc = json.loads(stats.read_text())
    assert doc["source"] == "solar run" and [n["node"] for n in doc["nodes"]] == [0, 1]
    served = 0
    for n in doc["nodes"]:
        assert len(n["epochs"]) == EPOCHS, n
        for e in n["epochs"]:
            assert e["samples_served"] == e["hits"] + e["fetched_samples"]
            served += e["samples_served"]
        assert n["epochs"][0]["hits"] == 0  # nothing is resident before the first epoch
        assert n["head_start"]["fetched_bytes"] >= 0
    assert served == SAMPLES * EPOCHS
    assert not os.path.exists(str(stats) + ".tmp")


def test_stats_out_folder_is_checked_before_the_job(tmp_path):
    p = run(SOLAR, "run", "-n", "1", "--dataset", "/nonexistent.h5", "--buffer", "1G",
            "--epochs", "1", "--batch", "1", "--stats-out", tmp_path / "no" / "s.json", "--",
            "true", check=False)
    assert p.returncode == 2 and "--stats-out" in p.stderr and "does not exist" in p.stderr


def test_report_draws_the_series_of_a_real_run(stats, tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"modes": {
        "baseline": {"per_epoch_s": [0.5, 0.5, 0.5]},
        "solar": {"per_epoch_s": [0.4, 0.2, 0.2], "speedup": 1.875, "limit": 2.0}}}))
    svg = tmp_path / "r.svg"
    p = run(SOLAR, "report", stats, bench, "-o", svg)
    assert "wrote" in p.stderr
    root = ET.parse(svg).getroot()  # well-formed XML
    assert root.tag == SVG + "svg"
    panels = {g.get("data-title"): g for g in root.iter(SVG + "g") if g.get("class") == "panel"}
    hit = next(g for t, g in panels.items() if t.startswith("Hit rate"))
    series = {g.get("data-series"): g for g in hit.iter(SVG + "g") if g.get("class") == "series"
              and g.get("data-series").startswith("node ")}
    assert set(series) == {"node 0", "node 1"}
    doc = json.loads(stats.read_text())
    for n in doc["nodes"]:
        points = [float(c.get("data-value")) for c in series[f"node {n['node']}"].iter()
                  if c.get("class") == "marker"]
        want = [100 * e["hits"] / (e["hits"] + e["fetched_samples"]) for e in n["epochs"]]
        assert points == pytest.approx(want, abs=1e-3)
    load = next(g for t, g in panels.items() if t.startswith("Data-loading time"))
    names = [g.get("data-series") for g in load.iter(SVG + "g") if g.get("class") == "series"]
    assert names[0] == "PyTorch DataLoader" and names[1].startswith("solar.torch.Loader (1.88x)")
    limit = [float(v) for g in load.iter(SVG + "g")
             if (g.get("data-series") or "").startswith("storage limit")
             for line in g.iter(SVG + "polyline") for v in line.get("data-values").split()]
    assert limit == pytest.approx([0.25, 0.25, 0.25])
    # The plan's figures ride in the stats file and are drawn: its hit rate per epoch, and the
    # best any plan could do (the lower bound on storage reads).
    plan = doc["plan"]
    assert plan["ratio_to_lower_bound"] >= 1 and len(plan["per_epoch"]) == EPOCHS
    refs = {g.get("data-series"): [float(v) for line in g.iter(SVG + "polyline")
                                   for v in line.get("data-values").split()]
            for g in hit.iter(SVG + "g") if g.get("data-series") in
            ("planned (all nodes)", "lower bound's best")}
    assert refs["planned (all nodes)"] == pytest.approx(
        [100 * e["hits"] / e["accesses"] for e in plan["per_epoch"]], abs=1e-3)
    best = 100 * (1 - plan["lower_bound_fetches"] / plan["accesses"])
    assert refs["lower bound's best"] == pytest.approx([best] * EPOCHS, abs=1e-3)
    # The plan cannot beat the bound (the agents' measured hits may: a sample the plan re-reads
    # but still in a slot, the agent's look-ahead room, counts as a hit).
    assert 100 * plan["hits"] / plan["accesses"] <= best + 1e-6
    title = next(root.iter(SVG + "text")).text
    assert title.startswith("solar run: 2 nodes, 3 epochs, hit rate "), title


@pytest.mark.parametrize("content,named", [
    ("not json", "not JSON"),
    ('{"a": 1}', "not a stats file"),
    ('{"nodes": [{"node": 0, "missing": "killed"}]}', "no node has statistics"),
    ('{"points": []}', 'non-empty "points"'),
])
def test_report_names_bad_input_in_one_line(tmp_path, content, named):
    f = tmp_path / "in.json"
    f.write_text(content)
    p = run(SOLAR, "report", f, "-o", tmp_path / "x.svg", check=False)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and named in lines[0], p.stderr
    assert not (tmp_path / "x.svg").exists()


def test_stat_watches_every_agent_of_a_run_and_redraws_on_a_terminal(tmp_path):
    import pty
    import re
    import subprocess
    import time
    data = tmp_path / "d.h5"
    run(SOLAR, "gen", data, "--samples", SAMPLES, "--preset", "tiny", "--no-progress")
    job = subprocess.Popen([SOLAR, "run", "-v", "-n", "4", "--nodes", "2", "--dataset", data,
                            "--buffer", "40%", "--epochs", "40", "--batch", "8", "--", TRAIN,
                            "--compute-ms", "5"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "solar stat" not in line:
            line = job.stderr.readline()
            assert line, "solar run ended before its agents were ready"
        folder = re.search(r"solar stat (\S+) --watch", line).group(1)
        once = run(SOLAR, "stat", folder)
        assert len(re.findall(r"^node [01]: .* hit rate", once.stdout, re.M)) == 2, once.stdout
        assert once.stdout.count("  rank ") == 4
        # Ranks as solar run numbers them (node 1's are 2 and 3), epochs from 0.
        ranks = sorted(int(r) for r in re.findall(r"^  rank +(\d+) epoch +(?:\d+)/39 ", once.stdout, re.M))
        assert ranks == [0, 1, 2, 3], once.stdout
        # --watch on a terminal of 72 columns: the same lines are redrawn (cursor up, clear)
        # until the agents finish, then it exits by itself; every line fits the width, so
        # that each redraw moves up exactly the lines the last one drew.
        import fcntl
        import struct
        import termios
        leader, follower = pty.openpty()
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 72, 0, 0))
        watch = subprocess.Popen([SOLAR, "stat", folder, "--watch"], stdout=follower,
                                 stderr=follower)
        os.close(follower)
        out = b""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: stat exited
                break
            if not chunk:
                break
            out += chunk
        assert watch.wait(timeout=60) == 0
        os.close(leader)
        text = out.decode(errors="replace").replace("\r\n", "\n")
        assert "\x1b[" in text and "F\x1b[J" in text, text[:500]
        assert "finished" in text and "samples/s" in text, text[-800:]
        parts = re.split(r"\x1b\[(\d+)F\x1b\[J", text)
        reports, ups = parts[0::2], [int(n) for n in parts[1::2]]
        assert len(reports) >= 3, text[:500]
        for before, up in zip(reports, ups):
            assert before.count("\n") == up, (up, before)  # moved up what it drew
        for report in reports:
            for line in report.splitlines():
                assert len(line) <= 72, line
            assert all(int(e) < 40 for e in re.findall(r" epoch +(\d+)/39", report))
    finally:
        job.stderr.close()
        if job.poll() is None:
            job.terminate()
        job.wait(timeout=60)


def test_verbose_breaks_down_start_up_and_teardown(tmp_path):
    """solar run --verbose: launch to first batch and last batch to exit, by stage (issue 15),
    from its own clock and the agents' `startup` times (CLOCK_MONOTONIC, in the stats)."""
    data = tmp_path / "d.h5"
    run(SOLAR, "gen", data, "--samples", 200, "--preset", "tiny", "--no-progress")
    out = tmp_path / "run.json"
    p = run(SOLAR, "run", "-v", "-n", "4", "--nodes", "2", "--dataset", data, "--buffer", "40%",
            "--epochs", 1, "--batch", "4", "--stats-out", out, "--", TRAIN, "--verify")
    lines = [l for l in p.stderr.splitlines() if l.startswith("solar run:")]
    head = next(l for l in lines if "start-up: launch to first batch" in l)
    first, every = map(float, re.findall(r"([\d.]+) s", head)[:2])
    assert 0 < first <= every, head
    stage = {}
    for l in lines:
        m = re.match(r"solar run:   (\S+(?: \S+)?)\s+([\d.]+) s  (.*)", l)
        if m:
            stage[m.group(1)] = float(m.group(2))
            if m.group(1) == "agent start":
                assert "process and libraries" in m.group(3) and "buffer set-up" in m.group(3), l
    assert set(stage) == {"solar start", "plan", "agent start", "ranks start", "first fill",
                          "ranks end", "agents stop", "summary"}, lines
    # The stages follow one another: they add up to the last rank's first batch.
    before = sum(stage[k] for k in ("solar start", "plan", "agent start", "ranks start",
                                    "first fill"))
    assert abs(before - every) < 0.01, (before, lines)
    tail = next(l for l in lines if "teardown: last batch to exit" in l)
    assert abs(sum(stage[k] for k in ("ranks end", "agents stop", "summary"))
               - float(re.findall(r"([\d.]+) s", tail)[0])) < 0.01, lines
    # The agents' start-up stages, in order, every rank served.
    for n in json.loads(out.read_text())["nodes"]:
        s = n["startup"]
        order = [s[k] for k in ("started", "plan_read", "source_opened", "buffer_ready",
                                "listening", "ready")]
        assert order == sorted(order), s
        assert len(s["first_batch"]) == 2 and all(f >= s["ready"] for f in s["first_batch"]), s
        assert all(l >= f for f, l in zip(s["first_batch"], s["last_batch"])), s
