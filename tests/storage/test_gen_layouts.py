# SPDX-License-Identifier: Apache-2.0
"""solar gen's layouts of many files (the SOLAR artifact's CosmoFlow, DeepCAM, DLIO), read back
with h5py: the file names and their order, shapes, dtypes, attributes, and every sample's bytes
and label against content.h's rule (its numpy mirror in make_h5py_dataset.py).

Run with SOLAR_BIN=build/cli/solar under /usr/bin/python3 (Debian's h5py and numpy)."""
import os
import re
import subprocess

import h5py
import numpy as np
import pytest

import make_h5py_dataset as content

SOLAR = os.environ.get("SOLAR_BIN", "solar")
np.seterr(over="ignore")  # content.h's arithmetic is modulo 2^64


def solar(*args):
    return subprocess.run([SOLAR, *map(str, args)], capture_output=True, text=True, timeout=300)


def gen(out, *args):
    p = solar("gen", out, "--no-progress", *args)
    assert p.returncode == 0, p.stderr
    return p.stdout


def hdf5_files(root):
    """Every HDF5 file below root, in sorted path order (what the reader's listing sees)."""
    found = []
    for d, _, names in os.walk(root):
        found += [os.path.join(d, n) for n in names]
    assert all(re.search(r"\.(h5|hdf5)$", f) for f in found), found  # no temporaries left
    return sorted(found)


def nothing_partial(tmp_path):
    return not [p for p in tmp_path.rglob("*") if ".partial" in p.name or ".old." in p.name]


def check_data(dset, seed, first, rows, kind="random"):
    """Every sample of dset: bytes == content(seed, global id), attributes name first."""
    generator = {"random": "solar-splitmix64-v1", "sparse": "solar-splitmix64-sparse-v1"}[kind]
    assert dset.attrs["solar_generator"] in (generator.encode(), generator)
    assert int(dset.attrs["solar_seed"]) == seed
    assert int(dset.attrs["solar_first"]) == first
    data = dset[()]
    samples = data if rows else data[np.newaxis]
    for k, sample in enumerate(samples):
        expected, _ = content.sample_bytes(seed, first + k, sample.nbytes, kind)
        assert np.ascontiguousarray(sample).tobytes() == expected, \
            f"{dset.file.filename}: sample {first + k}"
    return len(samples)


def check_labels(dset, seed, first, count, rows):
    labels = dset[()]
    per = labels if rows else labels[np.newaxis]
    assert len(per) == count
    for k, label in enumerate(per):
        label = np.asarray(label)
        assert label.tobytes() == content.label_bytes(seed, first + k, label.dtype, label.nbytes), \
            f"{dset.file.filename}: label of {first + k}"


def test_per_sample_files_in_the_artifacts_layout(tmp_path):
    out = tmp_path / "cosmo"
    text = gen(out, "--layout", "per-sample-files", "--samples", 130, "--preset", "tiny",
               "--universes-per-dir", 1, "--seed", 7)
    assert f"--dataset {out}/:/split --labels /unitPar" in text, text
    files = hdf5_files(out)
    # 130 samples: universes of 64, one a folder (as asked), two files in the third.
    assert len(files) == 130
    expected = [f"{out}/{g // 64:03d}/univ{g // 64:04d}_{g % 64:03d}.hdf5" for g in range(130)]
    assert files == expected
    for g, path in enumerate(files):
        with h5py.File(path, "r") as f:
            assert sorted(f.keys()) == ["split", "unitPar"]
            assert f["split"].shape == (4, 8, 8, 8) and f["split"].dtype == np.dtype("<i2")
            assert f["unitPar"].shape == (4,) and f["unitPar"].dtype == np.dtype("<f4")
            assert check_data(f["split"], 7, g, rows=False) == 1
            check_labels(f["unitPar"], 7, g, 1, rows=False)
            assert (0 <= f["unitPar"][()]).all() and (f["unitPar"][()] < 1).all()
    assert nothing_partial(tmp_path)


def test_per_sample_files_keep_64_universes_a_folder_by_default(tmp_path):
    out = tmp_path / "cosmo"
    gen(out, "--layout", "per-sample-files", "--samples", 200, "--shape", "2,2", "--dtype",
        "uint8")
    files = hdf5_files(out)
    assert {os.path.dirname(f) for f in files} == {f"{out}/000"}
    assert files[-1] == f"{out}/000/univ0003_007.hdf5"


