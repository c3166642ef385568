# SPDX-License-Identifier: Apache-2.0
"""solar.Loader: a rank's batches from libsolar as numpy arrays.

A loader is one pass over the planned run, epoch after epoch, as the plan orders them. Iterating
it yields the batches of one epoch (like a DataLoader); `set_epoch(e)` says which epoch comes
next; `state_dict()` / `load_state_dict()` resume mid-epoch. Each Batch unpacks as
`data, labels = batch`: copies made when the batch is taken, valid as long as they are kept. Its
zero-copy views (`sample(i)`, `views()`) point into the node agent's shared buffer (or the
loader's own memory when it reads directly) and are valid until the batch is released (when the
next batch is taken, by `release()`, or when the loader closes); after that they raise
`BatchReleasedError`.
"""
from __future__ import annotations

import ctypes
import os
import threading
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import numpy as np

from . import _lib
# Re-exported: every name solar.loader had before batch.py, dataset.py and errors.py split off.
from .batch import Batch, _ArrayPool, _Lease  # noqa: F401
from .dataset import (DatasetInfo, _label_shape, _resolve_label_dtypes,  # noqa: F401
                      dataset_layout, library_layout, parse_dataset_spec, split_dataset_spec)
from .errors import BatchReleasedError, SolarError  # noqa: F401

_lib_ = _lib.lib
_ENV_LOCK = threading.Lock()


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


# DataLoader arguments and what solar does with them (solar.Loader(**kw) refuses the others
# with the flag that sets the same thing; those here are accepted).
#   batch_size: checked against the plan's batch per rank
#   shuffle: True is what the plan does (False has no solar equivalent)
#   num_workers, prefetch_factor, persistent_workers, timeout: nothing to do (the node agent
#     reads ahead; batches are gathered in this process), accepted and ignored
_REFUSED = {
    "sampler": "the plan assigns samples to ranks (solar run --order torch|solar, --seed; srun "
               "--solar-order, --solar-seed); loader.sampler.set_epoch(e) works as with a "
               "DistributedSampler",
    "batch_sampler": "the plan makes the batches (solar run --batch, srun --solar-batch)",
    "collate_fn": "batches come gathered as one array; pass transform=fn(data, labels) to "
                  "change them",
    "drop_last": "the plan decides the tail (solar run --drop-last, srun --solar-drop-last)",
    "worker_init_fn": "solar has no worker processes: do that set-up in this process",
    "multiprocessing_context": "solar has no worker processes",
    "generator": "the plan's order comes from its seed (solar run --seed, srun --solar-seed)",
    "pin_memory_device": "use solar.torch.Loader(pin_memory=True, device=...)",
}
_IGNORED = ("num_workers", "prefetch_factor", "persistent_workers", "timeout")


_STATE_FORMAT = "solar.Loader/1"
# The state dict's fields that must match the loader's (with the loader attribute they hold).
_STATE_CHECKED = (("world_size", "world size"), ("epochs", "epochs"),
                  ("steps_per_epoch", "steps per epoch"), ("samples", "dataset samples"),
                  ("batch_size", "per-rank batch size"))


