#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Writes a dataset with h5py the way users do, with solar gen's content (include/solar/storage/
content.h, re-implemented in numpy) so solar's readers can check every byte.

  make_h5py_dataset.py OUT.h5 --samples N [--shape 4,8,8,8] [--dtype int16]
                       [--layout contiguous|chunked|gzip] [--seed S] [--no-attrs]
  make_h5py_dataset.py OUT.h5 --scalar      # a rank-0 dataset /data (must be refused)
Must run under /usr/bin/python3 (Debian's h5py/numpy)."""
import argparse

import h5py
import numpy as np

G = np.uint64(0x9E3779B97F4A7C15)


def mix(z):
    z = np.asarray(z, dtype=np.uint64)
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _base(seed, index):
    key = mix(np.uint64(seed) ^ np.uint64(0x5EED5EED5EED5EED))
    return mix(key + np.uint64(index) * G)


def sample_bytes(seed, index, nbytes, content="random"):
    """(bytes, int32 label) of sample `index`; content "sparse": each byte r of the random
    content becomes r < 192 ? 0 : 1 + (r & 3)."""
    base = _base(seed, index)
    words = (nbytes + 7) // 8
    k = np.arange(1, words + 1, dtype=np.uint64)
    w = mix(base + k * G).astype("<u8")
    if content == "sparse":
        r = w.view(np.uint8)
        w = np.where(r < 192, 0, 1 + (r & 3)).astype(np.uint8)
    return w.tobytes()[:nbytes], int(np.int32(mix(base) >> np.uint64(33)))


def label_bytes(seed, index, dtype, nbytes):
    """Sample `index`'s label as `nbytes` bytes of `dtype` (content.h's fill_label): element k
    from r_k = mix(base ^ k*G); integers r_k >> 33 modulo 2^bits, float32 (r_k >> 40) * 2^-24,
    float64 (r_k >> 11) * 2^-53, little-endian."""
    dt = np.dtype(dtype).newbyteorder("<")
    n = (nbytes + dt.itemsize - 1) // dt.itemsize
    with np.errstate(over="ignore"):
        r = mix(_base(seed, index) ^ (np.arange(n, dtype=np.uint64) * G))
    if dt.kind == "f" and dt.itemsize == 4:
        v = (r >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)
    elif dt.kind == "f":
        v = (r >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    else:
        v = r >> np.uint64(33)
    return v.astype(dt).tobytes()[:nbytes]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--shape", default="4,8,8,8")
    ap.add_argument("--dtype", default="int16")
    ap.add_argument("--layout", default="contiguous", choices=["contiguous", "chunked", "gzip"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-attrs", action="store_true")
    ap.add_argument("--scalar", action="store_true")
    a = ap.parse_args()
    np.seterr(over="ignore")
    with np.errstate(over="ignore"), h5py.File(a.out, "w") as f:
        if a.scalar:
            f.create_dataset("data", data=np.int16(3))
            return
        shape = tuple(int(x) for x in a.shape.split(","))
        dt = np.dtype(a.dtype).newbyteorder("<")
        nbytes = dt.itemsize * int(np.prod(shape))
        data = np.empty((a.samples,) + shape, dtype=dt)
        labels = np.empty(a.samples, dtype="<i4")
        for i in range(a.samples):
            raw, label = sample_bytes(a.seed, i, nbytes)
            data[i] = np.frombuffer(raw, dtype=dt).reshape(shape)
            labels[i] = label
        kw = {}
        if a.layout != "contiguous":
            kw["chunks"] = (1,) + shape
        if a.layout == "gzip":
            kw["compression"] = "gzip"
        d = f.create_dataset("data", data=data, **kw)
        f.create_dataset("label", data=labels)
        if not a.no_attrs:
            d.attrs["solar_generator"] = "solar-splitmix64-v1"  # h5py: variable-length string
            d.attrs["solar_seed"] = np.uint64(a.seed)


if __name__ == "__main__":
    main()
