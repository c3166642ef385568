"""solar.Loader: a rank's batches from libsolar as numpy arrays.

A loader is one pass over the planned run, epoch after epoch, as the plan orders them. Iterating
it yields the batches of one epoch (like a DataLoader); `set_epoch(e)` says which epoch comes
next. Each Batch is valid until the next batch is taken (or `release()`): its zero-copy views
point into the node agent's shared buffer (or the loader's own memory when it reads directly),
so after release every access to the batch's data raises `BatchReleasedError`.
"""
import ctypes
import os
import threading
import warnings
import weakref

import numpy as np

from . import _lib

_lib_ = _lib.lib
_ENV_LOCK = threading.Lock()


class SolarError(RuntimeError):
    """An error reported by libsolar (the message names what is wrong)."""


class BatchReleasedError(SolarError):
    """The batch was used after it was released (its memory now holds other samples)."""


def _check_count(name, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"solar.Loader: {name} must be an int, not {type(value).__name__}")
    if value < 0 or value > 0xFFFFFFFF:
        raise ValueError(f"solar.Loader: {name}={value} is out of range (0..2^32-1)")
    return str(int(value))


def _check_text(name, value):
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise TypeError(f"solar.Loader: {name} must be a str or path, not {type(value).__name__}")
    if "\0" in value:
        raise ValueError(f"solar.Loader: {name} contains a NUL character")
    return value


def split_dataset_spec(spec):
    """'FILE.h5[:/dataset]' -> (file, dataset); (None, None) for fabric:// sources."""
    if spec.startswith("fabric://"):
        return None, None
    head, sep, tail = spec.rpartition(":")
    if sep and tail.startswith("/"):
        return head, tail
    return spec, "/data"


