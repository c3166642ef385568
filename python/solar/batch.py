# SPDX-License-Identifier: Apache-2.0
"""solar.Batch: one rank's batch of one step, and the pool that recycles the memory of its copies.

The zero-copy views of a batch (`sample(i)`, `views()`) point into the node agent's shared
buffer (or the loader's own memory when it reads directly) and are valid until the batch is
released; its copies (`data, labels = batch`) come from `_ArrayPool` blocks and stay valid as long
as they are kept.
"""
from __future__ import annotations

import ctypes
import weakref

import numpy as np

from . import _lib
from .errors import BatchReleasedError, SolarError

_lib_ = _lib.lib


class _Lease:
    """Exports a pooled block's rows to numpy; its death is the block's release."""

    __slots__ = ("rows", "__weakref__")

    def __init__(self, rows):
        self.rows = rows

    @property
    def __array_interface__(self):
        return self.rows.__array_interface__


class _ArrayPool:
    """Recycles the memory of batch copies: `take(n)` returns an (n, *shape) array that is a
    view of a pooled block; once the array and everything made from it (tensors, views) are
    gone, the block goes back to the pool. A training loop that drops each batch after its step
    keeps reusing two or three blocks, already faulted in, instead of fresh memory per batch."""

    def __init__(self, rows, shape, dtype):
        self.rows, self.shape, self.dtype = rows, tuple(shape), np.dtype(dtype)
        self.free = []

    def take(self, n):
        if n > self.rows:  # a larger batch (δ > 0): blocks of that size from now on
            self.rows, self.free = n, []
        block = self.free.pop() if self.free else np.empty((self.rows,) + self.shape,
                                                             dtype=self.dtype)
        lease = _Lease(block[:n])
        weakref.finalize(lease, self._give, block).atexit = False
        # The array's base is the lease, and numpy does not collapse views past a non-array
        # base: every slice, view or tensor made from the array keeps the lease alive.
        return np.asarray(lease)

    def _give(self, block):
        if len(block) == self.rows and len(self.free) < 8:
            self.free.append(block)


