# SPDX-License-Identifier: Apache-2.0
"""ctypes binding of libsolar (client/include/solar/solar.h). Internal: use solar.Loader."""
import ctypes
import os
import shutil

_SEARCHED = []


def _candidates():
    """Where libsolar.so may be, most specific first."""
    env = os.environ.get("SOLAR_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libsolar.so")  # beside the package (the wheel)
    try:  # cmake --install / the Debian package: <libdir>/libsolar.so.0, relative to here
        from ._installed import LIBSOLAR
        yield os.path.normpath(os.path.join(here, LIBSOLAR))
    except ImportError:
        pass
    # Beside the `solar` tool: <build>/cli/solar -> <build>/client/libsolar.so, or
    # <prefix>/bin/solar -> <prefix>/lib/libsolar.so.
    tool = os.environ.get("SOLAR_BIN") or shutil.which("solar")
    if tool:
        d = os.path.dirname(os.path.realpath(tool))
        yield os.path.join(d, "..", "client", "libsolar.so")
        yield os.path.join(d, "..", "lib", "libsolar.so")
    # A source checkout: python/solar -> <repo>/build*/client/libsolar.so.
    repo = os.path.dirname(os.path.dirname(here))
    for b in ("build", "build-py", "build-full"):
        yield os.path.join(repo, b, "client", "libsolar.so")
    yield "libsolar.so.0"  # the dynamic linker's search path (LD_LIBRARY_PATH, ldconfig)
    yield "libsolar.so"


def _load():
    """Loading libsolar runs no other library's constructors that matter: it links no MPI, HDF5,
    libfabric or CUDA (test client.lean). The direct path's HDF5 and libfabric (whose psm
    provider's libinfinipath installs handlers for SIGINT, SIGTERM, SIGSEGV, ... that exit(1))
    come in libsolar-direct.so, which libsolar opens on a rank's first read without an agent
    and around which it puts every signal disposition back itself (Python's handlers,
    faulthandler's, any other), so this package has nothing to save or restore."""
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append(f"{path}: not there")
            continue
        try:
            return ctypes.CDLL(path), os.path.abspath(path) if os.sep in path else path
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("solar: cannot load libsolar.so; install the wheel that carries it "
                      "(cmake --build build --target python_wheel), or build it (target "
                      "solar_client) and set SOLAR_LIBRARY=/path/to/libsolar.so. Tried:\n  "
                      + "\n  ".join(errors))


lib, path = _load()

_p = ctypes.c_void_p
_SIGS = {
    "solar_open_env": ([], _p),
    "solar_close": ([_p], None),
    "solar_last_error": ([], ctypes.c_char_p),
    "solar_using_agent": ([_p], ctypes.c_int),
    "solar_epochs": ([_p], ctypes.c_uint32),
    "solar_steps_per_epoch": ([_p], ctypes.c_uint32),
    "solar_sample_bytes": ([_p], ctypes.c_uint64),
    "solar_sample_sizes_differ": ([_p], ctypes.c_int),
    "solar_label_bytes": ([_p], ctypes.c_uint64),
    "solar_dataset_samples": ([_p], ctypes.c_uint64),
    "solar_sample_shape": ([_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_int], ctypes.c_int),
    "solar_sample_dtype": ([_p], ctypes.c_char_p),
    "solar_label_dtype": ([_p], ctypes.c_char_p),
    "solar_rank": ([_p], ctypes.c_uint32),
    "solar_world_size": ([_p], ctypes.c_uint32),
    "solar_batch_per_rank": ([_p], ctypes.c_uint32),
    "solar_plan_fingerprint": ([_p], ctypes.c_uint64),
    "solar_position": ([_p], ctypes.c_uint64),
    "solar_skip_to": ([_p, ctypes.c_uint64], ctypes.c_int),
    "solar_next_batch": ([_p, ctypes.POINTER(_p)], ctypes.c_int),
    "solar_release": ([_p, _p], ctypes.c_int),
    "solar_batch_size": ([_p], ctypes.c_size_t),
    "solar_batch_step": ([_p], ctypes.c_uint64),
    "solar_batch_epoch": ([_p], ctypes.c_uint32),
    "solar_batch_index": ([_p, ctypes.c_size_t], ctypes.c_uint64),
    "solar_batch_sample": ([_p, ctypes.c_size_t], _p),
    "solar_batch_sample_bytes": ([_p, ctypes.c_size_t], ctypes.c_uint64),
    "solar_batch_bytes": ([_p], ctypes.c_uint64),
    "solar_batch_label": ([_p, ctypes.c_size_t], _p),
    "solar_batch_mean_size": ([_p], ctypes.c_double),
    "solar_batch_gather": ([_p, _p, ctypes.c_size_t, _p, ctypes.c_size_t], ctypes.c_int),
}

for _name, (_args, _res) in _SIGS.items():
    try:
        _f = getattr(lib, _name)
    except AttributeError:
        raise ImportError(f"solar: {path} has no {_name}: it is older than this package")
    _f.argtypes = _args
    _f.restype = _res


def last_error():
    msg = lib.solar_last_error()
    return msg.decode("utf-8", "replace") if msg else ""
