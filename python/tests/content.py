# SPDX-License-Identifier: Apache-2.0
"""solar gen's sample content, from the numpy implementation in tests/storage."""
import importlib.util
import os

import numpy as np

_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "storage",
                     "make_h5py_dataset.py")
_spec = importlib.util.spec_from_file_location("make_h5py_dataset", _path)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)


def expected(seed, index, nbytes):
    """(bytes, label) of sample `index` of a dataset solar gen wrote with `seed`."""
    with np.errstate(over="ignore"):
        return _mod.sample_bytes(seed, index, nbytes)
