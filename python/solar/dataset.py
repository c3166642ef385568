"""The dataset a loader reads: its spec ('FILE.h5[:/dataset]' or 'fabric://HOST:PORT/NAME'),
the layout of a sample and of a label (shape, dtype) from libsolar or, failing that, the HDF5
file, and `DatasetInfo`, what `loader.dataset` is."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from . import _lib

_lib_ = _lib.lib


def split_dataset_spec(spec):
    """'FILE.h5[:/dataset]' -> (file, dataset); (None, None) for fabric:// sources."""
    if spec.startswith("fabric://"):
        return None, None
    # Split at the last ":/" after the first character, as protocol/src/dataset_spec.cpp does
    # (tests/protocol/dataset_spec_cases.json holds both to the same table).
    pos = spec.rfind(":/")
    if pos > 0:
        return spec[:pos], spec[pos + 1:]
    return spec, "/data"


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
    """(sample shape, dtype, label dtype) from the HDF5 file, or Nones when unknown (the fallback
    when libsolar does not know them: h5py is imported only here)."""
    path, name = split_dataset_spec(spec)
    if not path or not os.path.exists(path):
        return None, None, None
    try:
        import h5py
    except ImportError:
        return None, None, None
    with h5py.File(path, "r") as f:
        d = f[name]
        label_dtype = None
        if labels and labels in f:
            label_dtype = f[labels].dtype
        return tuple(d.shape[1:]), d.dtype, label_dtype


class DatasetInfo:
    """What `loader.dataset` is: the dataset the plan reads. `str()` is its spec
    ('FILE.h5:/data' or 'fabric://HOST:PORT/NAME'), `len()` its number of samples (so
    `len(loader.dataset)` counts samples as with a DataLoader); `file`, `name` (None for
    fabric://), `labels` (the labels dataset, None for none), `shape`, `dtype` of one sample."""

    __slots__ = ("spec", "file", "name", "labels", "samples", "shape", "dtype")

    def __init__(self, spec, labels, samples, shape, dtype):
        self.spec = spec
        self.file, self.name = split_dataset_spec(spec)
        self.labels = labels or None
        self.samples, self.shape, self.dtype = samples, shape, dtype

    def __len__(self):
        return self.samples

    def __str__(self):
        return self.spec

    def __repr__(self):
        return (f"<solar.DatasetInfo {self.spec} samples={self.samples} shape={self.shape} "
                f"dtype={self.dtype}>")


def _resolve_label_dtypes(file_dtype, label_bytes, label_dtype):
    """(stored, returned) label dtypes: the file's type (or, without it, label_dtype when it is
    as wide as a stored label, else a signed integer of that width); labels are returned as
    label_dtype, by default int64 for integer labels (floating-point ones keep their type)."""
    if not label_bytes:
        return None, np.dtype(label_dtype if label_dtype is not None else np.int64)
    if file_dtype is not None:
        stored = np.dtype(file_dtype)
    elif label_dtype is not None and np.dtype(label_dtype).itemsize == label_bytes:
        stored = np.dtype(label_dtype)
    elif label_bytes in (1, 2, 4, 8):
        stored = np.dtype(f"i{label_bytes}")
    else:
        raise ValueError(f"solar.Loader: a label is {label_bytes} bytes and its type is unknown: "
                         f"pass label_dtype= with a {label_bytes}-byte type")
    if stored.itemsize != label_bytes:
        raise ValueError(f"solar.Loader: the file's label type {stored} is {stored.itemsize} "
                         f"bytes, libsolar's labels are {label_bytes}")
    if label_dtype is not None:
        out = np.dtype(label_dtype)
    else:
        out = np.dtype(np.int64) if stored.kind in "iub" else stored
    return stored, out