def test_deepcam_layout(tmp_path):
    out = tmp_path / "deepcam"
    text = gen(out, "--layout", "deepcam", "--samples", 5, "--shape", "12,16,4", "--seed", 3)
    assert f"--dataset {out}/:/climate/data --labels /climate/labels_0" in text, text
    files = hdf5_files(out)
    assert files == [f"{out}/data-{g:06d}.h5" for g in range(5)]
    for g, path in enumerate(files):
        with h5py.File(path, "r") as f:
            data, labels = f["climate/data"], f["climate/labels_0"]
            assert data.shape == (12, 16, 4) and data.dtype == np.dtype("<f4")
            assert labels.shape == (12, 16) and labels.dtype == np.dtype("<i4")
            check_data(data, 3, g, rows=False)
            check_labels(labels, 3, g, 1, rows=False)


def test_dlio_8_files_of_50_with_a_short_last_one(tmp_path):
    out = tmp_path / "dlio"
    text = gen(out, "--layout", "dlio", "--files", 8, "--samples-per-file", 50, "--samples", 380,
               "--shape", "16,16", "--seed", 11)
    assert f"--dataset {out}/:/records[] --labels /labels" in text, text
    assert "50 a file, the last 30" in text, text
    files = hdf5_files(out)
    assert files == [f"{out}/img_{i}_of_8.hdf5" for i in range(8)]
    total = 0
    for i, path in enumerate(files):
        with h5py.File(path, "r") as f:
            records, labels = f["records"], f["labels"]
            n = 30 if i == 7 else 50
            assert records.shape == (n, 16, 16) and records.dtype == np.dtype("u1")
            assert labels.shape == (n,) and labels.dtype == np.dtype("<i8")
            assert check_data(records, 11, 50 * i, rows=True) == n
            check_labels(labels, 11, 50 * i, n, rows=True)
            # An int64 label is the int32 label's value.
            assert [int(x) for x in labels[()]] == \
                [content.sample_bytes(11, 50 * i + k, 1)[1] for k in range(n)]
            total += n
    assert total == 380


def test_dlio_divides_samples_over_files_and_pads_names(tmp_path):
    out = tmp_path / "dlio"
    text = gen(out, "--layout", "dlio", "--files", 12, "--samples", 130, "--shape", "4,4")
    files = hdf5_files(out)
    assert files == [f"{out}/img_{i:02d}_of_12.hdf5" for i in range(12)]  # DLIO's zero padding
    counts = []
    for path in files:
        with h5py.File(path, "r") as f:
            counts.append(f["records"].shape[0])
    assert counts == [11] * 11 + [9], counts  # 130 / 12 rounded up, the rest in the last
    assert "11 a file, the last 9" in text, text


@pytest.mark.parametrize("storage,chunks,compression", [
    ("chunked", (1, 8, 8), None), ("gzip", (1, 8, 8), "gzip")])
def test_dlio_storage_layouts(tmp_path, storage, chunks, compression):
    out = tmp_path / "dlio"
    gen(out, "--layout", "dlio", "--files", 2, "--samples", 7, "--shape", "8,8",
        "--storage-layout", storage)
    for i, path in enumerate(hdf5_files(out)):
        with h5py.File(path, "r") as f:
            assert f["records"].chunks == chunks and f["records"].compression == compression
            check_data(f["records"], 0, 4 * i, rows=True)


def test_the_single_file_is_as_before_with_solar_first(tmp_path):
    out = tmp_path / "one.h5"
    text = gen(out, "--samples", 10, "--preset", "tiny", "--layout", "chunked", "--seed", 2)
    assert f"--dataset {out} --labels /label" in text, text
    with h5py.File(out, "r") as f:
        assert sorted(f.keys()) == ["data", "label"]
        assert f["data"].shape == (10, 4, 8, 8, 8) and f["data"].chunks == (1, 4, 8, 8, 8)
        check_data(f["data"], 2, 0, rows=True)
        assert f["label"].dtype == np.dtype("<i4")
        assert list(f["label"][()]) == [content.sample_bytes(2, i, 1)[1] for i in range(10)]
        check_labels(f["label"], 2, 0, 10, rows=True)
    assert [p.name for p in tmp_path.iterdir()] == ["one.h5"]


