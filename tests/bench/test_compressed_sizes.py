# SPDX-License-Identifier: Apache-2.0
"""bench/compressed_sizes.py (issue 36): what it counts. Its figures (samples per GiB,
compressed against raw) are not judged; checked are its arithmetic, that every file reads back
as written (the script asserts it), and that the sizes it writes are the files' stored bytes
and plan with `solar plan --sample-sizes`."""
import json
import os
import subprocess

import h5py

from testlib import PY, ROOT, SOLAR


def test_sizes_are_the_stored_bytes_and_plan(tmp_path):
    p = subprocess.run([PY, os.path.join(ROOT, "bench", "compressed_sizes.py"), "--samples", "64",
                        "--side", "8", "--filters", "raw,gzip", "--sizes-out", str(tmp_path),
                        "--plan", "--json", "--solar", SOLAR],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(p.stdout)["results"]
    raw, gz = doc["raw"], doc["gzip"]
    assert raw["raw_sample_bytes"] == 4 * 8 ** 3 * 2
    assert raw["stored_bytes"] == 64 * raw["raw_sample_bytes"] and raw["vs_raw"] == 1.0
    for name, r in doc.items():
        sizes = [int(x) for x in (tmp_path / f"{name}.sizes").read_text().split("\n")
                 if x and not x.startswith("#")]
        assert len(sizes) == 64 and sum(sizes) == r["stored_bytes"], name
        assert r["samples_per_gib"] == 2 ** 30 / (r["stored_bytes"] / 64)
        assert r["vs_raw"] == r["raw_sample_bytes"] * 64 / r["stored_bytes"]
        plan = r["plan"]
        assert plan["remote_bytes"] >= plan["lower_bound_bytes"] > 0
    # The counts compress: gzip holds more samples in the same bytes.
    assert gz["stored_bytes"] < raw["stored_bytes"]
    assert doc["gzip"]["plan"]["hit_rate"] >= doc["raw"]["plan"]["hit_rate"]


def test_bad_options_are_named(tmp_path):
    p = subprocess.run([PY, os.path.join(ROOT, "bench", "compressed_sizes.py"), "--filters", "zstd"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "--filters" in p.stderr and "zstd" in p.stderr
