# SPDX-License-Identifier: Apache-2.0
"""solar.torch.Loader over datasets of many HDF5 files, read directly (no agent): every sample's
bytes and label, in every batch of every epoch of both ranks, are what the content rule
(storage/include/solar/storage/content.h, tests/storage/make_h5py_dataset.py) says for the
sample's global id, the batches are the plan's, and each epoch covers the dataset once.

The datasets: `solar gen --layout per-sample-files` (the SOLAR artifact's CosmoFlow layout, one
file per sample in universe folders, `split` + `unitPar`) read as a directory and as a glob;
the same layout written with h5py the way the artifact's preprocessing does (no solar
attributes), read as a glob and as an @LIST in reverse order (so id i is the list's i-th file);
`solar gen --layout dlio` (8 files x 50 rows, the last 17) read with `records[]`."""
import importlib.util
import os
import sys
from collections import defaultdict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
h5py = pytest.importorskip("h5py")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import solar.torch as solar_torch  # noqa: E402  (`solar` is conftest's fixture)
from testlib import plan_sequences  # noqa: E402  (tests/, put on sys.path by conftest.py)

_spec = importlib.util.spec_from_file_location(
    "make_h5py_dataset", os.path.join(HERE, "..", "storage", "make_h5py_dataset.py"))
content = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(content)

SEED = 7
SHAPE = (4, 8, 8, 8)  # solar gen's tiny preset: int16, 4 KiB
SAMPLE_BYTES = 4096
UNITPAR = 16          # float32[4]


def sample(gid):
    with np.errstate(over="ignore"):
        return content.sample_bytes(SEED, gid, SAMPLE_BYTES)[0]


def label(gid, dtype, nbytes):
    with np.errstate(over="ignore"):
        return content.label_bytes(SEED, gid, dtype, nbytes)


@pytest.fixture(scope="module")
def gen_per_sample(solar, tmp_path_factory):
    """130 samples, one universe (64 files) a folder: 000/, 001/ full, 002/ with 2."""
    out = str(tmp_path_factory.mktemp("gen") / "cosmo")
    solar("gen", out, "--layout", "per-sample-files", "--samples", 130, "--preset", "tiny",
          "--seed", SEED, "--universes-per-dir", 1, "--no-progress")
    return out, 130


@pytest.fixture(scope="module")
def h5py_per_sample(tmp_path_factory):
    """40 files, train/NNN/univNNNN_KKK.hdf5 with 16 a folder, written by h5py: `split` holds
    the content of the file's position in sorted order, `unitPar` its float32[4] label."""
    top = tmp_path_factory.mktemp("h5py") / "train"
    n, per_dir = 40, 16
    for gid in range(n):
        d = top / f"{gid // per_dir:03d}"
        d.mkdir(parents=True, exist_ok=True)
        with h5py.File(d / f"univ{gid // per_dir:04d}_{gid % per_dir:03d}.hdf5", "w") as f:
            f.create_dataset("split", data=np.frombuffer(sample(gid), "<i2").reshape(SHAPE))
            f.create_dataset("unitPar", data=np.frombuffer(label(gid, "float32", UNITPAR), "<f4"))
    return str(top), n


@pytest.fixture(scope="module")
def gen_dlio(solar, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("gen") / "dlio")
    solar("gen", out, "--layout", "dlio", "--files", 8, "--samples-per-file", 50, "--samples",
          367, "--preset", "tiny", "--seed", SEED, "--no-progress")
    return out, 367


