# SPDX-License-Identifier: Apache-2.0
"""`solar bench serve --repeat N`: N real runs (an agent and its ranks each time), the median of
each figure, and every run's own figures beside it, so that a run disturbed by the machine can
be told from the build."""
import re
import statistics
import subprocess

from testlib import SOLAR


def serve(*args):
    p = subprocess.run([SOLAR, "bench", "serve", "--samples", "512", "--epochs", "3", *args],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_repeat_prints_the_median_of_the_runs_it_lists():
    out = serve("--repeat", "3")
    assert "medians of 3 runs" in out, out
    rate = float(re.search(r"from the buffer\): (\d+) samples/s", out).group(1))
    runs = re.findall(r"^  run +(\d+): +(\d+) +([\d.]+) +([\d.]+) +(\d+%|\?)$", out, re.M)
    assert [int(r[0]) for r in runs] == [1, 2, 3], out
    rates = [float(r[1]) for r in runs]
    assert all(x > 0 for x in rates), out
    assert rate == statistics.median(rates), out
    copy = float(re.search(r"shared buffer ([\d.]+) GB/s", out).group(1))
    assert copy == statistics.median(float(r[2]) for r in runs), out


def test_one_run_has_no_run_table():
    out = serve("--zero-copy")
    assert re.search(r"from the buffer\): [1-9]\d* samples/s handed out across 4 ranks", out), out
    assert "medians of" not in out and "  run " not in out, out
