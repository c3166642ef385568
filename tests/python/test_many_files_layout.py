# SPDX-License-Identifier: Apache-2.0
"""The Python package's view of a dataset of many HDF5 files (python/solar/dataset.py): which
files a directory, a glob and an @LIST name and in which order (global sample ids: a file's
samples follow the previous file's), and the layout of a sample and a label that
dataset_layout reads from the first file with h5py when libsolar does not know it. Real files,
written with h5py: the SOLAR artifact's one file per sample in subfolders (`split`, `unitPar`),
and a DLIO-like 8 files x 50 rows with a short last file (`records[]`, `labels`)."""
import glob
import os
import sys

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from solar.dataset import (DatasetInfo, _label_shape, _resolve_label_dtypes,  # noqa: E402
                           dataset_files, dataset_layout, names_many_files)

SAMPLE = (4, 6, 6, 6)  # the artifact's split is 4 x 128^3 int16; smaller here
ROWS, DLIO_FILES, LAST = 50, 8, 17


def write(path, **arrays):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with h5py.File(path, "w") as f:
        for name, a in arrays.items():
            f.create_dataset(name, data=a)


@pytest.fixture(scope="module")
def per_sample(tmp_path_factory):
    """train/NNN/<universe>_<k>.hdf5, 3 universes x 4 sub-volumes, with what a directory
    listing must leave out beside them (a text file, a partial download) and must take (a
    deeper folder, the other HDF5 suffixes)."""
    top = tmp_path_factory.mktemp("per-sample")
    train = top / "train"
    files = []
    for u in ("000", "001", "010"):
        for k in range(4):
            files.append(str(train / u / f"univ{u}_{k}.hdf5"))
    files.append(str(train / "010" / "deeper" / "x.h5"))
    files.append(str(train / "011" / "y.hdf"))
    files.append(str(train / "011" / "z.he5"))
    for i, p in enumerate(files):
        write(p, split=np.full(SAMPLE, i, np.int16), unitPar=np.arange(4, dtype=np.float32) + i)
    (train / "000" / "README.txt").write_text("not a sample\n")
    (train / "001" / "univ001_9.hdf5.part").write_bytes(b"half a download")
    return top, sorted(files)


@pytest.fixture(scope="module")
def dlio(tmp_path_factory):
    """dlio/img_I_of_8.h5: `records` (rows x 8 x 8 uint8), `labels` (rows int64); the last file
    has 17 rows."""
    top = tmp_path_factory.mktemp("dlio") / "dlio"
    files = []
    for i in range(DLIO_FILES):
        rows = LAST if i == DLIO_FILES - 1 else ROWS
        p = str(top / f"img_{i}_of_{DLIO_FILES}.h5")
        write(p, records=np.full((rows, 8, 8), i, np.uint8), labels=np.arange(rows) + 100 * i)
        files.append(p)
    return str(top), files


def test_a_directory_is_its_hdf5_files_below_it_sorted_by_path(per_sample):
    top, files = per_sample
    spec = f"{top}/train/:/split"
    assert names_many_files(spec)
    assert list(dataset_files(spec)) == files
    # The order a script that globs and sorts sees.
    assert [p for p in files if p.endswith(".hdf5")] == sorted(glob.glob(f"{top}/train/*/*.hdf5"))
    # Sorted by the whole path: a deeper folder's file where its path sorts.
    assert files[8:] == [f"{top}/train/010/deeper/x.h5"] + \
        [f"{top}/train/010/univ010_{k}.hdf5" for k in range(4)] + \
        [f"{top}/train/011/y.hdf", f"{top}/train/011/z.he5"]
    # Without the trailing slash, and without :/name (the default /data), the same files.
    assert list(dataset_files(f"{top}/train")) == files


def test_a_glob_is_its_matching_files_sorted(per_sample):
    top, files = per_sample
    spec = f"{top}/train/*/*.hdf5:/split"
    assert names_many_files(spec)
    assert list(dataset_files(spec)) == [p for p in files if p.endswith(".hdf5")]
    # glob(3), as libsolar expands it: `**` is `*`, one folder level.
    assert list(dataset_files(f"{top}/train/**/*.h5:/split")) == []
    assert list(dataset_files(f"{top}/train/**/*/*.h5:/split")) == \
        [f"{top}/train/010/deeper/x.h5"]
    # A glob takes every match but folders, HDF5 or not (libsolar then refuses what is not).
    assert list(dataset_files(f"{top}/train/*/*:/split")) == sorted(
        [p for p in files if "deeper" not in p]
        + [f"{top}/train/000/README.txt", f"{top}/train/001/univ001_9.hdf5.part"])
    assert list(dataset_files(f"{top}/train/00[01]/univ*_3.hdf5")) == \
        [f"{top}/train/000/univ000_3.hdf5", f"{top}/train/001/univ001_3.hdf5"]
    assert list(dataset_files(f"{top}/nothing/*.h5")) == []