@pytest.mark.parametrize("args,flag,fix", [
    (["--layout", "per-sample-files", "--files", "4"], "--files", "--layout dlio"),
    (["--layout", "deepcam", "--samples-per-file", "4"], "--samples-per-file", "--layout dlio"),
    (["--layout", "dlio", "--universes-per-dir", "2", "--files", "2"], "--universes-per-dir",
     "drop it"),
    (["--layout", "chunked", "--storage-layout", "gzip"], "--storage-layout", "give one"),
    (["--layout", "dlio"], "--layout dlio", "--files N"),
    (["--layout", "dlio", "--files", "20"], "--files", "at most --files 10"),
    (["--layout", "dlio", "--files", "4", "--samples-per-file", "2"], "--samples",
     "give --samples in 7..8"),
    (["--layout", "per-sample", "--files", "4"], "--layout", "per-sample-files"),
])
def test_bad_combinations_are_refused_naming_the_fix(tmp_path, args, flag, fix):
    p = solar("gen", tmp_path / "out", "--samples", 10, "--preset", "tiny", *args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    line = p.stderr.strip()
    assert len(line.splitlines()) == 1 and flag in line and fix in line, line
    assert list(tmp_path.iterdir()) == []


def test_dlio_files_times_samples_per_file_without_samples(tmp_path):
    out = tmp_path / "dlio"
    gen(out, "--layout", "dlio", "--files", 3, "--samples-per-file", 4, "--shape", "2,2")
    assert len(hdf5_files(out)) == 3


def test_force_replaces_a_generated_directory_and_nothing_else(tmp_path):
    out = tmp_path / "cosmo"
    layout = ["--layout", "per-sample-files", "--preset", "tiny"]
    args = [*layout, "--samples", 70]
    gen(out, *args, "--seed", 1)
    p = solar("gen", out, "--no-progress", *args, "--seed", 2)
    assert p.returncode == 2 and "--force" in p.stderr, p.stderr
    gen(out, *layout, "--samples", 3, "--seed", 2, "--force")
    files = hdf5_files(out)
    assert len(files) == 3
    with h5py.File(files[2], "r") as f:
        check_data(f["split"], 2, 2, rows=False)
    assert nothing_partial(tmp_path)
    # A single file over the directory, and a directory over the file.
    gen(out, "--samples", 2, "--preset", "tiny", "--force")
    assert out.is_file()
    gen(out, *args, "--force")
    assert len(hdf5_files(out)) == 70
    # Never a folder that holds other things.
    (out / "notes.txt").write_text("mine")
    p = solar("gen", out, "--no-progress", *args, "--force")
    assert p.returncode != 0 and "notes.txt" in p.stderr and "not an HDF5 file" in p.stderr, \
        p.stderr
    assert (out / "notes.txt").read_text() == "mine" and len(hdf5_files(out / "000")) == 70
    assert nothing_partial(tmp_path)


def test_sparse_content_compresses_and_verifies(tmp_path):
    """--content sparse: content.h's sparse rule, byte for byte; gzip keeps under a third of
    the bytes; solar verify and the reader of many files check it; a wrong byte is named."""
    one = tmp_path / "one.h5"
    text = gen(one, "--samples", 12, "--preset", "small", "--layout", "gzip", "--content",
               "sparse", "--seed", 3)
    assert "content sparse (" in text and "on disk)" in text, text
    raw = 12 * 256 * 1024
    assert one.stat().st_size < raw / 3, (one.stat().st_size, raw)
    with h5py.File(one, "r") as f:
        assert f["data"].compression == "gzip"
        check_data(f["data"], 3, 0, rows=True, kind="sparse")
        zeros = np.count_nonzero(f["data"][0].view(np.uint8) == 0) / (256 * 1024)
        assert 0.7 < zeros < 0.8, zeros  # three bytes in four
    p = solar("verify", one, "--no-progress", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    # The same seed's random content is not it.
    rnd = tmp_path / "random.h5"
    gen(rnd, "--samples", 12, "--preset", "small", "--layout", "gzip", "--seed", 3)
    assert rnd.stat().st_size > raw, rnd.stat().st_size
    # Many files (through the dataset index): every sample checked, a wrong byte named.
    out = tmp_path / "cosmo"
    text = gen(out, "--layout", "per-sample-files", "--samples", 10, "--preset", "tiny",
               "--storage-layout", "gzip", "--content", "sparse", "--seed", 4)
    spec = re.search(r"--dataset (\S+) --labels (\S+)", text).group(1)
    for i, path in enumerate(hdf5_files(out)):
        with h5py.File(path, "r") as f:
            check_data(f["split"], 4, i, rows=False, kind="sparse")
    import json
    p = solar("verify", spec, "--labels", "/unitPar", "--no-progress", "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["samples"] == 10, p.stdout + p.stderr
    with h5py.File(out / "000" / "univ0000_006.hdf5", "r+") as f:
        x = f["split"][()]
        x.flat[0] = 9  # never a sparse byte
        f["split"][()] = x
    p = solar("verify", spec, "--labels", "/unitPar", "--no-progress", "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["bad_samples"] == [6], p.stdout + p.stderr
    # npz is stored uncompressed: refused by name; an unknown content too.
    p = solar("gen", tmp_path / "n", "--layout", "npz", "--samples", 2, "--content", "sparse")
    assert p.returncode == 2 and "--content" in p.stderr and "drop it" in p.stderr, p.stderr
    p = solar("gen", tmp_path / "z", "--samples", 2, "--content", "zeros")
    assert p.returncode == 2 and "'zeros' is not random or sparse" in p.stderr, p.stderr
    assert not (tmp_path / "n").exists() and not (tmp_path / "z").exists()


def test_verify_checks_one_file_of_many_by_its_global_ids(tmp_path):
    out = tmp_path / "dlio"
    gen(out, "--layout", "dlio", "--files", 4, "--samples", 40, "--shape", "8,8", "--seed", 5)
    one = out / "img_2_of_4.hdf5"
    p = solar("verify", f"{one}:/records", "--labels", "/labels", "--no-progress")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "verified 10 samples" in p.stdout and "and their labels" in p.stdout, p.stdout
    assert "ids from 20" in p.stdout, p.stdout
    # A wrong byte in sample 3 of the file is global sample 23; a wrong label, 27.
    with h5py.File(one, "r+") as f:
        r = f["records"][3]
        r[0, 0] ^= 1
        f["records"][3] = r
        f["labels"][7] += 1
    p = solar("verify", f"{one}:/records", "--labels", "/labels", "--no-progress", "--json")
    assert p.returncode == 1, p.stdout + p.stderr
    import json
    doc = json.loads(p.stdout)
    assert doc["bad_samples"] == [23] and doc["bad_labels"] == [27], doc


@pytest.mark.parametrize("layout,args,labels", [
    ("per-sample-files", ["--samples", "70", "--preset", "tiny"], "/unitPar"),
    ("deepcam", ["--samples", "4", "--shape", "6,8,2"], "/climate/labels_0"),
    ("dlio", ["--files", "8", "--samples-per-file", "50", "--samples", "380", "--shape", "8,8"],
     "/labels"),
])
def test_verify_reads_the_whole_layout(tmp_path, layout, args, labels):
    out = tmp_path / layout
    text = gen(out, "--layout", layout, "--seed", 9, *args)
    spec = re.search(r"--dataset (\S+) --labels (\S+)", text)
    assert spec and spec.group(2) == labels, text
    p = solar("verify", spec.group(1), "--labels", labels, "--no-progress", "--json")
    if p.returncode == 2 and "not a regular file" in p.stderr:
        pytest.skip("this build's reader takes one file only (issue 35, item 1)")
    assert p.returncode == 0, p.stdout + p.stderr
    import json
    doc = json.loads(p.stdout)
    assert doc["ok"] and doc["labels_checked"], doc
    assert doc["samples"] == {"per-sample-files": 70, "deepcam": 4, "dlio": 380}[layout], doc


@pytest.mark.skipif(not os.environ.get("SOLAR_EXAMPLE_TRAIN"), reason="needs SOLAR_EXAMPLE_TRAIN")
@pytest.mark.parametrize("layout,args,corrupt", [
    ("per-sample-files", ["--samples", "70", "--preset", "tiny"],
     ("000/univ0000_005.hdf5", "unitPar", -1, 5)),
    ("deepcam", ["--samples", "24", "--shape", "6,8,2"],
     ("data-000003.h5", "climate/labels_0", -1, 3)),
    ("dlio", ["--files", "8", "--samples-per-file", "50", "--samples", "380", "--shape", "8,8"],
     ("img_7_of_8.hdf5", "labels", 7, 357)),
])
def test_example_train_verifies_samples_and_labels_of_every_layout(tmp_path, layout, args,
                                                                   corrupt):
    out = tmp_path / layout
    text = gen(out, "--layout", layout, "--seed", 4, *args)
    spec, labels = re.search(r"--dataset (\S+) --labels (\S+)", text).groups()

    def train():
        return subprocess.run(
            [SOLAR, "run", "-n", "2", "--no-agent", "--dataset", spec, "--labels", labels,
             "--buffer", "75%", "--epochs", "1", "--batch", "2", "--",
             os.environ["SOLAR_EXAMPLE_TRAIN"], "--verify"],
            capture_output=True, text=True, timeout=300)

    p = train()
    assert p.returncode == 0, p.stdout + p.stderr
    assert (p.stdout + p.stderr).count("verified (0 wrong)") == 2, p.stdout + p.stderr
    # One label element off: that sample, by its global id, is wrong (labels of any size are
    # checked, not only int32 ones).
    name, array, element, gid = corrupt
    with h5py.File(out / name, "r+") as f:
        value = f[array][()]
        value.flat[element] += 1
        f[array][...] = value
    p = train()
    assert p.returncode != 0, p.stdout + p.stderr
    assert f"sample {gid} at step" in p.stderr + p.stdout, p.stdout + p.stderr
    assert "verified (1 wrong)" in p.stdout + p.stderr, p.stdout + p.stderr
