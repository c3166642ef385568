# SPDX-License-Identifier: Apache-2.0
"""The dynamic part of the wheel build (the static metadata is in pyproject.toml).

A wheel carries libsolar: the library named by SOLAR_LIBRARY (the built target solar_client,
e.g. build/client/libsolar.so), or else the one in this checkout's build/ directory, is copied
into the package as solar/libsolar.so, where the package loads it first, with the module of its
direct path (libsolar-direct.so, from beside it: libsolar opens it from beside itself on a
rank's first read without an agent), and the wheel is a
platform wheel (py3-none-linux_x86_64): it holds a native library for this platform, linked
against this system's libstdc++, libfmt and HDF5. Without a library the build stops and says
so; SOLAR_WHEEL_WITHOUT_LIBRARY=1 builds a pure wheel (py3-none-any) that finds libsolar at run
time (SOLAR_LIBRARY, the `solar` tool on PATH, the linker's path; see README.md).

    SOLAR_LIBRARY=build/client/libsolar.so \\
        python3 -m pip wheel --no-build-isolation --no-deps ./python -w dist/
    cmake --build build --target python_wheel      # the same, into build/python/dist/

Builds offline with the installed setuptools and wheel (--no-build-isolation). setuptools' work
directories go to a temporary directory, not into the source tree.
"""
import atexit
import os
import shutil
import tempfile

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from wheel.bdist_wheel import bdist_wheel
except ImportError:  # building an sdist, or installing without wheel: no tagging to do
    bdist_wheel = None

HERE = os.path.dirname(os.path.abspath(__file__))
WITHOUT = os.environ.get("SOLAR_WHEEL_WITHOUT_LIBRARY", "").lower() in ("1", "yes", "true", "on")


def find_library():
    """The libsolar.so to ship (its real file, not the symlink), or None with WITHOUT set."""
    if WITHOUT:
        return None
    env = os.environ.get("SOLAR_LIBRARY")
    tried = []
    if env:
        if os.path.isfile(env):
            return os.path.realpath(env)
        raise SystemExit(f"solar wheel: SOLAR_LIBRARY={env} is not a file; build the target "
                         "solar_client (cmake --build build --target solar_client) and point "
                         "SOLAR_LIBRARY at build/client/libsolar.so")
    build = os.environ.get("SOLAR_BUILD_DIR") or os.path.join(os.path.dirname(HERE), "build")
    candidate = os.path.join(build, "client", "libsolar.so")
    tried.append(candidate)
    if os.path.isfile(candidate):
        return os.path.realpath(candidate)
    raise SystemExit(
        "solar wheel: no libsolar.so to put in the wheel (tried SOLAR_LIBRARY, unset, and "
        + ", ".join(tried) + "). Build it (cmake --build build --target solar_client) and set "
        "SOLAR_LIBRARY=/path/to/build/client/libsolar.so (or SOLAR_BUILD_DIR=/path/to/build), "
        "or set SOLAR_WHEEL_WITHOUT_LIBRARY=1 for a pure-Python wheel that needs libsolar "
        "installed separately.")


DIRECT_MODULE = "libsolar-direct.so"


class BuildPy(build_py):
    """Copies libsolar.so and libsolar-direct.so into the built package."""

    def run(self):
        super().run()
        lib = find_library()
        if lib:
            module = os.path.join(os.path.dirname(lib), DIRECT_MODULE)
            if not os.path.isfile(module):
                raise SystemExit(f"solar wheel: {module} is missing beside {lib}: libsolar "
                                 "needs it to read without an agent; build the target "
                                 "solar_client (it builds both)")
            for src, name in ((lib, "libsolar.so"), (module, DIRECT_MODULE)):
                dest = os.path.join(self.build_lib, "solar", name)
                self.mkpath(os.path.dirname(dest))
                self.copy_file(src, dest, preserve_mode=True)
                self.announce(f"solar wheel: {src} -> solar/{name}", level=2)


class BinaryDistribution(Distribution):
    """With libsolar inside, the package is platform-specific: installed to platlib, and
    bdist_wheel makes a platform wheel."""

    def has_ext_modules(self):
        return not WITHOUT


cmdclass = {"build_py": BuildPy}

if bdist_wheel is not None:
    class BdistWheel(bdist_wheel):
        """A platform wheel when it carries libsolar; any Python 3 (ctypes, no extension)."""

        def get_tag(self):
            if WITHOUT:
                return super().get_tag()
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    cmdclass["bdist_wheel"] = BdistWheel

# setuptools' build/ and *.egg-info go to a temporary directory, removed at exit: no stale
# library from an earlier build can end up in a later wheel, nothing is left in the checkout.
_work = tempfile.mkdtemp(prefix="solar-wheel-")
atexit.register(shutil.rmtree, _work, ignore_errors=True)

setup(
    distclass=BinaryDistribution,
    cmdclass=cmdclass,
    options={"build": {"build_base": os.path.join(_work, "build")},
             "egg_info": {"egg_base": _work}},
)
