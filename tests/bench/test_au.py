# SPDX-License-Identifier: Apache-2.0
"""bench/au.py, MLPerf Storage's accelerator utilisation (issue 39): a tiny configuration of
each layout, every loader. The figures are not judged here; what is checked is the bench's own
arithmetic: each accelerator's AU recomputed from the compute and wait times its rank recorded
equals the reported one, the table printed is the JSON's, the largest N is the largest passing
one, the compute times are the scaled DLIO rate's, and nothing is left behind."""
import json
import math
import os
import re
import subprocess
import sys

import pytest

from testlib import PY, ROOT, SOLAR

BUILD = os.path.dirname(os.path.dirname(os.path.abspath(SOLAR)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def au_bench(tmp_path, *args):
    p = subprocess.run([PY, os.path.join(ROOT, "bench", "au.py"), "--build", BUILD, *args],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env=dict(os.environ, SOLAR_BENCH_DIR=str(tmp_path)))
    return p


def check_arithmetic(r, text):
    """Every figure of an au.py --json result recomputed from the ranks' recorded steps."""
    threshold = r["threshold"]
    for loader, by_n in r["loaders"].items():
        for n, s in by_n.items():
            n = int(n)
            assert len(s["steps"]) == n and len(s["au_per_accelerator"]) == n, (loader, n)
            aus = []
            for steps, reported in zip(s["steps"], s["au_per_accelerator"]):
                assert len(steps) == r["config"]["epochs"], steps
                # DistributedSampler (and solar's torch order): ceil(samples / N) each, batched.
                per_rank = math.ceil(r["config"]["samples"] / n)
                assert [len(e) for e in steps] == [math.ceil(per_rank / r["config"]["batch"])] * \
                    len(steps), (loader, n, steps)
                wait = sum(x[0] for e in steps for x in e)
                compute = sum(x[1] for e in steps for x in e)
                assert compute > 0 and wait >= 0
                assert reported == pytest.approx(compute / (compute + wait), rel=1e-12)
                # The emulated compute is at least the scaled rate's time for the batch's bytes.
                for e in steps:
                    for _, c, nbytes in e:
                        assert nbytes > 0 and c >= nbytes / r["compute_bytes_per_s"] * 0.999
                aus.append(compute / (compute + wait))
            assert s["au"] == pytest.approx(sum(aus) / n, rel=1e-12)
            assert s["au_worst"] == pytest.approx(min(aus), rel=1e-12)
            # The table printed shows the same AU, to its one decimal.
            row = re.search(rf"^{loader}\s+(.*?)\s+\|", text, re.M)
            assert row, text
            shown = [float(x.rstrip("%")) for x in row.group(1).split()]
            assert shown[r["accelerators"].index(n)] == pytest.approx(100 * s["au"], abs=0.051)
        passing = [int(n) for n, s in by_n.items() if s["au"] >= threshold]
        assert r["largest"][loader] == (max(passing) if passing else 0), (loader, by_n)


def test_cosmoflow_like_every_loader(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "au.json"
    p = au_bench(tmp_path, "--workload", "cosmoflow", "--samples", "24", "--preset", "tiny",
                 "--epochs", "2", "--accelerators", "1,2", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert r["kind"] == "au" and r["workload"] == "cosmoflow" and r["threshold"] == 0.7, r
    assert sorted(r["loaders"]) == ["baseline", "solar", "transparent"], r["loaders"].keys()
    # CosmoFlow's H100 rate (2.83 MB / 3.5 ms) scaled by 400M (uncapped) over a 12.5 GB/s link.
    assert r["compute_bytes_per_s"] == pytest.approx(2.83e6 / 0.0035 * (400 << 20) / 12.5e9)
    assert "an accelerator computes 27.1 MB/s of batches" in p.stdout, p.stdout
    check_arithmetic(r, p.stdout)
    assert r["loaders"]["solar"]["2"]["agent_ranks"] == 2, r["loaders"]["solar"]["2"]
    # The picture: AU against N, a series per loader and the threshold.
    svg = tmp_path / "au.svg"
    q = subprocess.run([SOLAR, "report", str(out), "-o", str(svg)], capture_output=True,
                       text=True)
    assert q.returncode == 0, q.stdout + q.stderr
    text = svg.read_text()
    for name in ("PyTorch DataLoader", "solar.torch.Loader", "transparent",
                 "MLPerf threshold (70%)"):
        assert name in text, name
    assert not [n for n in os.listdir(tmp_path) if n.startswith("solar-bench-")]


def test_unet3d_like_npz_every_loader_solars_in_batch_mode_too(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "au.json"
    p = au_bench(tmp_path, "--workload", "unet3d", "--samples", "64", "--sample-size", "16384",
                 "--buffer", "100%", "--epochs", "2", "--accelerators", "2", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert r["layout"] == "npz" and sorted(r["loaders"]) == ["baseline", "solar", "transparent"], r
    assert "left out" not in p.stdout and r["left_out"] == [], p.stdout
    check_arithmetic(r, p.stdout)


def test_cosmoflow_like_with_a_local_tier_below_the_buffer(tmp_path):
    # MLPerf Storage's 5x rule: solar's memory a fifth of the dataset, a local tier for the rest.
    pytest.importorskip("torch")
    out = tmp_path / "au.json"
    p = au_bench(tmp_path, "--workload", "cosmoflow", "--samples", "48", "--preset", "tiny",
                 "--epochs", "2", "--accelerators", "1", "--buffer", "20%",
                 "--local-buffer", "80%", "--json", str(out))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(out.read_text())
    assert r["config"]["buffer"] == "20%" and r["config"]["local_buffer"] == "80%", r["config"]
    assert "solar buffer 20% and a local tier of 80% (a folder on the dataset's disk)" in \
        p.stdout, p.stdout
    check_arithmetic(r, p.stdout)
    assert not [n for n in os.listdir(tmp_path) if n.startswith("solar-bench-")]


@pytest.mark.parametrize("args,named", [
    (["--workload", "unet3d", "--local-buffer", "80%"], "the local tier holds samples of one size"),
    (["--local-disk", "2G"], "--local-disk needs --local-buffer and --throttle"),
    (["--accelerators", "0,2"], "--accelerators 0,2"),
    (["--loaders", "plain"], "--loaders plain"),
    (["--workload", "bert"], "invalid choice: 'bert'"),
    (["--epochs", "0"], "must be positive")])
def test_bad_options_are_named(tmp_path, args, named):
    p = au_bench(tmp_path, *args)
    assert p.returncode != 0 and named in p.stderr, p.stdout + p.stderr
    assert not [n for n in os.listdir(tmp_path) if n.startswith("solar-bench-")]