def dataset_layout(spec, labels):
    """(sample shape, dtype, label dtype) from the HDF5 file, or Nones when unknown."""
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

    `data` and `labels` are arrays of the batch's samples, in the plan's order (copies: they stay
    valid after release); `sample(i)` and `views()` are zero-copy, read-only views into the
    shared buffer, valid until release. Unpacks as `data, labels = batch`.
    Metadata (indices, step, epoch, weight, len) stays readable after release.
    """

    __slots__ = ("_loader", "_handle", "_ptrs", "_data", "_labels", "released", "indices",
                 "step", "epoch", "weight")

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
        self.released = False
        self.weight = n / _lib_.solar_batch_mean_size(handle)

    def __len__(self):
        return len(self.indices)

    def __iter__(self):
        return iter((self.data, self.labels))

    def __repr__(self):
        state = "released" if self.released else "held"
        return f"<solar.Batch step={self.step} epoch={self.epoch} size={len(self)} {state}>"

    def _live(self, what):
        if self.released:
            raise BatchReleasedError(
                f"solar: batch of step {self.step} was used ({what}) after it was released: its "
                "memory now holds other samples; keep `batch.data` (a copy) instead of views")

    def sample(self, i):
        """Zero-copy read-only view of sample i (shape and dtype of the dataset)."""
        self._live("sample")
        n = len(self.indices)
        if self._ptrs is None:
            self._ptrs = [_lib_.solar_batch_sample(self._handle, k) for k in range(n)]
        if not -n <= i < n:
            raise IndexError(f"solar: sample {i} of a batch of {n}")
        L = self._loader
        buf = (ctypes.c_char * L.sample_bytes).from_address(self._ptrs[i])
        a = np.frombuffer(buf, dtype=L.dtype).reshape(L.shape)
        a.flags.writeable = False
        return a

    def views(self):
        """Zero-copy read-only views of every sample, valid until release."""
        return [self.sample(i) for i in range(len(self))]

    def gather(self, out, labels_out=None):
        """Copies the samples into `out` (a C-contiguous buffer of len(self)·sample_bytes bytes
        at address `out`, an int) and, when given, the labels into `labels_out` (len(self)·
        label_bytes bytes), in one libsolar call."""
        self._live("gather")
        L = self._loader
        n = len(self.indices)
        if _lib_.solar_batch_gather(self._handle, out, n * L.sample_bytes, labels_out,
                                    n * L.label_bytes if labels_out else 0) != 0:
            raise SolarError(f"solar: {_lib.last_error()}")

    @property
    def data(self):
        """The samples as one (len, *shape) array (a copy, made once)."""
        self._live("data")
        if self._data is None:
            a = self._loader._pool.take(len(self))
            self.gather(a.ctypes.data)
            self._data = a
        return self._data

    @property
    def labels(self):
        """The labels as a (len,) array (a copy), or None when the dataset has none."""
        self._live("labels")
        if self._labels is None and self._loader.label_bytes:
            a = np.empty(len(self), dtype=self._loader.label_dtype)
            self.gather(None, a.ctypes.data)
            self._labels = a
        return self._labels

    def release(self):
        """Gives the batch back to the loader (and its slots to the agent). Idempotent."""
        if not self.released:
            self._loader._release(self)


class Loader:
    """This rank's batches, from the SOLAR_* environment or explicit arguments.

    Arguments override the environment variable of the same meaning: plan (SOLAR_PLAN), node
    (SOLAR_NODE), local_rank (SOLAR_LOCAL_RANK / LOCAL_RANK), dataset (SOLAR_DATASET),
    labels (SOLAR_LABELS, '' for none), socket (SOLAR_SOCKET; '' reads directly).
    shape/dtype/label_dtype: how to view a sample's bytes (default: from the HDF5 file).
    """

    def __init__(self, *, plan=None, node=None, local_rank=None, dataset=None, labels=None,
                 socket=None, shape=None, dtype=None, label_dtype=None):
        self._handle = None
        self._held = None
        self._taken = 0          # batches taken so far (the next one is global step _taken)
        self._next_epoch = 0     # the epoch the next iteration covers
        overrides = {
            "SOLAR_PLAN": _check_text("plan", plan),
            "SOLAR_NODE": _check_count("node", node),
            "SOLAR_LOCAL_RANK": _check_count("local_rank", local_rank),
            "SOLAR_DATASET": _check_text("dataset", dataset),
            "SOLAR_LABELS": _check_text("labels", labels),
            "SOLAR_SOCKET": _check_text("socket", socket),
        }
        if plan is not None and not os.path.isfile(overrides["SOLAR_PLAN"]):
            raise FileNotFoundError(f"solar.Loader: plan file {overrides['SOLAR_PLAN']} does not "
                                    "exist")
        with _ENV_LOCK:
            saved = {k: os.environ.get(k) for k in overrides}
            try:
                for k, v in overrides.items():
                    if v is not None:
                        os.environ[k] = v
                handle = _lib_.solar_open_env()
                err = _lib.last_error()
                self.dataset_spec = os.environ.get("SOLAR_DATASET", "")
                labels_name = os.environ.get("SOLAR_LABELS", "/label")
                self.plan_path = os.environ.get("SOLAR_PLAN", "")
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        if not handle:
            raise SolarError(f"solar.Loader: {err}")
        self._handle = handle
        h = handle
        self.using_agent = bool(_lib_.solar_using_agent(h))
        self.epochs = int(_lib_.solar_epochs(h))
        self.steps_per_epoch = int(_lib_.solar_steps_per_epoch(h))
        self.sample_bytes = int(_lib_.solar_sample_bytes(h))
        self.label_bytes = int(_lib_.solar_label_bytes(h))
        self.samples = int(_lib_.solar_dataset_samples(h))
        self.rank = int(_lib_.solar_rank(h))
        self.world_size = int(_lib_.solar_world_size(h))

        f_shape, f_dtype, f_ldtype = dataset_layout(self.dataset_spec, labels_name)
        self.dtype = np.dtype(dtype if dtype is not None else (f_dtype or np.uint8))
        if shape is None:
            shape = f_shape if f_shape is not None and dtype is None else \
                (self.sample_bytes // self.dtype.itemsize,)
        self.shape = tuple(int(s) for s in shape)
        if int(np.prod(self.shape)) * self.dtype.itemsize != self.sample_bytes:
            self.close()
            raise ValueError(f"solar.Loader: shape {self.shape} of {self.dtype} is "
                             f"{int(np.prod(self.shape)) * self.dtype.itemsize} bytes, a sample "
                             f"is {self.sample_bytes}")
        if label_dtype is None:
            label_dtype = f_ldtype if f_ldtype is not None else \
                {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}.get(self.label_bytes, np.uint8)
        self.label_dtype = np.dtype(label_dtype)
        self._pool = _ArrayPool(1, self.shape, self.dtype)
        if self.label_bytes and self.label_dtype.itemsize != self.label_bytes:
            self.close()
            raise ValueError(f"solar.Loader: label dtype {self.label_dtype} is "
                             f"{self.label_dtype.itemsize} bytes, a label is {self.label_bytes}")

    # --- lifetime -------------------------------------------------------------------------
    def close(self):
        """Releases the held batch and closes the loader. Idempotent."""
        if self._handle:
            if self._held is not None:
                self._held.released = True
                self._held = None
            _lib_.solar_close(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _need_open(self):
        if not self._handle:
            raise SolarError("solar.Loader: the loader is closed")

    # --- batches ----------------------------------------------------------------------------
    def _release(self, batch):
        if batch is not self._held:
            raise SolarError("solar: this batch does not belong to this loader's current step")
        self._held = None
        batch.released = True
        if _lib_.solar_release(self._handle, batch._handle) != 0:
            raise SolarError(f"solar: {_lib.last_error()}")

    def next_batch(self):
        """Releases the batch held, takes the next one of the run; None when the run is done."""
        self._need_open()
        if self._held is not None:
            self._release(self._held)
        out = ctypes.c_void_p()
        r = _lib_.solar_next_batch(self._handle, ctypes.byref(out))
        if r < 0:
            raise SolarError(f"solar: {_lib.last_error()}")
        if r == 0:
            return None
        self._taken += 1
        self._held = self._make_batch(out.value)
        return self._held

    def _make_batch(self, handle):
        return Batch(self, handle)

    def __len__(self):
        """Batches per epoch."""
        return self.steps_per_epoch

    @property
    def epoch(self):
        """The epoch the next iteration covers."""
        return self._next_epoch

    def set_epoch(self, epoch):
        """Says which epoch the next iteration covers. Epochs run forward: a later epoch skips
        the batches in between (they are taken and released unread); an earlier one raises."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
            raise TypeError(f"solar.Loader.set_epoch: epoch must be an int, not "
                            f"{type(epoch).__name__}")
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"solar.Loader.set_epoch: epoch {epoch} is outside the plan's "
                             f"0..{self.epochs - 1}")
        if epoch * self.steps_per_epoch < self._taken:
            current = (self._taken - 1) // self.steps_per_epoch
            raise ValueError(f"solar.Loader.set_epoch: epoch {epoch} has already been served "
                             f"(the loader has reached epoch {current}); solar plans the whole "
                             "run ahead, so epochs run forward only: open a new loader to "
                             "restart")
        self._next_epoch = int(epoch)

    def __iter__(self):
        """Yields the batches of epoch `self.epoch`, then moves on to the next epoch."""
        self._need_open()
        if self._next_epoch >= self.epochs:
            raise SolarError(f"solar.Loader: all {self.epochs} epochs of the plan are done")
        epoch = self._next_epoch
        first = epoch * self.steps_per_epoch
        end = first + self.steps_per_epoch
        if self._taken > first:
            raise SolarError(f"solar.Loader: epoch {epoch} was already started; call "
                             "set_epoch with a later epoch")
        skipped = first - self._taken
        if skipped:
            warnings.warn(f"solar: skipping {skipped} batches to reach epoch {epoch}",
                          stacklevel=2)
        while self._taken < first:
            if self.next_batch() is None:
                break
        self._next_epoch = epoch + 1
        b = None
        try:
            while self._taken < end:
                b = self.next_batch()
                if b is None:
                    break
                yield b
        finally:
            # Only this iteration's own batch: a late close must not release a newer one.
            if b is not None and self._held is b:
                self._release(b)
