# SPDX-License-Identifier: Apache-2.0
"""Issue 35's benchmarks run from one command each: bench/pytorch_io.py --layout
per-sample-files (the SOLAR artifact's one file per sample, every mode) and
bench/many_files_startup.py (start-up against the number of files, syscalls per sample). Their
figures are not judged here; what is checked is what they count and that they count it on the
many-file dataset."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from testlib import PY, ROOT, SOLAR

BUILD = os.path.dirname(os.path.dirname(os.path.abspath(SOLAR)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def bench(tmp_path, script, *args):
    p = subprocess.run([PY, os.path.join(ROOT, "bench", script), "--build", BUILD, *args],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path,
                       env=dict(os.environ, SOLAR_BENCH_DIR=str(tmp_path)))
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_data_files_are_solars_order_and_a_single_file_is_itself(tmp_path):
    import pytorch_io
    subprocess.run([SOLAR, "gen", str(tmp_path / "d"), "--layout", "per-sample-files",
                    "--samples", "70", "--preset", "tiny", "--universes-per-dir", "1",
                    "--no-progress"], check=True, capture_output=True)
    (tmp_path / "d" / "notes.txt").write_text("not a dataset file")
    files = pytorch_io.data_files(str(tmp_path / "d"))
    # Two folders of one universe each: 64 then 6 files, sorted by path as solar numbers them.
    assert len(files) == 70 and files == sorted(files), files
    assert files[0].endswith("000/univ0000_000.hdf5") and files[64].startswith(
        str(tmp_path / "d" / "001")), files
    one = str(tmp_path / "one.h5")
    assert pytorch_io.data_files(one) == [one]


def test_pytorch_io_reads_the_artifacts_layout_in_every_mode(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "r.json"
    text = bench(tmp_path, "pytorch_io.py", "--layout", "per-sample-files", "--samples", "64",
                 "--preset", "tiny", "--batch", "4", "--ranks", "2", "--epochs", "2",
                 "--workers", "0", "--repeat", "1", "--json", str(out))
    assert re.search(r"dataset \S+: 64 samples in 64 files \(one a sample, /split, labels "
                     r"/unitPar\)", text), text
    for label in ("baseline", "SOLAR", "transparent"):
        m = re.search(rf"DataLoading time {label} each epoch: \[([^\]]*)\]", text)
        assert m and len(m.group(1).split(",")) == 2, text
    assert "2 of 2 ranks served by a node agent" in text, text
    served = re.search(r"file reads served per node: 0: ([\d.]+)%", text)
    assert served and float(served.group(1)) > 0, text
    r = json.loads(out.read_text())
    assert r["config"]["layout"] == "per-sample-files" and r["config"]["files"] == 64, r
    assert r["sample_bytes"] == 4096, r
    for mode in ("solar", "transparent"):
        # Limits as for one file: each sample read by the plain script against the plan's.
        assert r["modes"][mode]["plain_accesses"] == 128, r["modes"][mode]
        assert 0 < r["modes"][mode]["planned_fetches"] <= 128, r["modes"][mode]
    # The bench's folder and dataset are gone.
    assert not [n for n in os.listdir(tmp_path) if n.startswith("solar-bench-")]


def test_startup_bench_counts_per_file_and_per_sample(tmp_path):
    pytest.importorskip("torch")
    if not shutil.which("strace"):
        pytest.skip("strace is not installed")
    out = tmp_path / "r.json"
    text = bench(tmp_path, "many_files_startup.py", "--files", "100,200", "--runs", "1",
                 "--samples", "48", "--json", str(out))
    r = json.loads(out.read_text())
    assert [row["files"] for row in r["startup"]] == [100, 200], r
    for row in r["startup"]:
        # The index names every file (a line each); the first batch came after the plan, in
        # the first job (every file scanned) and the next (the index cache's scan).
        assert row["index_bytes"] > 100 * row["files"], row
        for job in ("first", "again"):
            assert len(row[f"info_{job}_runs_s"]) == 1, row
            assert row[f"run_{job}"]["first_batch"] >= row[f"run_{job}"]["plan"] > 0, row
    assert "10^6 files, an ESTIMATE" in text, text
    plain, transparent = r["per_sample"]["plain"], r["per_sample"]["transparent"]
    assert plain["samples"] == transparent["samples"] == 96, r["per_sample"]
    # The script opens every file once per sample and reads its array once, plain; under the
    # preload it still opens each (the interposer counts them) and the file system sees the
    # same opens.
    assert plain["counts"]["opens"] == plain["counts"]["sample_reads"] == 96, plain
    assert transparent["counts"]["opens"] == 96, transparent
    assert transparent["transparent"]["opens"] == 96, transparent
    assert transparent["transparent"]["hit_reads"] > 0, transparent
    assert re.search(r"^\| transparent \| 1\.00 \|", text, re.M), text