def read_every_batch(solar, tmp_path, spec, labels, n, content_of, label_dtype, label_nbytes):
    """Reads the whole plan (1 node x 2 ranks, 2 epochs) directly with solar.torch.Loader and
    checks every sample against sample(content_of(id)) and its label likewise."""
    plan = str(tmp_path / "run.plan")
    solar("plan", "--samples", n, "--sample-bytes", SAMPLE_BYTES, "--epochs", 2, "--nodes", 1,
          "--ranks-per-node", 2, "--batch", 6, "--buffer", "50%", "--seed", 3, "--out", plan,
          "--no-progress")
    seq = plan_sequences(plan)
    seen = defaultdict(list)
    infos = []
    for rank in (0, 1):
        with solar_torch.Loader(plan=plan, node=0, local_rank=rank, dataset=spec, labels=labels,
                                socket="") as loader:
            assert not loader.using_agent
            assert loader.shape == SHAPE and loader.dtype == np.int16
            assert loader.samples == n and len(loader.dataset) == n
            infos.append(loader.dataset)
            got = {}
            for epoch in range(loader.epochs):
                loader.set_epoch(epoch)
                for batch in loader:
                    x, y = batch
                    assert isinstance(x, torch.Tensor) and x.shape == (len(batch),) + SHAPE
                    got[batch.step] = [int(i) for i in batch.indices]
                    for k, gid in enumerate(batch.indices):
                        src = content_of(int(gid))
                        assert x[k].numpy().tobytes() == sample(src), f"sample {gid}"
                        want = label(src, label_dtype, label_nbytes)
                        assert y[k].numpy().astype(label_dtype).tobytes() == want, \
                            f"label of sample {gid}"
                        seen[epoch].append(int(gid))
            assert got == seq[rank], f"rank {rank}: not the plan's batches"
    for epoch in (0, 1):
        # Every sample, and at most a sample more a rank (the plan pads a tail that does not
        # divide among the ranks, as DistributedSampler does).
        assert set(seen[epoch]) == set(range(n)), f"epoch {epoch} misses samples"
        assert len(seen[epoch]) < n + 2, f"epoch {epoch} serves samples twice"
    return infos[0], y


@pytest.mark.parametrize("form", ["directory", "glob"])
def test_solar_gen_per_sample_files(solar, tmp_path, gen_per_sample, form):
    top, n = gen_per_sample
    spec = f"{top}/:/split" if form == "directory" else f"{top}/*/*.hdf5:/split"
    info, y = read_every_batch(solar, tmp_path, spec, "/unitPar", n, lambda g: g, "float32",
                               UNITPAR)
    # The whole unitPar array is each sample's label: float32[4] a sample.
    assert y.dtype == torch.float32 and tuple(y.shape[1:]) == (4,)
    assert (info.kind, info.many_files, info.rows, info.name) == (form, True, False, "/split")


def test_h5py_per_sample_files_by_glob(solar, tmp_path, h5py_per_sample):
    top, n = h5py_per_sample
    read_every_batch(solar, tmp_path, f"{top}/*/*.hdf5:/split", "/unitPar", n, lambda g: g,
                     "float32", UNITPAR)


def test_a_list_gives_its_own_order(solar, tmp_path, h5py_per_sample):
    """The artifact's idx order is not the sorted one: in a list, id i is the list's i-th file
    (here the sorted files reversed, given relative to the list's folder)."""
    top, n = h5py_per_sample
    files = sorted(os.path.relpath(os.path.join(d, f), os.path.dirname(top))
                   for d, _, names in os.walk(top) for f in names)
    assert len(files) == n
    lst = os.path.join(os.path.dirname(top), "reversed.txt")
    with open(lst, "w") as f:
        f.write("# the sorted files, last first\n" + "".join(p + "\n" for p in reversed(files)))
    info, _ = read_every_batch(solar, tmp_path, f"@{lst}:/split", "/unitPar", n,
                               lambda g: n - 1 - g, "float32", UNITPAR)
    assert info.kind == "list" and info.path == lst


def test_solar_gen_dlio_rows(solar, tmp_path, gen_dlio):
    top, n = gen_dlio
    info, y = read_every_batch(solar, tmp_path, f"{top}/:/records[]", "/labels", n,
                               lambda g: g, "int64", 8)
    assert y.dtype == torch.int64 and y.dim() == 1
    assert (info.kind, info.rows, info.name) == ("directory", True, "/records")


def test_a_file_that_differs_is_refused_naming_it(tmp_path, h5py_per_sample, solar):
    """One file of another sample shape among the others: the loader does not start, and its
    error names that file."""
    top, n = h5py_per_sample
    odd = os.path.join(top, "001", "univ0001_999.hdf5")
    try:
        with h5py.File(odd, "w") as f:
            f.create_dataset("split", data=np.zeros((4, 8, 8, 9), np.int16))
            f.create_dataset("unitPar", data=np.zeros(4, np.float32))
        plan = str(tmp_path / "run.plan")
        solar("plan", "--samples", n + 1, "--sample-bytes", SAMPLE_BYTES, "--epochs", 1,
              "--batch", 4, "--buffer", "50%", "--out", plan, "--no-progress")
        with pytest.raises(solar_torch.SolarError) as e:
            with solar_torch.Loader(plan=plan, node=0, local_rank=0, dataset=f"{top}/:/split",
                                    labels="/unitPar", socket="") as loader:
                next(iter(loader))
        assert odd in str(e.value)
    finally:
        os.unlink(odd)
