# SPDX-License-Identifier: Apache-2.0
"""--order-file (issue 38, item 1): a script that computes its whole order up front, as the SOLAR
artifact's io_baseline.py does (a per-epoch shuffle list drawn with numpy's global RNG, read
through DistributedSampler(shuffle=False)), with the same list given to solar: the plan follows
it exactly. Real agents, the real interposer, the unmodified script (slurm_examples/
train_h5py_files_ddp.py --shuffle-list) against the same script without solar: per-batch
SHA-256 identical, and every step of the plan consumed as planned on every node."""
import json
import os

import numpy as np
import pytest

from test_transparent import digests, served
from test_transparent_files import SCRIPT, gen
from testlib import PY, SOLAR, TRAIN, run

SAMPLES, EPOCHS, BATCH = 128, 2, 4


def artifact_dataset(d, samples, epochs, seed):
    """The artifact's layout of `samples` files in d/universes and its shuffle list, drawn
    its way (numpy's global RNG, one permutation an epoch), in d/order.npy: (root, list)."""
    root = gen(d / "universes", "per-sample-files", samples, "--universes-per-dir", "1")
    np.random.seed(seed)
    np.save(d / "order.npy", np.stack([np.random.permutation(samples) for _ in range(epochs)]))
    return root, d / "order.npy"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return artifact_dataset(tmp_path_factory.mktemp("order"), SAMPLES, EPOCHS, 7)


def script_run(tmp_path, root, order, tag, *solar_args, ranks=4, nodes=2, workers=0,
               epochs=EPOCHS, batch=BATCH, script_args=()):
    """The artifact-style script over `root` with the shuffle list `order`, under `solar run`
    (its digests in tmp_path/TAG-<rank>.txt); also test_demand_mode.py's."""
    cmd = [SOLAR, "run", "-n", ranks, "--nodes", nodes, "--dataset", f"{root}/:/split",
           "--labels", "/unitPar", "--epochs", epochs, "--batch", batch, *solar_args, "--", PY,
           SCRIPT, root, "--layout", "files", "--epochs", epochs, "--batch", batch,
           *(["--shuffle-list", order] if order else []), "--workers", workers,
           "--digests", tmp_path / f"{tag}-%r.txt", *script_args]
    return run(*cmd, check=False, env=dict(os.environ, TMPDIR=str(tmp_path)), timeout=600)


def nodes(path):
    with open(path) as f:
        return json.load(f)["nodes"]


def test_the_scripts_own_order_is_planned_and_served(tmp_path, data):
    root, order = data
    plain = script_run(tmp_path, root, order, "plain", "--buffer", "100%", "--no-agent")
    assert plain.returncode == 0, plain.stderr
    # A buffer of half the dataset: which samples stay resident is the plan's choice.
    solar = script_run(tmp_path, root, order, "solar", "--transparent", "--buffer", "50%",
                       "--order-file", order, "--stats-out", tmp_path / "with.json")
    assert solar.returncode == 0, solar.stderr
    assert digests(tmp_path, "solar", 4) == digests(tmp_path, "plain", 4)
    hits, _ = served(solar.stderr)
    assert hits > 0, solar.stderr
    for n in nodes(tmp_path / "with.json"):  # every step of the plan consumed as planned
        assert n["transparent"]["consumed_steps"] == n["epochs_planned"] * n["steps_per_epoch"], n
    # Without the file the plan is DistributedSampler(shuffle=True)'s, not the script's: its
    # steps are not consumed as planned (the bytes are still right).
    blind = script_run(tmp_path, root, order, "blind", "--transparent", "--buffer", "50%",
                       "--stats-out", tmp_path / "without.json")
    assert blind.returncode == 0, blind.stderr
    assert digests(tmp_path, "blind", 4) == digests(tmp_path, "plain", 4)
    assert any(n["transparent"]["consumed_steps"] < n["epochs_planned"] * n["steps_per_epoch"]
               for n in nodes(tmp_path / "without.json"))


def test_batch_mode_follows_the_order_file_every_sample_verified(tmp_path, data):
    root, order = data
    p = run(SOLAR, "run", "-n", "4", "--nodes", "2", "--dataset", f"{root}/:/split", "--labels",
            "/unitPar", "--epochs", EPOCHS, "--batch", BATCH, "--buffer", "50%", "--order-file",
            order, "--plan-out", tmp_path / "plan.bin", "--", TRAIN, "--verify")
    assert p.stdout.count("verified (0 wrong)") + p.stderr.count("verified (0 wrong)") == 4, \
        p.stdout + p.stderr
    # The plan's global batches are the list's: step j of epoch e holds positions
    # [j*W*b, (j+1)*W*b) of row e (solar reassigns them among the ranks, in batch mode).
    rows = run(SOLAR, "plan-dump", tmp_path / "plan.bin").stdout.splitlines()
    head = rows[0].split(",")
    steps = {}
    for line in rows[1:]:
        r = dict(zip(head, map(int, line.split(","))))
        steps.setdefault((r["epoch"], r["step"]), []).append(r["sample"])
    listed = np.load(order)
    W = 4
    assert len(steps) == EPOCHS * (SAMPLES // (W * BATCH))
    for (e, j), got in steps.items():
        assert sorted(got) == sorted(listed[e][j * W * BATCH:(j + 1) * W * BATCH]), (e, j)


@pytest.mark.parametrize("content,named", [
    (None, "cannot open"),
    ("0 1 2\n", "3 sample ids: 2 epochs of 128 samples need 256"),
    (" ".join(["5"] * 256), "appears twice"),
])
def test_a_bad_order_file_is_refused_naming_it(tmp_path, data, content, named):
    root, _ = data
    f = tmp_path / "order.txt"
    if content is not None:
        f.write_text(content)
    p = run(SOLAR, "run", "-n", "2", "--dataset", f"{root}/:/split", "--labels", "/unitPar",
            "--epochs", EPOCHS, "--batch", BATCH, "--buffer", "50%", "--order-file", f, "--",
            TRAIN, check=False)
    assert p.returncode == 2, p.stderr
    assert "--order-file" in p.stderr and named in p.stderr and str(f) in p.stderr, p.stderr
    both = run(SOLAR, "run", "-n", "2", "--dataset", f"{root}/:/split", "--labels", "/unitPar",
               "--epochs", EPOCHS, "--batch", BATCH, "--buffer", "50%", "--order", "torch",
               "--order-file", data[1], "--", TRAIN, check=False)
    assert both.returncode == 2 and "drop --order" in both.stderr, both.stderr
