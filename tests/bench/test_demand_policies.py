# SPDX-License-Identifier: Apache-2.0
"""bench/demand_policies.py (issue 38): the policies it replays. Checked against what can be
worked out by hand: over shuffled epochs a static set of a share f of the samples is hit by
exactly f of the later epochs' reads, and no policy can do better (each sample is read once an
epoch, so Belady equals it); LRU is near f + (1 - f) ln(1 - f); over a sliding curriculum LRU
beats the static set; every policy is at most Belady's."""
import json
import math
import os
import subprocess
import sys

from testlib import PY, ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))
import demand_policies as dp  # noqa: E402


def test_static_is_the_optimum_over_shuffled_epochs_and_lru_the_estimate():
    for share in (0.26, 0.5, 0.64):
        r = dp.measure("shuffle", 4000, 4, share)
        assert r["static"] == int(share * 4000) / 4000, r
        assert r["belady"] == r["static"], r
        assert abs(r["lru"] - dp.lru_shuffle_estimate(share)) < 0.02, (share, r)
        assert r["lru"] < r["static"], r


def test_lru_wins_over_a_sliding_curriculum_and_nothing_beats_belady():
    r = dp.measure("sliding", 4000, 5, 0.5)
    assert r["lru"] > r["static"] + 0.2, r
    for kind in ("shuffle", "weighted", "sliding"):
        for share in (0.26, 0.64):
            r = dp.measure(kind, 2000, 4, share)
            assert max(r["static"], r["lru"]) <= r["belady"] + 1e-12, (kind, share, r)


def test_the_policies_on_a_tiny_sequence_by_hand():
    seq = [0, 1, 2, 0, 1, 2, 0, 3]
    assert dp.static(seq, 2) == [False, False, False, True, True, False, True, False]
    assert dp.lru(seq, 2) == [False] * 8  # a cycle one longer than the buffer: never a hit
    # Belady keeps 0 and 1 over 2 (read again last), as the static set happens to.
    assert dp.belady(seq, 2) == [False, False, False, True, True, False, True, False]
    assert math.isclose(dp.lru_shuffle_estimate(0.5), 0.5 + 0.5 * math.log(0.5))


def test_the_command_line(tmp_path):
    p = subprocess.run([PY, os.path.join(ROOT, "bench", "demand_policies.py"), "--samples", "400",
                        "--epochs", "3", "--share", "0.5", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert {r["order"] for r in rows} == {"shuffle", "weighted", "sliding"}
    assert all(set(r) == {"order", "share", "static", "lru", "belady"} for r in rows)
    bad = subprocess.run([PY, os.path.join(ROOT, "bench", "demand_policies.py"), "--share", "1.5"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--share in (0, 1]" in bad.stderr, bad.stderr