def test_a_list_keeps_its_order_and_takes_paths_relative_to_itself(per_sample, tmp_path,
                                                                  monkeypatch):
    top, files = per_sample
    # The artifact's `idx` order is not the sorted one: a script writes its own list.
    order = [files[5], files[0], files[11]]
    lst = top / "order.txt"
    rel = [os.path.relpath(p, top) for p in order]
    lst.write_text(f"# universes as idx.pkl lists them\n{rel[0]}\n\n  {rel[1]}  \n{order[2]}\n")
    spec = f"@{lst}:/split"
    assert names_many_files(spec)
    assert list(dataset_files(spec)) == [str(top / r) for r in rel[:2]] + [order[2]]
    # From another working directory, the relative lines still name the same files.
    monkeypatch.chdir(tmp_path)
    assert [os.path.realpath(p) for p in dataset_files(spec)] == \
        [os.path.realpath(p) for p in order]


def test_one_file_is_one_file(dlio):
    top, files = dlio
    assert not names_many_files(f"{files[0]}:/records")
    assert list(dataset_files(f"{files[0]}:/records")) == [files[0]]
    assert list(dataset_files("fabric://host:7000/name")) == []


def test_one_sample_per_file_is_the_whole_array(per_sample):
    top, _ = per_sample
    for spec in (f"{top}/train/:/split", f"{top}/train/*/*.hdf5:/split"):
        lay = dataset_layout(spec, "/unitPar")
        assert lay.shape == SAMPLE and lay.dtype == np.int16, spec
        assert lay.label_dtype == np.float32 and lay.label_shape == (4,), spec
    # No labels asked for, or the labels array absent: none.
    lay = dataset_layout(f"{top}/train/:/split", "")
    assert lay.shape == SAMPLE and lay.label_dtype is None and lay.label_shape is None
    assert dataset_layout(f"{top}/train/:/split", "/label").label_dtype is None


def test_rows_make_the_first_dimension_samples(dlio):
    top, files = dlio
    for spec in (f"{top}/:/records[]", f"{top}/*.h5:/records[]"):
        lay = dataset_layout(spec, "/labels")
        assert lay.shape == (8, 8) and lay.dtype == np.uint8, spec
        assert lay.label_dtype == np.int64 and lay.label_shape == (), spec
    # Without [] each file's whole array would be one sample (not DLIO's layout, but what
    # the spec says); one file has rows either way.
    assert dataset_layout(f"{top}/:/records", "/labels").shape == (ROWS, 8, 8)
    assert dataset_layout(f"{top}/:/records", "/labels").label_shape == (ROWS,)
    assert dataset_layout(f"{files[-1]}:/records", "/labels").shape == (8, 8)
    assert dataset_layout(f"{files[-1]}:/records[]", "/labels").shape == (8, 8)


