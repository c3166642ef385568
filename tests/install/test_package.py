"""The Debian package as an admin and a user meet it: built by `cmake --build build --target
deb` (ctest fixture package.deb), unpacked into a staging root with dpkg-deb, and used from there
only — no build tree on any path, no SOLAR_* variables. The same package on the real test
cluster: spank/tests/test_cluster.py::test_installed_package_runs_the_example_job."""
import os
import re
import shutil
import subprocess
import textwrap

import pytest

DEB = os.environ["SOLAR_DEB"]
VERSION = os.environ["SOLAR_VERSION"]
PROGRAMS = ["solar", "solar-agent", "solar-stored", "solar-example-train"]


def clean_env(**extra):
    """What a fresh login shell has: no build tree, no SOLAR_*, no LD_LIBRARY_PATH."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": os.environ.get("HOME", "/root"),
           "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def run(*args, env=None, cwd=None, timeout=300):
    p = subprocess.run(list(map(str, args)), capture_output=True, text=True, env=env or clean_env(),
                       cwd=cwd, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(map(str, args))} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage")
    run("dpkg-deb", "-x", DEB, root)
    return root


def libdir(stage):
    """Where libsolar landed (lib, or lib/<multiarch> for a /usr build)."""
    found = sorted(stage.glob("usr/lib/**/libsolar.so.0"))
    assert len(found) == 1, found
    return found[0].parent


def test_control_fields_name_runtime_libraries_only():
    fields = run("dpkg-deb", "-f", DEB, "Package", "Version", "Architecture", "Depends").stdout
    assert re.search(r"^Package: solar$", fields, re.M), fields
    assert re.search(rf"^Version: {re.escape(VERSION)}$", fields, re.M), fields
    depends = re.search(r"^Depends: (.*)$", fields, re.M).group(1)
    names = {d.strip().split()[0] for d in depends.split(",")}
    # dpkg-shlibdeps found the shared libraries the programs need; no -dev package is needed.
    assert {"libc6", "libfabric1", "libstdc++6", "python3-numpy"} <= names, depends
    assert not [n for n in names if n.endswith("-dev")], depends


def test_apt_can_install_it_here():
    """apt resolves every dependency from Debian 12 (simulated: this machine stays as it is)."""
    p = run("apt-get", "install", "-s", "-q", os.path.abspath(DEB))
    assert re.search(r"^Inst solar ", p.stdout, re.M), p.stdout


def test_every_program_runs_from_the_staging_root_alone(stage):
    for name in PROGRAMS:
        exe = stage / "usr" / "bin" / name
        assert os.access(exe, os.X_OK), exe
        assert run(exe, "--version").stdout.strip() == f"{name} {VERSION}"
        assert "--version" in run(exe, "--help").stdout, name
    # libsolar comes from the staging root through the program's relative RUNPATH.
    ldd = run("ldd", stage / "usr" / "bin" / "solar-example-train").stdout
    m = re.search(r"libsolar\.so\.0 => (\S+)", ldd)
    assert m and os.path.realpath(m.group(1)).startswith(str(libdir(stage))), ldd


def test_plugin_and_interposer_are_where_the_docs_say(stage):
    plugin = stage / "usr" / "lib" / "slurm-wlm" / "solar_spank.so"
    assert plugin.is_file(), sorted(map(str, stage.glob("usr/lib/**/*.so")))
    assert (libdir(stage) / "libsolar_preload.so").is_file()
    needed = run("readelf", "-d", plugin).stdout
    assert not re.search(r"mpi|hdf5|fabric|curl", needed), needed
    for page in PROGRAMS:
        text = (stage / "usr" / "share" / "man" / "man1" / f"{page}.1").read_text()
        assert f".TH {page.upper()} " in text, text[:300]
    assert (stage / "usr" / "share" / "doc" / "solar" / "examples" / "plugstack.conf").is_file()


def test_license_and_copyright_file(stage):
    doc = stage / "usr" / "share" / "doc" / "solar"
    copyright = (doc / "copyright").read_text()
    assert copyright.startswith("Format: https://www.debian.org/doc/packaging-manuals/"
                                "copyright-format/1.0/"), copyright[:200]
    assert "License: Apache-2.0" in copyright
    assert "Apache License" in (doc / "LICENSE").read_text()


def test_find_package_and_pkg_config_build_a_rank_program(stage, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.cpp").write_text(textwrap.dedent("""\
        #include <solar/solar.hpp>
        #include <cstdio>
        #include <cstring>
        int main() {
          std::printf("%s %d\\n", solar_version(), SOLAR_VERSION);
          return std::strcmp(solar_version(), SOLAR_VERSION_STRING) == 0 ? 0 : 1;
        }
        """))
    (src / "CMakeLists.txt").write_text(textwrap.dedent("""\
        cmake_minimum_required(VERSION 3.25)
        project(rank CXX)
        set(CMAKE_CXX_STANDARD 20)
        find_package(solar 0.1 REQUIRED)
        add_executable(rank main.cpp)
        target_link_libraries(rank PRIVATE solar::client)
        """))
    build = tmp_path / "build"
    run("cmake", "-S", src, "-B", build, f"-DCMAKE_PREFIX_PATH={stage}/usr")
    run("cmake", "--build", build)
    # CMake's build RPATH points into the staging root; nothing else is needed.
    out = run(build / "rank").stdout
    assert out.startswith(f"{VERSION} "), out

    # pkg-config: the .pc file is relative to itself, so the staging root's paths come out.
    pc_dirs = sorted({str(p.parent) for p in stage.glob("usr/lib/**/solar.pc")})
    assert pc_dirs, "no solar.pc"
    flags = run("pkg-config", "--cflags", "--libs", "solar",
                env=clean_env(PKG_CONFIG_PATH=pc_dirs[0])).stdout.split()
    includes = [f[2:] for f in flags if f.startswith("-I")]
    assert includes and os.path.samefile(includes[0], stage / "usr" / "include"), flags
    exe = tmp_path / "rank-pc"
    run("g++", "-std=c++20", src / "main.cpp", "-o", exe, *flags)
    out = run(exe, env=clean_env(LD_LIBRARY_PATH=str(libdir(stage)))).stdout
    assert out.startswith(f"{VERSION} "), out


def test_python_package_loads_the_installed_library(stage, tmp_path):
    site = stage / "usr" / "lib" / "python3" / "dist-packages"
    code = "import solar, solar._lib as l; print(solar.__file__); print(l.path)"
    out = run("/usr/bin/python3", "-c", code, cwd=tmp_path,
              env=clean_env(PYTHONPATH=str(site))).stdout.splitlines()
    assert out[0].startswith(str(site)), out
    assert os.path.realpath(out[1]).startswith(str(stage)), out


def test_solar_run_from_the_staging_root(stage, tmp_path):
    bindir = stage / "usr" / "bin"
    env = clean_env(PATH=f"{bindir}:/usr/bin:/bin")
    data = tmp_path / "d.h5"
    run("solar", "gen", data, "--samples", "256", "--preset", "tiny", "--no-progress", env=env)
    p = run("solar", "run", "--ranks-per-node", "2", "--nodes", "2", "--dataset", data,
            "--buffer", "50%", "--epochs", "2", "--batch", "8", "--",
            "solar-example-train", "--verify", env=env, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert out.count("verified (0 wrong), from the node agent") == 4, out
    assert shutil.which("solar", path=env["PATH"]).startswith(str(stage))
    # Without agents the ranks read the file themselves, through libsolar-direct.so found
    # beside the staged libsolar (libsolar itself links no HDF5 or libfabric).
    assert (libdir(stage) / "libsolar-direct.so").is_file()
    p = run("solar", "run", "--ranks-per-node", "2", "--dataset", data, "--no-agent",
            "--buffer", "50%",
            "--epochs", "1", "--batch", "8", "--", "solar-example-train", "--verify",
            env=env, cwd=tmp_path)
    out = p.stdout + p.stderr
    assert out.count("verified (0 wrong)") == 2, out


def test_the_storage_service_unit_and_its_example_configuration(stage):
    unit = stage / "usr/lib/systemd/system/solar-stored@.service"
    assert unit.is_file(), sorted(map(str, stage.glob("usr/lib/systemd/**/*")))
    text = unit.read_text()
    assert "ExecStart=/usr/bin/solar-stored --config /etc/solar/stored-%i.conf" in text, text
    assert "Type=notify" in text and "User=solar-stored" in text
    example = stage / "usr/share/doc/solar/examples/stored.conf.example"
    assert example.is_file()
    # The example is one the installed server reads: only its export is not there.
    conf = example.read_text()
    assert "token-file" in conf and "export" in conf
    p = subprocess.run([stage / "usr/bin/solar-stored", "--config", example],
                       capture_output=True, text=True, env=clean_env(
                           LD_LIBRARY_PATH=str(libdir(stage))), timeout=60)
    assert p.returncode != 0 and "--config" not in p.stderr, p.stderr  # parsed; then the files
