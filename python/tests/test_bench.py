# SPDX-License-Identifier: Apache-2.0
"""The PyTorch benchmarks still run from one command each and print the artifact's format: a
small run of bench/pytorch_io.py and bench/pytorch_e2e.py (their figures are not judged here;
speed targets live in the benchmarks, not in tests)."""
import os
import re
import sys

import pytest

from conftest import REPO, SOLAR, run

pytest.importorskip("torch")
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(SOLAR)))
SMALL = ["--build", BUILD, "--samples", "256", "--preset", "tiny", "--batch", "4",
         "--workers", "0"]


def epochs(out, label):
    m = re.search(re.escape(label) + r" each epoch: \[([^\]]*)\]", out)
    assert m, f"no '{label}' line in:\n{out}"
    return [float(x) for x in m.group(1).split(",")]


def test_io_benchmark_prints_the_artifact_format():
    out = run(sys.executable, os.path.join(REPO, "bench", "pytorch_io.py"), *SMALL,
              "--repeat", "2").stdout
    assert len(epochs(out, "DataLoading time baseline")) == 3
    assert len(epochs(out, "DataLoading time SOLAR")) == 3
    assert len(epochs(out, "DataLoading time transparent")) == 3
    assert "4 of 4 ranks served by a node agent, via solar-run" in out, out
    for mode in ("solar", "transparent"):
        assert re.search(rf"speedup {mode}: \d+\.\d+x in total over 3 epochs .*; limit "
                         rf"\d+\.\d+x \(plain bytes / planned bytes", out), out
    # Each rotation's ratio, with their median and the worst.
    m = re.search(r"transparent / baseline, each of 2 rotations: ([\d.]+), ([\d.]+); median "
                  r"([\d.]+)x, worst ([\d.]+)x", out)
    assert m, out
    ratios = sorted(float(x) for x in m.group(1, 2))
    assert float(m.group(4)) == ratios[0] and float(m.group(3)) == ratios[1], out
    # The unmodified DataLoader under --transparent got reads served from the buffer, per node.
    served = [float(n) for n in re.findall(r"file reads served per node: 0: ([\d.]+)%", out)]
    assert len(served) == 2 and min(served) > 0, out
    assert re.search(r"least-served node in each run: [\d.]+%, [\d.]+%", out), out


def test_e2e_benchmark_trains_on_the_same_global_batches():
    out = run(sys.executable, os.path.join(REPO, "bench", "pytorch_e2e.py"), *SMALL).stdout
    assert "4 of 4 ranks served by a node agent" in out, out
    for name in ("baseline", "SOLAR", "compute"):
        assert len(epochs(out, f"Epoch time {name}")) == 3
    # Same seed, same initialisation, same global batches: the same losses, epoch by epoch (up
    # to the order in which ranks' gradients are summed, as solar may give a global batch's
    # samples to other ranks of the node).
    for kind in ("Training", "Validation"):
        assert epochs(out, f"{kind} loss SOLAR") == pytest.approx(
            epochs(out, f"{kind} loss baseline"), rel=1e-3)
    assert "over pure compute" in out
