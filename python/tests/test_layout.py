# SPDX-License-Identifier: Apache-2.0
"""What a sample is (shape, dtype, label dtype) comes from libsolar: from the agent's hello on the
agent path, from the source libsolar opens on the direct path; the loader agrees with h5py's view
of the file and imports no h5py in either case (solar.torch.Loader() stays fast)."""
import json
import os
import sys

import h5py
import numpy as np
import pytest

import solar
from conftest import SOLAR, run

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layout_probe.py")
N = 96


@pytest.fixture(scope="module")
def odd_dataset(workdir):
    """float32 samples of shape 3x5x6 and float32 labels (a 4-byte label that is not int32: the
    type cannot be guessed from its size)."""
    path = os.path.join(workdir, "layout.h5")
    rng = np.random.default_rng(3)
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=rng.standard_normal((N, 3, 5, 6)).astype(np.float32))
        f.create_dataset("label", data=rng.standard_normal(N).astype(np.float32))
    return path


def probe(workdir, name, dataset, *run_args, numpy=False):
    d = os.path.join(workdir, name)
    os.makedirs(d)
    tmp = os.path.join(d, "tmp")
    os.makedirs(tmp)
    out = os.path.join(d, "probe.json")
    p = run(SOLAR, "run", "--ranks-per-node", 1, "--nodes", 1, "--dataset", dataset,
            "--epochs", 1, "--batch", 4, "--buffer", "50%", *run_args, "--", sys.executable, PROBE, out,
            "--library", solar.library_path, *(["--numpy"] if numpy else []), check=False,
            env=dict(os.environ, TMPDIR=tmp))
    assert p.returncode == 0, p.stdout + p.stderr
    with open(out) as f:
        return json.load(f)


@pytest.mark.parametrize("mode", ["agent", "direct"])
def test_layout_comes_from_libsolar_without_h5py(workdir, odd_dataset, mode):
    pytest.importorskip("torch")
    got = probe(workdir, f"layout-{mode}", odd_dataset,
                *(["--no-agent"] if mode == "direct" else []))
    assert got["using_agent"] == (mode == "agent"), got
    with h5py.File(odd_dataset, "r") as f:
        shape, dtype, ldtype = f["data"].shape[1:], f["data"].dtype, f["label"].dtype
        first = f["data"][got["indices"][0]].ravel()[:4].tolist()
    assert tuple(got["shape"]) == shape
    assert got["dtype"] == str(dtype) == "float32"
    assert got["label_stored"] == str(ldtype) == "float32"
    assert got["label_dtype"] == "float32"  # floating-point labels keep their type
    assert got["batch_shape"] == [4, *shape] and got["batch_dtype"] == "float32"
    assert got["labels_dtype"] == "float32"
    assert got["first"] == first
    assert not got["h5py_loaded"], "constructing the loader imported h5py"


def test_numpy_loader_with_solar_gen_file(workdir, dataset):
    """solar gen's tiny preset: int16 samples of 4x8x8x8, int32 labels (returned as int64)."""
    got = probe(workdir, "layout-numpy", dataset, numpy=True)
    assert got["using_agent"]
    with h5py.File(dataset, "r") as f:
        assert tuple(got["shape"]) == f["data"].shape[1:] == (4, 8, 8, 8)
        assert got["dtype"] == str(f["data"].dtype) == "int16"
        assert got["label_stored"] == str(f["label"].dtype) == "int32"
    assert got["label_dtype"] == "int64"
    assert not got["h5py_loaded"]


def test_library_reports_layout_on_the_direct_path(plan, dataset, clean_env):
    """The C API itself (solar_sample_shape / solar_sample_dtype / solar_label_dtype), in this
    process, reading directly."""
    import ctypes
    lib = solar._lib.lib
    clean_env.setenv("SOLAR_PLAN", plan)
    clean_env.setenv("SOLAR_DATASET", dataset)
    clean_env.setenv("SOLAR_LOCAL_RANK", "0")
    h = lib.solar_open_env()
    assert h, solar._lib.last_error()
    try:
        assert lib.solar_sample_shape(h, None, 0) == 4
        dims = (ctypes.c_uint64 * 2)(99, 99)
        assert lib.solar_sample_shape(h, dims, 2) == 4  # only max_dims written
        assert list(dims) == [4, 8]
        assert lib.solar_sample_dtype(h) == b"int16"
        assert lib.solar_label_dtype(h) == b"int32"
    finally:
        lib.solar_close(h)
    clean_env.setenv("SOLAR_LABELS", "")
    h = lib.solar_open_env()
    assert h, solar._lib.last_error()
    try:
        assert lib.solar_label_dtype(h) == b""  # no labels
        assert lib.solar_sample_dtype(h) == b"int16"
    finally:
        lib.solar_close(h)