def test_the_layout_comes_from_the_first_file_in_the_datasets_order(tmp_path):
    """Files whose shapes differ (solar refuses such a dataset, naming the file): the one
    dataset_layout reads is the first in the order the spec gives."""
    for name, rows in (("b.h5", 3), ("a/z.h5", 2), ("a-b.h5", 5), ("c.h5", 7)):
        write(str(tmp_path / "d" / name), data=np.zeros((rows, 2), np.float32))
    # Not HDF5 by its name: a hidden file named ".h5" (no extension), a folder named so; a
    # link to a folder is not followed, a link to a file is taken.
    write(str(tmp_path / "d" / "a" / ".h5"), data=np.zeros((9, 2), np.float32))
    write(str(tmp_path / "elsewhere" / "a.h5"), data=np.zeros((9, 2), np.float32))
    os.symlink(tmp_path / "elsewhere", tmp_path / "d" / "0-linked")
    os.symlink(tmp_path / "d" / "c.h5", tmp_path / "d" / "e.h5")
    (tmp_path / "d" / "f.h5").mkdir()
    # "a-b.h5" < "a/z.h5": sorted by the path's bytes, as sorted(glob) sorts.
    assert dataset_layout(f"{tmp_path}/d/:/data[]", "").shape == (2,)
    assert list(dataset_files(f"{tmp_path}/d")) == \
        [str(tmp_path / "d" / n) for n in ("a-b.h5", "a/z.h5", "b.h5", "c.h5", "e.h5")]
    assert dataset_layout(f"{tmp_path}/d:/data", "").shape == (5, 2)
    assert dataset_layout(f"{tmp_path}/d/*.h5:/data", "").shape == (5, 2)
    (tmp_path / "l.txt").write_text("d/c.h5\nd/b.h5\n")
    assert dataset_layout(f"@{tmp_path}/l.txt:/data", "").shape == (7, 2)
    # Nothing to read the layout from: unknown, not an error (libsolar has refused by then).
    (tmp_path / "empty").mkdir()
    for spec in (f"{tmp_path}/empty/:/data", f"@{tmp_path}/none.txt", f"{tmp_path}/d:/nope",
                 "fabric://host:7000/x"):
        assert dataset_layout(spec, "") == (None, None, None, None), spec


def test_dataset_info_says_what_the_files_are(per_sample, dlio):
    top, files = per_sample
    spec = f"{top}/train/:/split"
    info = DatasetInfo(spec, "/unitPar", len(files), SAMPLE, np.dtype(np.int16))
    assert (info.kind, info.path, info.file, info.name, info.rows) == \
        ("directory", f"{top}/train/", None, "/split", False)
    assert info.many_files and list(info.files()) == files and len(info) == len(files)
    assert str(info) == spec and "(directory, a file per sample)" in repr(info)
    d, dfiles = dlio
    info = DatasetInfo(f"{d}/*.h5:/records[]", "/labels", 7 * ROWS + LAST, (8, 8), np.uint8)
    assert (info.kind, info.name, info.rows, info.file) == ("glob", "/records", True, None)
    assert "(glob)" in repr(info)
    info = DatasetInfo(f"@{top}/order.txt:/split", None, 3, SAMPLE, np.int16)
    assert (info.kind, info.path, info.labels) == ("list", f"{top}/order.txt", None)
    info = DatasetInfo(f"{dfiles[0]}:/records", "/labels", ROWS, (8, 8), np.dtype(np.uint8))
    assert (info.kind, info.file, info.path, info.rows, info.many_files) == \
        ("file", dfiles[0], dfiles[0], True, False)
    assert list(info.files()) == [dfiles[0]]
    assert repr(info) == f"<solar.DatasetInfo {dfiles[0]}:/records samples={ROWS} " \
        "shape=(8, 8) dtype=uint8>"
    info = DatasetInfo("fabric://h:1/x", None, 5, (2,), np.uint8)
    assert (info.kind, info.path, info.file, info.name) == ("fabric", None, None, None)
    assert list(info.files()) == []


def test_a_label_of_several_elements_keeps_the_files_shape():
    f32 = np.dtype(np.float32)
    assert _label_shape(4, f32, None) == ()
    assert _label_shape(4, f32, (1,)) == ()
    assert _label_shape(16, f32, (4,)) == (4,)
    assert _label_shape(16, f32, None) == (4,)
    assert _label_shape(24, f32, (2, 3)) == (2, 3)
    assert _label_shape(24, f32, (5,)) == (6,)  # the file disagrees with libsolar: its bytes


def test_a_label_of_several_elements_is_read_as_its_type():
    f32, i4, i8 = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64)
    # The file's (or libsolar's) type: unitPar's 16 bytes are 4 float32, kept as float32.
    assert _resolve_label_dtypes(f32, 16, None) == (f32, f32)
    assert _resolve_label_dtypes(i4, 8, None) == (i4, i8)
    with pytest.raises(ValueError, match="not a whole number"):
        _resolve_label_dtypes(f32, 6, None)
    # Without it (fabric://): a label_dtype that divides the label says how to read it.
    assert _resolve_label_dtypes(None, 16, "float32") == (f32, f32)
    assert _resolve_label_dtypes(None, 4, None) == (i4, i8)
    with pytest.raises(ValueError, match="type whose size divides 16"):
        _resolve_label_dtypes(None, 16, None)
