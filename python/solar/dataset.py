# SPDX-License-Identifier: Apache-2.0
"""The dataset a loader reads: its spec, the layout of a sample and of a label (shape, dtype) from
libsolar or, failing that, the HDF5 files, and `DatasetInfo`, what `loader.dataset` is.

A spec names one HDF5 file (`FILE.h5[:/name]`), many (a directory, a glob, `@LIST`, each with
`:/name` for the array in every file and an optional `[]` after it), or a solar-stored export
(`fabric://HOST:PORT/NAME`); protocol/include/solar/dataset_spec.h is the C++ parser this one is
held to (tests/protocol/dataset_spec_cases.json), storage/include/solar/storage/dataset_files.h
says what the files are."""
from __future__ import annotations

import ctypes
import glob as _glob
import os
from collections import namedtuple
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np

from . import _lib

_lib_ = _lib.lib

# A directory's HDF5 files: the suffixes storage/src/dataset_files.cpp takes.
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")


def split_dataset_spec(spec):
    """'FILE[:/dataset]' -> (file, dataset), split as written (an `@` or a `[]` stays where it
    is: parse_dataset_spec takes them off); (None, None) for fabric:// sources."""
    if spec.startswith("fabric://"):
        return None, None
    # Split at the last ":/" after the first character, as protocol/src/dataset_spec.cpp does
    # (tests/protocol/dataset_spec_cases.json holds both to the same table).
    pos = spec.rfind(":/")
    if pos > 0:
        return spec[:pos], spec[pos + 1:]
    return spec, "/data"


@dataclass(frozen=True)
class DatasetSpec:
    """What a spec names, as protocol's parse_dataset_spec reads it. kind: "file" (file and
    dataset set: one HDF5 file, a directory, a glob or a list), "fabric" (a solar-stored
    export), "unknown_scheme" (another SCHEME://), "no_file" (nothing named). list: `@LIST`
    (file is the list, without the @); glob: `*`, `?` or `[` in the file; rows: the dataset
    ended with `[]` (taken off it), its first dimension indexes samples in every file. A
    directory is told from a file only by stat (names_many_files)."""
    kind: str
    file: Optional[str] = None
    dataset: Optional[str] = None
    list: bool = False
    glob: bool = False
    rows: bool = False


def parse_dataset_spec(spec):
    """The DatasetSpec of `spec` (a str): fabric:// first, any other "://" refused, then
    FILE[:/DATASET] with `@` and `[]` taken off."""
    if spec.startswith("fabric://"):
        return DatasetSpec("fabric")
    if "://" in spec:
        return DatasetSpec("unknown_scheme")
    file, dataset = split_dataset_spec(spec)
    rows = dataset.endswith("[]")
    if rows:
        dataset = dataset[:-2]
    is_list = file.startswith("@")
    if is_list:
        file = file[1:]
    if not file:
        return DatasetSpec("no_file")
    return DatasetSpec("file", file, dataset, list=is_list,
                       glob=not is_list and any(c in file for c in "*?["), rows=rows)


def names_many_files(spec):
    """True when `spec` (a str or DatasetSpec) names many files: a directory (or a path ending
    in /), a glob, @LIST; as storage's names_many_files."""
    d = spec if isinstance(spec, DatasetSpec) else parse_dataset_spec(spec)
    return d.kind == "file" and (d.list or d.glob or d.file.endswith("/")
                                 or os.path.isdir(d.file))


# The rules below are storage/src/dataset_files.cpp's list_files, so that the file the h5py
# fallback reads is the file whose samples come first.

def _directory_files(top):
    # Symbolic links to files are taken, to folders not followed (recursive_directory_iterator
    # without follow_directory_symlink); the suffix is the name's extension ('.h5' alone is a
    # hidden file without one).
    for root, _, names in os.walk(top):
        for n in names:
            path = os.path.join(root, n)
            if os.path.splitext(n)[1] in HDF5_SUFFIXES and os.path.isfile(path):
                yield path