class Loader:
    """This rank's batches, from the SOLAR_* environment or explicit arguments.

    Arguments override the environment variable of the same meaning: plan (SOLAR_PLAN), node
    (SOLAR_NODE), local_rank (SOLAR_LOCAL_RANK / LOCAL_RANK), dataset (SOLAR_DATASET),
    labels (SOLAR_LABELS, '' for none), socket (SOLAR_SOCKET; '' reads directly). A process on
    its own (no launcher) is node 0, local rank 0 unless told otherwise.
    shape/dtype: how to view a sample's bytes (default: what libsolar says the dataset holds;
    the HDF5 file through h5py only when it does not know).
    label_dtype: the type `labels` come as (default int64 for integer labels, like the class
    indices torch's losses take; floating-point labels keep their type).
    transform: called as `transform(data, labels)` once per batch, returns the (data, labels)
    that `batch.data`, `batch.labels` and `x, y = batch` give.
    zero_copy: False (default): each batch's data and labels are copied when it is taken and stay
    valid as long as they are kept. True: copied on first use only, which must come before the
    next batch is taken; use `batch.views()` to read samples without any copy.
    """

    def __init__(self, *, plan: Optional[Union[str, os.PathLike]] = None,
                 node: Optional[int] = None, local_rank: Optional[int] = None,
                 dataset: Optional[Union[str, os.PathLike]] = None,
                 labels: Optional[str] = None, socket: Optional[str] = None,
                 shape: Optional[Sequence[int]] = None, dtype: Any = None,
                 label_dtype: Any = None,
                 transform: Optional[Callable[[Any, Any], tuple]] = None,
                 zero_copy: bool = False, batch_size: Optional[int] = None,
                 shuffle: Optional[bool] = None, **dataloader_kw: Any) -> None:
        self._handle = None
        self._open_epoch = None  # an epoch whose iteration stopped before its end
        self._epoch_set = False  # set_epoch was called since the last iteration began
        for k in dataloader_kw:
            if k in _REFUSED:
                raise TypeError(f"solar.Loader: {k}= is not taken: {_REFUSED[k]}")
            if k not in _IGNORED:
                raise TypeError(f"solar.Loader: unexpected argument {k}= (see "
                                f"help(solar.Loader))")
        if shuffle is False:
            raise ValueError("solar.Loader: shuffle=False: the plan's batches are always "
                             "shuffled (by its --seed); solar has no unshuffled order")
        if dataset is not None and not isinstance(dataset, (str, os.PathLike)):
            raise TypeError(f"solar.Loader: dataset= is the dataset's path (FILE.h5[:/name], a "
                            f"directory, glob or @LIST of files, as solar run --dataset), not a "
                            f"{type(dataset).__name__}: solar reads the files itself, not "
                            "through a Dataset object")
        self._agent = False
        self._held = None
        self._taken = 0          # the global step of the next batch (= batches taken/skipped)
        self._next_epoch = 0     # the epoch the next iteration covers
        self._resume_at = None   # the step load_state_dict moved to, until a batch is taken
        if transform is not None and not callable(transform):
            raise TypeError(f"solar.Loader: transform must be callable, not "
                            f"{type(transform).__name__}")
        self.transform = transform
        self.zero_copy = bool(zero_copy)
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
            for var, arg in (("SOLAR_PLAN", "plan"), ("SOLAR_DATASET", "dataset")):
                if err.startswith(f"{var} is not set"):
                    err += f" (or pass {arg}= to solar.Loader)"
            raise SolarError(f"solar.Loader: {err}")
        self._handle = handle
        h = handle
        self._agent = bool(_lib_.solar_using_agent(h))
        self.epochs = int(_lib_.solar_epochs(h))
        self.steps_per_epoch = int(_lib_.solar_steps_per_epoch(h))
        self.sample_bytes = int(_lib_.solar_sample_bytes(h))
        # Whole files (`*.npz`, `*.jpg`, ...): each sample is its file's bytes, as uint8, of its
        # own length (sample_bytes: the largest); the transform decodes them.
        self.sizes_differ = bool(_lib_.solar_sample_sizes_differ(h))
        self.label_bytes = int(_lib_.solar_label_bytes(h))
        self.samples = int(_lib_.solar_dataset_samples(h))
        self.rank = int(_lib_.solar_rank(h))
        self.world_size = int(_lib_.solar_world_size(h))
        self.batch_size = int(_lib_.solar_batch_per_rank(h))
        self.plan_fingerprint = f"{_lib_.solar_plan_fingerprint(h):016x}"
        # A resumed launch (solar run --start-step, srun --solar-start-step) starts the loader
        # and its agent at a later step: iteration continues that step's epoch from there.
        self.start_step = int(_lib_.solar_position(h))
        if self.start_step:
            self._taken = self.start_step
            self._resume_at = self.start_step
            self._next_epoch = min(self.start_step // self.steps_per_epoch, self.epochs) \
                if self.steps_per_epoch else 0

        try:
            f_shape, f_dtype, f_ldtype = library_layout(h, bool(self.label_bytes))
            in_file = None  # the HDF5 file's layout, read only when libsolar's falls short
            if f_shape is None or f_dtype is None or (self.label_bytes and f_ldtype is None):
                in_file = dataset_layout(self.dataset_spec, labels_name)
                f_shape = f_shape if f_shape is not None else in_file.shape
                f_dtype = f_dtype if f_dtype is not None else in_file.dtype
                f_ldtype = f_ldtype if f_ldtype is not None else in_file.label_dtype
            self.dtype = np.dtype(dtype if dtype is not None else (f_dtype if f_dtype is not None else np.uint8))
            if shape is None:
                shape = f_shape if f_shape is not None and dtype is None else \
                    (self.sample_bytes // self.dtype.itemsize,)
            self.shape = tuple(int(s) for s in shape)
            if int(np.prod(self.shape)) * self.dtype.itemsize != self.sample_bytes:
                raise ValueError(f"solar.Loader: shape {self.shape} of {self.dtype} is "
                                 f"{int(np.prod(self.shape)) * self.dtype.itemsize} bytes, a "
                                 f"sample is {self.sample_bytes}")
            self._label_stored, self.label_dtype = _resolve_label_dtypes(
                f_ldtype, self.label_bytes, label_dtype)
            self.label_shape = ()
            if self.label_bytes and self.label_bytes > self._label_stored.itemsize:
                # Labels of several elements (a many-file dataset's whole labels array per
                # file): libsolar knows their bytes, not their shape.
                if in_file is None:
                    in_file = dataset_layout(self.dataset_spec, labels_name)
                self.label_shape = _label_shape(self.label_bytes, self._label_stored,
                                                in_file.label_shape)
        except Exception:
            self.close()
            raise
        if batch_size is not None and batch_size != self.batch_size:
            self.close()
            raise ValueError(f"solar.Loader: batch_size={batch_size}, but the plan's batch per "
                             f"rank is {self.batch_size}: the plan sets it (solar run --batch, "
                             "srun --solar-batch); drop batch_size= or plan again")
        self._pool = _ArrayPool(1, self.shape, self.dtype)
        self.dataset = DatasetInfo(self.dataset_spec, labels_name if self.label_bytes else None,
                                   self.samples, self.shape, self.dtype)

    @property
    def using_agent(self):
        """True while batches come from the node agent; False when read directly (no agent, or
        the agent went away and the loader continued on its own, saying so on stderr)."""
        if self._handle:
            self._agent = bool(_lib_.solar_using_agent(self._handle))
        return self._agent

    def __repr__(self):
        return (f"<solar.Loader rank {self.rank}/{self.world_size} {self.dataset_spec} "
                f"batch_size={self.batch_size} epochs={self.epochs} step={self._taken}>")

    # --- lifetime -------------------------------------------------------------------------
    def close(self):
        """Releases the held batch and closes the loader. Idempotent."""
        if self._handle:
            if self._held is not None:
                self._held.released = True
                self._held._why = "released when the loader was closed"
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
    def _release(self, batch, why):
        if batch is not self._held:
            raise SolarError("solar: this batch does not belong to this loader's current step")
        self._held = None
        batch.released = True
        batch._why = why
        if _lib_.solar_release(self._handle, batch._handle) != 0:
            raise SolarError(f"solar: {_lib.last_error()}")

    def next_batch(self):
        """Releases the batch held, takes the next one of the run; None when the run is done."""
        self._need_open()
        if self._held is not None:
            self._release(self._held, f"released when the next batch (step {self._taken}) was "
                                      "taken")
        out = ctypes.c_void_p()
        r = _lib_.solar_next_batch(self._handle, ctypes.byref(out))
        if r < 0:
            raise SolarError(f"solar: {_lib.last_error()}")
        if r == 0:
            return None
        self._taken += 1
        self._resume_at = None
        b = self._held = self._make_batch(out.value)
        if not self.zero_copy:
            b._materialize("data")
        return b

    def _make_batch(self, handle):
        return Batch(self, handle)

    def _skip_to(self, step, why):
        """Moves so that the next batch is global step `step` (forward only)."""
        if self._held is not None:
            self._release(self._held, why)
        if _lib_.solar_skip_to(self._handle, step) != 0:
            raise SolarError(f"solar: {_lib.last_error()}")
        self._taken = int(step)

    def __len__(self) -> int:
        """Batches per epoch."""
        return self.steps_per_epoch

    @property
    def sampler(self) -> "EpochSampler":
        """A stand-in for DistributedSampler: `loader.sampler.set_epoch(e)` is
        `loader.set_epoch(e)`; len() is this rank's samples per epoch."""
        return EpochSampler(self)

    def _peeked(self, epoch):
        """True when only the epoch's first batch was taken and it is still held: an iteration
        of that epoch starts with it again, as a DataLoader's would (same order)."""
        first = epoch * self.steps_per_epoch
        h = self._held
        return (self._taken == first + 1 and h is not None and not h.released
                and h.step == first)

    @property
    def epoch(self):
        """The epoch the next iteration covers."""
        return self._next_epoch

    def _resuming(self, epoch):
        """True when load_state_dict left the loader inside (or at the end of) `epoch`."""
        first = epoch * self.steps_per_epoch
        return (self._resume_at is not None and self._taken == self._resume_at
                and first < self._taken <= first + self.steps_per_epoch)

    def set_epoch(self, epoch):
        """Says which epoch the next iteration covers. Epochs run forward: a later epoch skips
        the batches in between (without reading them when there is no agent); an earlier one
        raises. After load_state_dict, the epoch of the saved step continues where it was."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
            raise TypeError(f"solar.Loader.set_epoch: epoch must be an int, not "
                            f"{type(epoch).__name__}")
        if not 0 <= epoch < self.epochs:
            raise ValueError(f"solar.Loader.set_epoch: epoch {epoch} is outside the plan's "
                             f"0..{self.epochs - 1}")
        if epoch * self.steps_per_epoch < self._taken and not self._resuming(epoch) \
                and not self._peeked(epoch):
            current = (self._taken - 1) // self.steps_per_epoch
            raise ValueError(f"solar.Loader.set_epoch: epoch {epoch} has already been served "
                             f"(the loader has reached epoch {current}, next step "
                             f"{self._taken}); solar plans the whole run ahead, so epochs run "
                             "forward only: open a new loader to restart")
        self._next_epoch = int(epoch)
        self._epoch_set = True

    def __iter__(self) -> Iterator["Batch"]:
        """Yields the batches of epoch `self.epoch`, then moves on to the next epoch. Each batch
        stays held until the next one is taken (so `b = next(iter(loader))` is usable). After
        such a peek, iterating that epoch again starts with the peeked batch, as a DataLoader
        does. An iteration left before the epoch's end is not silently skipped: iterating again
        raises, unless set_epoch said which epoch comes next."""
        self._need_open()
        if self._open_epoch is not None and not self._epoch_set:
            left = self._open_epoch
            if self._peeked(left):
                self._next_epoch = left
            else:
                done = self._taken - left * self.steps_per_epoch
                raise SolarError(
                    f"solar.Loader: the iteration of epoch {left} stopped after {done} of "
                    f"{self.steps_per_epoch} batches, and each step is served once; finish it "
                    f"(iterate on the same iterator), or call set_epoch({left + 1}) to skip "
                    "the rest of it")
        self._epoch_set = False
        if self._next_epoch >= self.epochs:
            raise SolarError(f"solar.Loader: all {self.epochs} epochs of the plan are done")
        epoch = self._next_epoch
        first = epoch * self.steps_per_epoch
        end = first + self.steps_per_epoch
        replay = self._peeked(epoch)
        if self._taken > first and not self._resuming(epoch) and not replay:
            raise SolarError(f"solar.Loader: epoch {epoch} was already started (its step "
                             f"{self._taken - 1} was taken by an earlier iteration, e.g. "
                             "next(iter(loader))); each step is served once, so iterate on "
                             "with set_epoch(a later epoch), or open a new loader to start over")
        if self._taken < first:
            warnings.warn(f"solar: skipping {first - self._taken} batches to reach epoch "
                          f"{epoch}", stacklevel=2)
            self._skip_to(first, f"released when the loader skipped to epoch {epoch}")
        self._next_epoch = epoch + 1
        self._resume_at = None
        self._open_epoch = epoch
        if replay:
            yield self._held
        while self._taken < end:
            b = self.next_batch()
            if b is None:
                break
            yield b
        if self._open_epoch == epoch:
            self._open_epoch = None

    # --- checkpoints ------------------------------------------------------------------------
    def state_dict(self):
        """Where the loader is, for a checkpoint: a dict of plain ints and strings (torch.save,
        json). `step` is the global step the next batch will be (a batch being used counts as
        done); the other fields identify the plan and are checked by load_state_dict."""
        step = self._taken
        return {
            "format": _STATE_FORMAT,
            "step": step,
            "epoch": min(step // self.steps_per_epoch, self.epochs) if self.steps_per_epoch
            else 0,
            "rank": self.rank,
            "world_size": self.world_size,
            "epochs": self.epochs,
            "steps_per_epoch": self.steps_per_epoch,
            "samples": self.samples,
            "batch_size": self.batch_size,
            "plan": self.plan_fingerprint,
        }

    def load_state_dict(self, state, strict=True):
        """Continues from a state_dict(): the next batch is the saved step's, mid-epoch
        included, and every batch from there is the one the uninterrupted run would have had.
        Call it on a new loader, before taking batches; then iterate as usual (set_epoch(e)
        with the saved epoch continues it). The plan must be the same (world size, epochs,
        steps per epoch, dataset samples, batch size, and the plan's fingerprint: seed, order,
        policy, buffer); strict=False accepts another plan with a warning, as long as the step
        is in it. A state from any rank of the run fits every rank (all ranks are at the same
        step in data-parallel training). Without an agent nothing is read to get there; with
        one, the steps before are taken and released (the agent runs its plan in order),
        unless the job was launched at the state's step (`solar run --resume-from STATE.json`
        or `--start-step`, `srun --solar-start-step`): then the agent starts there and this is
        a cursor move."""
        self._need_open()
        if not isinstance(state, dict):
            raise TypeError(f"solar.Loader.load_state_dict: expected a dict from state_dict(), "
                            f"not {type(state).__name__}")
        if state.get("format") != _STATE_FORMAT or "step" not in state:
            raise ValueError(f"solar.Loader.load_state_dict: not a solar.Loader state "
                             f"(format {state.get('format')!r}, expected {_STATE_FORMAT!r})")
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"solar.Loader.load_state_dict: step {step!r} is not a step")
        mismatches = [f"{what} {state.get(key)!r} in the state, {getattr(self, key)!r} here"
                      for key, what in _STATE_CHECKED if state.get(key) != getattr(self, key)]
        if state.get("plan") != self.plan_fingerprint:
            mismatches.append(f"plan fingerprint {state.get('plan')!r} in the state, "
                              f"{self.plan_fingerprint!r} here (another seed, order, policy, "
                              "buffer or node layout)")
        if mismatches:
            msg = ("solar.Loader.load_state_dict: the state was saved with another plan ("
                   + "; ".join(mismatches) + f") than {self.plan_path}")
            if strict:
                raise ValueError(msg + "; its batches would not be the saved run's (pass "
                                 "strict=False to continue at its step anyway)")
            warnings.warn(msg + "; continuing at its step with this plan's batches",
                          stacklevel=2)
        total = self.epochs * self.steps_per_epoch
        if step > total:
            raise ValueError(f"solar.Loader.load_state_dict: step {step} is beyond the end of "
                             f"the plan ({total} steps: {self.epochs} epochs of "
                             f"{self.steps_per_epoch})")
        if step < self.start_step:
            raise ValueError(f"solar.Loader.load_state_dict: the state's step {step} is before "
                             f"step {self.start_step}, where this job was launched (solar run "
                             "--start-step / srun --solar-start-step, or the agent's start): "
                             f"launch it at step {step} to resume from this state")
        if step < self._taken:
            raise ValueError(f"solar.Loader.load_state_dict: this loader is already at step "
                             f"{self._taken}, past the state's step {step}; load the state "
                             "into a new loader")
        self._skip_to(int(step), f"released when the loader moved to step {step} "
                                 "(load_state_dict)")
        self._resume_at = self._taken
        self._next_epoch = min(self._taken // self.steps_per_epoch, self.epochs)


class EpochSampler:
    """`loader.sampler`: what a training loop written for DistributedSampler calls on it."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    @property
    def num_replicas(self) -> int:
        return self._loader.world_size

    @property
    def rank(self) -> int:
        return self._loader.rank

    def __len__(self) -> int:
        return self._loader.batch_size * self._loader.steps_per_epoch

    def __iter__(self):
        raise TypeError("solar.Loader's sampler only stands in for set_epoch(); the plan's "
                        "sample indices come with each batch (batch.indices)")