class Batch:
    """One rank's batch of one step.

    Unpacks as `data, labels = batch`. `data` and `labels` are arrays of the batch's samples, in
    the plan's order, after the loader's `transform`. By default (`zero_copy=False`) they are
    copied out of the shared buffer when the batch is taken and stay valid for as long as they
    are kept, like a DataLoader's tensors. With `zero_copy=True` nothing is copied until `data`
    or `labels` is first read, which must happen before the batch is released.
    `sample(i)` and `views()` are zero-copy, read-only views into the shared buffer, valid until
    the batch is released: when the next batch is taken, by `release()`, or when the loader
    closes. Metadata (indices, step, epoch, weight, len) stays readable after release.
    """

    __slots__ = ("_loader", "_handle", "_ptrs", "_data", "_labels", "_ready", "_why", "released",
                 "indices", "step", "epoch", "weight")

    def __init__(self, loader, handle):
        self._loader = loader
        self._handle = handle
        n = _lib_.solar_batch_size(handle)
        self.step = int(_lib_.solar_batch_step(handle))
        self.epoch = int(_lib_.solar_batch_epoch(handle))
        self.indices = np.fromiter((_lib_.solar_batch_index(handle, i) for i in range(n)),
                                   dtype=np.int64, count=n)
        self._ptrs = None  # sample addresses, fetched for the first zero-copy view
        self._data = self._labels = None
        self._ready = False  # data and labels copied (and transformed)
        self._why = None     # what released the batch
        self.released = False
        self.weight = n / _lib_.solar_batch_mean_size(handle)

    def __len__(self):
        return len(self.indices)

    def __iter__(self):
        self._materialize("unpacking")
        return iter((self._data, self._labels))

    def __repr__(self):
        state = "released" if self.released else "held"
        return f"<solar.Batch step={self.step} epoch={self.epoch} size={len(self)} {state}>"

    def _live(self, what):
        if self.released:
            raise BatchReleasedError(
                f"solar: {what} used on the batch of step {self.step} after it was "
                f"{self._why}: zero-copy views are valid only while the batch is held (until the next batch "
                "is taken); keep `batch.data` (a copy) or copy the view")

    def _materialize(self, what):
        """Copies data and labels out of the shared buffer and applies the transform, once."""
        if self._ready:
            return
        if self.released:
            raise BatchReleasedError(
                f"solar: {what} used on the batch of step {self.step} after it was "
                f"{self._why}: the loader has zero_copy=True, so a batch's data is copied on first use and that "
                "must happen while it is held; read `data, labels = batch` before the next "
                "batch is taken, or use zero_copy=False (copies made when the batch is taken)")
        data = self._copy_data()
        labels = self._copy_labels() if self._loader.label_bytes else None
        transform = self._loader.transform
        if transform is not None:
            out = transform(data, labels)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise TypeError(f"solar.Loader: transform must return (data, labels), not "
                                f"{type(out).__name__}")
            data, labels = out
        self._data, self._labels, self._ready = data, labels, True

    def _copy_data(self):
        if self._loader.sizes_differ:
            return self._copy_sized()
        a = self._loader._pool.take(len(self))
        self.gather(a.ctypes.data)
        return a

    def _copy_sized(self):
        """Samples of differing sizes (whole files): a list of uint8 arrays, each one sample's
        bytes, views of one block gathered in one call."""
        n = len(self.indices)
        lengths = [int(_lib_.solar_batch_sample_bytes(self._handle, k)) for k in range(n)]
        flat = np.empty(sum(lengths), dtype=np.uint8)
        if _lib_.solar_batch_gather(self._handle, flat.ctypes.data, flat.nbytes, None, 0) != 0:
            raise SolarError(f"solar: {_lib.last_error()}")
        return np.split(flat, np.cumsum(lengths[:-1])) if n else []

    def _copy_labels(self):
        L = self._loader
        raw = np.empty((len(self),) + L.label_shape, dtype=L._label_stored)
        self.gather(None, raw.ctypes.data)
        return raw if raw.dtype == L.label_dtype else raw.astype(L.label_dtype)

    def sample(self, i):
        """Zero-copy read-only view of sample i (shape and dtype of the dataset), valid until
        the batch is released."""
        self._live("sample()")
        n = len(self.indices)
        if self._ptrs is None:
            self._ptrs = [_lib_.solar_batch_sample(self._handle, k) for k in range(n)]
        if not -n <= i < n:
            raise IndexError(f"solar: sample {i} of a batch of {n}")
        L = self._loader
        if L.sizes_differ:  # its file's bytes
            length = int(_lib_.solar_batch_sample_bytes(self._handle, i % n))
            buf = (ctypes.c_char * length).from_address(self._ptrs[i])
            a = np.frombuffer(buf, dtype=np.uint8)
            a.flags.writeable = False
            return a
        buf = (ctypes.c_char * L.sample_bytes).from_address(self._ptrs[i])
        a = np.frombuffer(buf, dtype=L.dtype).reshape(L.shape)
        a.flags.writeable = False
        return a

    def views(self):
        """Zero-copy read-only views of every sample, valid until release."""
        self._live("views()")
        return [self.sample(i) for i in range(len(self))]

    def gather(self, out, labels_out=None):
        """Copies the samples into `out` (a C-contiguous buffer of len(self)·sample_bytes bytes
        at address `out`, an int) and, when given, the labels into `labels_out` (len(self)·
        label_bytes bytes, the stored label type), in one libsolar call."""
        self._live("gather()")
        L = self._loader
        n = len(self.indices)
        if _lib_.solar_batch_gather(self._handle, out,
                                    int(_lib_.solar_batch_bytes(self._handle)) if out else 0,
                                    labels_out, n * L.label_bytes if labels_out else 0) != 0:
            raise SolarError(f"solar: {_lib.last_error()}")

    @property
    def data(self):
        """The samples as one (len, *shape) array (a copy, after the transform)."""
        self._materialize("data")
        return self._data

    @property
    def labels(self):
        """The labels as a (len, *label_shape) array (label_shape is () for one number per
        sample; a copy; int64 by default), or None when the dataset has none."""
        self._materialize("labels")
        return self._labels

    def release(self):
        """Gives the batch back to the loader (and its slots to the agent). Idempotent. With
        zero_copy=False its data and labels stay valid; views do not."""
        if not self.released:
            self._loader._release(self, "released by release()")