def _list_files(list_path):
    base = os.path.dirname(list_path)
    with open(list_path, encoding="utf-8", errors="surrogateescape", newline="\n") as f:
        for line in f:
            line = line.rstrip("\n").rstrip("\r \t").lstrip(" \t")
            if line and not line.startswith("#"):
                yield os.path.join(base, line)  # an absolute line stays absolute


def _by_bytes(paths):
    return sorted(paths, key=os.fsencode)  # byte order, as std::sort of the names


def dataset_files(spec) -> Iterator[str]:
    """The files of a dataset in sample-id order (global ids: a file's samples follow the
    previous file's), as libsolar lists them: one file for FILE.h5; a directory's files whose
    names end .h5, .hdf5, .hdf or .he5, found recursively, sorted by path; a glob's matches
    other than folders, sorted (glob(3): `*`, `?`, `[...]` within one path component, so `**`
    is `*`; names starting with a dot only where the pattern has the dot); @LIST's lines in
    their order, blanks around a line, empty lines and lines starting with # skipped, relative
    paths taken relative to the list's folder. Sorted is by the path's bytes: the order
    sorted(glob.glob(...)) gives for the same files. Nothing for fabric:// (no files) or a
    spec naming nothing. Raises OSError when the list cannot be read."""
    d = spec if isinstance(spec, DatasetSpec) else parse_dataset_spec(spec)
    if d.kind != "file":
        return iter(())
    if d.list:
        return _list_files(d.file)
    if d.glob:
        return iter(_by_bytes(p for p in _glob.glob(d.file) if not os.path.isdir(p)))
    if os.path.isdir(d.file):
        return iter(_by_bytes(_directory_files(d.file)))
    return iter((d.file,))


# A sample's and a label's layout: each field None when unknown.
Layout = namedtuple("Layout", "shape dtype label_dtype label_shape")
_UNKNOWN = Layout(None, None, None, None)


def library_layout(handle, has_labels):
    """(sample shape, dtype, label dtype) as libsolar knows them (from the agent, or the source
    it reads directly), each None when it does not; no HDF5 needed."""
    n = _lib_.solar_sample_shape(handle, None, 0)
    shape = None
    if n >= 0:
        dims = (ctypes.c_uint64 * max(n, 1))()
        _lib_.solar_sample_shape(handle, dims, n)
        shape = tuple(int(d) for d in dims[:n])

    def dtype_of(name):
        name = (name or b"").decode("ascii", "replace")
        return np.dtype(name) if name else None

    dtype = dtype_of(_lib_.solar_sample_dtype(handle))
    label_dtype = dtype_of(_lib_.solar_label_dtype(handle)) if has_labels else None
    return shape, dtype, label_dtype


def dataset_layout(spec, labels):
    """Layout(shape, dtype, label_dtype, label_shape) of one sample from the dataset's first
    HDF5 file (dataset_files' order), Nones when unknown (the fallback when libsolar does not
    know them: h5py is imported only here). One file, or `[]` after the array's name: its first
    dimension indexes samples, a sample is shape[1:] and a label the labels array's shape[1:].
    Many files without `[]`: each file's whole array is one sample, its whole labels array that
    sample's label."""
    d = parse_dataset_spec(spec)
    if d.kind != "file":
        return _UNKNOWN
    try:
        path = next(dataset_files(d), None)
    except OSError:
        return _UNKNOWN
    if not path or not os.path.isfile(path):
        return _UNKNOWN
    try:
        import h5py
    except ImportError:
        return _UNKNOWN
    skip = 1 if d.rows or not names_many_files(d) else 0
    with h5py.File(path, "r") as f:
        if d.dataset not in f:
            return _UNKNOWN
        a = f[d.dataset]
        label_dtype = label_shape = None
        if labels and labels in f:
            label_dtype, label_shape = f[labels].dtype, tuple(f[labels].shape[skip:])
        return Layout(tuple(a.shape[skip:]), a.dtype, label_dtype, label_shape)


