#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""A rank program for test_layout.py: constructs solar.torch.Loader (or solar.Loader) and writes
what it says a sample is, and whether h5py was imported on the way, to OUT (JSON).

  layout_probe.py OUT [--library LIBSOLAR] [--numpy]"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--library")
    ap.add_argument("--numpy", action="store_true", help="solar.Loader, not solar.torch.Loader")
    a = ap.parse_args()
    if a.library:
        os.environ["SOLAR_LIBRARY"] = a.library
    if a.numpy:
        import solar
        loader = solar.Loader()
    else:
        import solar.torch
        loader = solar.torch.Loader()
    h5py_loaded = "h5py" in sys.modules
    with loader:
        batch = loader.next_batch()
        data, labels = batch
        out = {"using_agent": loader.using_agent, "h5py_loaded": h5py_loaded,
               "shape": list(loader.shape), "dtype": str(loader.dtype),
               "label_dtype": str(loader.label_dtype),
               "label_stored": str(loader._label_stored),
               "batch_shape": list(data.shape), "batch_dtype": str(data.dtype).replace("torch.", ""),
               "labels_dtype": str(labels.dtype).replace("torch.", ""),
               "indices": [int(i) for i in batch.indices]}
        import numpy as np
        out["first"] = np.asarray(data[0]).ravel()[:4].tolist()
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
