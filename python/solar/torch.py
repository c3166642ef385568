# SPDX-License-Identifier: Apache-2.0
"""solar.torch.Loader: the same batches as torch tensors, for a DDP training loop.

    loader = solar.torch.Loader()            # instead of DataLoader(..., sampler=DistributedSampler)
    for epoch in range(E):
        loader.set_epoch(epoch)              # instead of sampler.set_epoch(epoch)
        for x, y in loader: ...

Each batch's `data` is one (len, *shape) tensor gathered straight from the shared buffer (one
memcpy per sample, no pickling, no worker processes), optionally into pinned memory and on to
a device. `sample(i)` / `views()` give zero-copy tensors valid until the batch is released.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch as _torch

from . import loader as _loader

SolarError = _loader.SolarError
BatchReleasedError = _loader.BatchReleasedError

# numpy dtypes torch 1.13 can hold.
_TORCH_DTYPES = {np.dtype(k): v for k, v in {
    "bool": _torch.bool, "uint8": _torch.uint8, "int8": _torch.int8, "int16": _torch.int16,
    "int32": _torch.int32, "int64": _torch.int64, "float16": _torch.float16,
    "float32": _torch.float32, "float64": _torch.float64}.items()}

_NUMPY_DTYPES = {v: k for k, v in _TORCH_DTYPES.items()}


def torch_dtype(dt, what):
    t = _TORCH_DTYPES.get(np.dtype(dt).newbyteorder("="))
    if t is None:
        raise TypeError(f"solar.torch.Loader: the {what} dtype {np.dtype(dt)} has no torch "
                        "equivalent; pass dtype=/label_dtype= to view the bytes as another type")
    if np.dtype(dt).byteorder == ">":
        raise TypeError(f"solar.torch.Loader: the {what} dtype {np.dtype(dt)} is big-endian")
    return t


class Batch(_loader.Batch):
    """A batch whose data, labels and views are torch tensors (see solar.Batch)."""

    __slots__ = ()

    def sample(self, i):
        a = super().sample(i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only memory: torch warns
            return _torch.from_numpy(a)

    def _copy_data(self):
        L = self._loader
        if L.sizes_differ:  # whole files: a list of uint8 tensors, each one sample's bytes
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                out = [_torch.from_numpy(a) for a in self._copy_sized()]
            return out if L.device is None else [t.to(L.device) for t in out]
        if L.pin_memory:
            t = _torch.empty((len(self),) + L.shape, dtype=L.torch_dtype, pin_memory=True)
        else:  # pooled memory, recycled once the tensor is dropped
            t = _torch.from_numpy(L._pool.take(len(self)))
        self.gather(t.data_ptr())
        if L.device is not None:
            t = t.to(L.device, non_blocking=L.pin_memory)
        return t

    def _copy_labels(self):
        t = _torch.from_numpy(super()._copy_labels())
        if self._loader.device is not None:
            t = t.to(self._loader.device)
        return t


class Loader(_loader.Loader):
    """solar.Loader yielding torch tensors.

    pin_memory: gather each batch into page-locked memory (ignored with a warning without CUDA,
    like DataLoader). device: move data and labels there (e.g. "cuda:0"); non-blocking when
    pinned. transform(data, labels) gets the tensors after that move. Labels are int64 tensors
    by default (what CrossEntropyLoss takes). dtype/label_dtype may be torch dtypes. Other
    arguments, DataLoader's included (batch_size, shuffle, num_workers, ...): see
    solar.Loader.
    """

    def __init__(self, *, plan: Optional[Union[str, os.PathLike]] = None,
                 node: Optional[int] = None, local_rank: Optional[int] = None,
                 dataset: Optional[Union[str, os.PathLike]] = None,
                 labels: Optional[str] = None, socket: Optional[str] = None,
                 shape: Optional[Sequence[int]] = None,
                 dtype: Union[None, str, np.dtype, _torch.dtype] = None,
                 label_dtype: Union[None, str, np.dtype, _torch.dtype] = None,
                 transform: Optional[Callable[[Any, Any], tuple]] = None,
                 zero_copy: bool = False, pin_memory: bool = False,
                 device: Union[None, str, _torch.device] = None,
                 batch_size: Optional[int] = None, shuffle: Optional[bool] = None,
                 **dataloader_kw: Any) -> None:
        dts = {"dtype": dtype, "label_dtype": label_dtype}
        for k, v in dts.items():  # torch dtypes too (torch.int32 as well as "int32")
            if isinstance(v, _torch.dtype):
                np_dt = _NUMPY_DTYPES.get(v)
                if np_dt is None:
                    raise TypeError(f"solar.torch.Loader: {k}={v} has no numpy equivalent")
                dts[k] = np_dt
        super().__init__(plan=plan, node=node, local_rank=local_rank, dataset=dataset,
                         labels=labels, socket=socket, shape=shape, dtype=dts["dtype"],
                         label_dtype=dts["label_dtype"], transform=transform,
                         zero_copy=zero_copy, batch_size=batch_size, shuffle=shuffle,
                         **dataloader_kw)
        try:
            self.torch_dtype = torch_dtype(self.dtype, "sample")
            if self.label_bytes:
                self.torch_label_dtype = torch_dtype(self.label_dtype, "label")
            self.device = _torch.device(device) if device is not None else None
        except Exception:
            self.close()
            raise
        if pin_memory and not _torch.cuda.is_available():
            warnings.warn("solar.torch.Loader: pin_memory=True but CUDA is not available; "
                          "batches stay in pageable memory", stacklevel=2)
            pin_memory = False
        self.pin_memory = bool(pin_memory)

    def _make_batch(self, handle):
        return Batch(self, handle)