class DatasetInfo:
    """What `loader.dataset` is: the dataset the plan reads. `str()` is its spec
    ('FILE.h5:/data', 'train/:/split', 'fabric://HOST:PORT/NAME'), `len()` its number of samples
    (so `len(loader.dataset)` counts samples as with a DataLoader).
    kind: "file" (one HDF5 file), "directory", "glob", "list" (many files) or "fabric".
    path: the file, directory, glob or list (without its @); None for fabric://.
    file: the one HDF5 file of a one-file dataset, None otherwise.
    name: the array in every file (without `[]`), None for fabric://.
    rows: True when the array's first dimension indexes samples (one file, or `[]`); False
    when each file's whole array is one sample.
    labels: the labels array (None for none); shape, dtype: of one sample."""

    __slots__ = ("spec", "kind", "path", "file", "name", "rows", "labels", "samples", "shape",
                 "dtype")

    def __init__(self, spec, labels, samples, shape, dtype):
        self.spec = spec
        d = parse_dataset_spec(spec)
        if d.kind != "file":
            self.kind, self.path, self.name, self.rows = "fabric", None, None, True
        else:
            self.kind = ("list" if d.list else "glob" if d.glob else
                         "directory" if os.path.isdir(d.file) else "file")
            self.path, self.name = d.file, d.dataset
            self.rows = d.rows or self.kind == "file"
        self.file = self.path if self.kind == "file" else None
        self.labels = labels or None
        self.samples, self.shape, self.dtype = samples, shape, dtype

    @property
    def many_files(self):
        """True for a directory, a glob or a list."""
        return self.kind in ("directory", "glob", "list")

    def files(self):
        """The dataset's files in sample-id order (an iterator: a listing of 10^5 files is
        walked, not held; nothing for fabric://). See dataset_files."""
        return dataset_files(self.spec)

    def __len__(self):
        return self.samples

    def __str__(self):
        return self.spec

    def __repr__(self):
        many = f" ({self.kind}{'' if self.rows else ', a file per sample'})" \
            if self.many_files else ""
        return (f"<solar.DatasetInfo {self.spec}{many} samples={self.samples} "
                f"shape={self.shape} dtype={self.dtype}>")


def _resolve_label_dtypes(file_dtype, label_bytes, label_dtype):
    """(stored, returned) label dtypes: the file's type (or, without it, label_dtype when it is
    as wide as a stored label, else a signed integer of that width); labels are returned as
    label_dtype, by default int64 for integer labels (floating-point ones keep their type). A
    label may hold several elements of the file's type (a file's whole labels array: the SOLAR
    artifact's 4 float32 `unitPar`)."""
    if not label_bytes:
        return None, np.dtype(label_dtype if label_dtype is not None else np.int64)
    if file_dtype is not None:
        stored = np.dtype(file_dtype)
    elif label_dtype is not None and np.dtype(label_dtype).itemsize == label_bytes:
        stored = np.dtype(label_dtype)
    elif label_bytes in (1, 2, 4, 8):
        stored = np.dtype(f"i{label_bytes}")
    elif label_dtype is not None and label_bytes % np.dtype(label_dtype).itemsize == 0:
        stored = np.dtype(label_dtype)  # a label of several elements (fabric:// unitPar)
    else:
        raise ValueError(f"solar.Loader: a label is {label_bytes} bytes and its type is unknown: "
                         f"pass label_dtype= with a type whose size divides {label_bytes} (a "
                         "label of several values: label_dtype='float32' for 4-byte floats)")
    if label_bytes % stored.itemsize:
        raise ValueError(f"solar.Loader: the file's label type {stored} is {stored.itemsize} "
                         f"bytes, libsolar's labels are {label_bytes}: not a whole number of "
                         "them")
    if label_dtype is not None:
        out = np.dtype(label_dtype)
    else:
        out = np.dtype(np.int64) if stored.kind in "iub" else stored
    return stored, out


def _label_shape(label_bytes, stored, file_shape):
    """The shape of one label: () for one element (labels come as a (len,) array), else the
    labels array's per-sample shape from the file when it holds as many elements (DeepCAM's
    768x1152 mask), else (elements,)."""
    n = label_bytes // stored.itemsize if label_bytes else 1
    if n == 1:
        return ()
    if file_shape is not None and int(np.prod(file_shape)) == n:
        return tuple(int(s) for s in file_shape)
    return (n,)
