# SPDX-License-Identifier: Apache-2.0
"""packaging/spack/package.py as Spack reads it, without Spack (not installed here): the recipe
is loaded against a small stand-in of `spack.package` (CMakePackage, define, variants,
depends_on) and checked against the project itself: every -D it passes is a variable the
project reads, the run environment names the folders those variables install to, the CMake it
asks for is the one CMakeLists.txt requires, and HDF5 without MPI. What it installs into a
prefix, and a job run with only the module's environment, is test_module.py's."""
import os
import re
import sys
import types

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RECIPE = os.path.join(ROOT, "packaging", "spack", "package.py")


class Spec:
    def __init__(self, **variants):
        self.variants = variants

    def __contains__(self, text):
        sign, name = text[0], text[1:]
        return self.variants.get(name) == (sign == "+")


def load_recipe():
    calls = {"depends_on": [], "variant": [], "version": [], "license": []}
    fake = types.ModuleType("spack.package")

    class CMakePackage:
        def __init__(self, spec, prefix):
            self.spec, self.prefix = spec, prefix

        def define(self, name, value):
            kind = "BOOL" if isinstance(value, bool) else "STRING"
            value = ("ON" if value else "OFF") if isinstance(value, bool) else value
            return f"-D{name}:{kind}={value}"

        def define_from_variant(self, name, variant):
            assert variant in [v[0] for v in calls["variant"]], f"no variant {variant}"
            return self.define(name, f"+{variant}" in self.spec)

    fake.CMakePackage = CMakePackage
    fake.join_path = os.path.join
    for what in calls:
        fake.__dict__[what] = (lambda w: lambda *a, **k: calls[w].append((a[0] if a else None, k)))(what)
    fake.__all__ = ["CMakePackage", "join_path", *calls]
    sys.modules["spack"] = types.ModuleType("spack")
    sys.modules["spack.package"] = fake
    try:
        namespace = {}
        exec(compile(open(RECIPE).read(), RECIPE, "exec"), namespace)
    finally:
        del sys.modules["spack.package"], sys.modules["spack"]
    return namespace["Solar"], calls


class Env:
    def __init__(self):
        self.sets, self.paths = {}, {}

    def set(self, name, value):
        self.sets[name] = str(value)

    def prepend_path(self, name, value):
        self.paths.setdefault(name, []).insert(0, str(value))


def cmake_text():
    text = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in (".git", "build")]  # not descended into
        for f in files:
            if f == "CMakeLists.txt" or f.endswith(".cmake"):
                text.append(open(os.path.join(folder, f)).read())
    return "\n".join(text)


@pytest.mark.parametrize("python,cuda", [(True, False), (False, True)])
def test_the_recipes_cmake_arguments_are_the_projects(python, cuda):
    Solar, calls = load_recipe()
    pkg = Solar(Spec(python=python, cuda=cuda, slurm=True), "/opt/spack/solar")
    args = pkg.cmake_args()
    defined = dict(re.match(r"-D(\w+):\w+=(.*)", a).groups() for a in args)
    project = cmake_text()
    for name in defined:
        if name.startswith("CMAKE_"):
            continue
        assert re.search(rf"\b{name}\b", project), f"the recipe sets {name}, which no CMake file reads"
    assert defined["SOLAR_BUILD_TESTS"] == "OFF" and defined["CMAKE_INSTALL_LIBDIR"] == "lib"
    assert defined["SOLAR_WITH_CUDA"] == ("ON" if cuda else "OFF")
    assert ("SOLAR_PYTHON_DIR" in defined) == python

    env = Env()
    pkg.setup_run_environment(env)
    plugin = env.sets["SOLAR_SPANK_PLUGIN"]
    assert plugin == os.path.join("/opt/spack/solar", defined["SOLAR_SLURM_PLUGIN_DIR"],
                                  "solar_spank.so")
    if python:
        assert env.paths["PYTHONPATH"] == [os.path.join("/opt/spack/solar",
                                                        defined["SOLAR_PYTHON_DIR"])]


def test_the_recipes_dependencies_match_the_build():
    _, calls = load_recipe()
    deps = [d for d, _ in calls["depends_on"]]
    cmake = [d for d in deps if d.startswith("cmake@")]
    need = re.search(r"cmake_minimum_required\(VERSION ([\d.]+)\)",
                     open(os.path.join(ROOT, "CMakeLists.txt")).read()).group(1)
    assert cmake == [f"cmake@{need}:"], (cmake, need)
    assert "hdf5~mpi" in deps and "libfabric" in deps, deps
    assert not [d for d in deps if "mpi" in d and d != "hdf5~mpi"], deps
    assert {v for v, _ in calls["variant"]} == {"cuda", "python", "slurm"}
    assert calls["license"] and calls["license"][0][0] == "Apache-2.0"
