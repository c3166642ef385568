# SPDX-License-Identifier: Apache-2.0
"""solar: a rank's training batches from the solar node agent (or read directly).

    import solar
    loader = solar.Loader()                  # numpy; solar.torch.Loader() for torch tensors
    for epoch in range(loader.epochs):
        loader.set_epoch(epoch)
        for data, labels in loader: ...      # labels: int64
    state = loader.state_dict()              # resume later: new_loader.load_state_dict(state)

See python/README.md.
"""
from .loader import BatchReleasedError, Batch, DatasetInfo, Loader, SolarError  # noqa: F401
from ._lib import path as library_path  # noqa: F401

__version__ = "0.1.0"
__all__ = ["Loader", "Batch", "DatasetInfo", "SolarError", "BatchReleasedError", "library_path"]


def __getattr__(name):
    # `solar.torch` without importing torch for numpy-only users.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'solar' has no attribute {name!r}")
