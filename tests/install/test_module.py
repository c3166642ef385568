# SPDX-License-Identifier: Apache-2.0
"""The environment modules (packaging/modules, installed by cmake --install): an install into a
fresh prefix, then a job run with nothing but the module's environment (PATH, LD_LIBRARY_PATH,
PYTHONPATH, ...): solar run, the example trainer verifying every sample, and the Python
package loading the prefix's libsolar. Lmod and Environment Modules are not installed here: the
modules' lines are applied as those tools apply them (prepend a path, set a variable), with the
prefix found from the file's place as the modules find it."""
import os
import re
import subprocess
import sys

import pytest

BUILD = os.environ.get("SOLAR_BUILD_DIR")
VERSION = os.environ.get("SOLAR_VERSION")
pytestmark = pytest.mark.skipif(not BUILD or not VERSION, reason="run by ctest (package.module)")


def run(*args, env=None, cwd=None):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=600)
    assert p.returncode == 0, f"{args} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    p = tmp_path_factory.mktemp("prefix")
    run("cmake", "--install", BUILD, "--prefix", p)
    return p


def lua_env(path):
    """What `module load` of the Lmod file sets: {VAR: [prepended paths]} and {VAR: value}."""
    text = open(path).read()
    pattern = re.search(r'myFileName\(\):match\("(.*?)"\)', text).group(1)
    m = re.match(pattern.replace("%", "\\"), str(path))
    assert m, (pattern, path)
    prefix = m.group(1)

    def value(expr):
        if expr.strip() == "prefix":
            return prefix
        parts = re.findall(r'"([^"]*)"', expr)
        return os.path.join(prefix, *parts) if expr.startswith("pathJoin(prefix") else parts[0]
    paths, sets = {}, {}
    for kind, var, expr in re.findall(r'^(prepend_path|setenv)\("(\w+)", (.*)\)$', text, re.M):
        if kind == "prepend_path":
            paths.setdefault(var, []).append(value(expr))
        else:
            sets[var] = value(expr)
    return prefix, paths, sets


def tcl_env(path):
    text = open(path).read()
    depth = text.count("[file dirname")
    prefix = os.path.normpath(str(path))
    for _ in range(depth):
        prefix = os.path.dirname(prefix)
    paths, sets = {}, {}
    for kind, var, val in re.findall(r"^(prepend-path|setenv) (\w+) (\S+)$", text, re.M):
        val = val.replace("$prefix", prefix)
        if kind == "prepend-path":
            paths.setdefault(var, []).append(val)
        else:
            sets[var] = val
    return prefix, paths, sets


def test_both_modules_find_the_prefix_and_name_paths_that_exist(prefix):
    lua = prefix / "share" / "solar" / "modulefiles" / "solar" / f"{VERSION}.lua"
    tcl = prefix / "share" / "solar" / "modulefiles-tcl" / "solar" / VERSION
    got_lua, got_tcl = lua_env(lua), tcl_env(tcl)
    assert got_lua == got_tcl
    found, paths, sets = got_lua
    assert found == str(prefix)
    assert set(paths) >= {"PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "MANPATH", "CMAKE_PREFIX_PATH",
                          "PKG_CONFIG_PATH"}
    for var, dirs in paths.items():
        for d in dirs:
            assert os.path.isdir(d), f"{var}: {d} is not a directory of the install"
    assert os.access(os.path.join(paths["PATH"][0], "solar"), os.X_OK)
    assert sets["SOLAR_ROOT"] == str(prefix)
    assert "Apache License" in (prefix / "share" / "doc" / "solar" / "LICENSE").read_text()
    assert sets["SOLAR_SPANK_PLUGIN"].startswith(str(prefix))
    assert "plugstack" in lua.read_text() and "plugstack" in tcl.read_text()


def test_a_job_runs_with_the_module_environment_only(prefix, tmp_path):
    _, paths, sets = lua_env(prefix / "share" / "solar" / "modulefiles" / "solar" /
                             f"{VERSION}.lua")
    env = {"HOME": str(tmp_path), "TMPDIR": str(tmp_path), "LANG": "C.UTF-8",
           "PATH": "/usr/bin:/bin"}
    for var, dirs in paths.items():
        env[var] = os.pathsep.join(list(reversed(dirs)) + ([env[var]] if var in env else []))
    env.update(sets)
    solar = run("solar", "--version", env=env).stdout
    assert VERSION in solar
    where = run("/usr/bin/which", "solar", env=env).stdout.strip()
    assert where == os.path.join(prefix, "bin", "solar")
    data = tmp_path / "d.h5"
    run("solar", "gen", data, "--samples", "64", "--preset", "tiny", "--no-progress", env=env)
    p = run("solar", "run", "-n", "2", "--dataset", data, "--buffer", "50%", "--epochs", "1",
            "--batch", "4", "--", "solar-example-train", "--verify", env=env, cwd=tmp_path)
    assert "hit rate" in p.stderr, p.stderr
    lib = run("/usr/bin/python3", "-c", "import solar; print(solar.library_path)", env=env,
              cwd=tmp_path).stdout.strip()
    assert lib.startswith(str(prefix)), lib
