# SPDX-License-Identifier: Apache-2.0
"""The Debian packages as an admin and a user meet them: built by `cmake --build build --target
deb` (ctest fixture package.deb) into one folder, one package per component
(cmake/SolarInstall.cmake), unpacked into a staging root with dpkg-deb, and used from there
only — no build tree on any path, no SOLAR_* variables. The same packages on the real test
cluster: spank/tests/test_cluster.py::test_installed_package_runs_the_example_job."""
import functools
import glob
import gzip
import os
import re
import shutil
import subprocess
import textwrap

import pytest

DEB_DIR = os.environ["SOLAR_DEB_DIR"]
VERSION = os.environ["SOLAR_VERSION"]
SLURM_RELEASE = os.environ.get("SOLAR_SLURM_RELEASE", "")
SOURCE = os.path.join(os.path.dirname(__file__), "..", "..")
PROGRAMS = ["solar", "solar-agent", "solar-stored", "solar-example-train"]
PACKAGES = ["solar", "libsolar0", "libsolar-dev", "python3-solar", "solar-slurm-plugin"]
MULTIARCH = subprocess.run(["gcc", "-print-multiarch"], capture_output=True, text=True,
                           check=True).stdout.strip()


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


@functools.lru_cache(maxsize=None)
def debs():
    """{package name: .deb path} of the folder (read once: the tests only read the packages)."""
    found = {}
    for path in sorted(glob.glob(os.path.join(DEB_DIR, "*.deb"))):
        name = run("dpkg-deb", "-f", path, "Package").stdout.strip()
        assert name not in found, f"two packages {name}: {found[name]} and {path}"
        found[name] = path
    return found


def field(package, name):
    return run("dpkg-deb", "-f", debs()[package], name).stdout.strip()


def contents(package):
    """The package's file paths, without the leading './'."""
    listing = run("dpkg-deb", "-c", debs()[package]).stdout
    return {line.split(None, 5)[5].split(" -> ")[0][2:] for line in listing.splitlines()
            if not line.startswith("d")}


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    root = tmp_path_factory.mktemp("stage")
    for path in debs().values():
        run("dpkg-deb", "-x", path, root)
    return root


def libdir(stage):
    """Where libsolar landed: /usr/lib/<multiarch>, as Debian's libraries."""
    found = sorted(stage.glob("usr/lib/**/libsolar.so.0"))
    assert len(found) == 1, found
    assert found[0].parent == stage / "usr" / "lib" / MULTIARCH, found
    return found[0].parent


def test_one_package_per_part_so_a_compute_node_gets_what_it_runs():
    assert sorted(debs()) == sorted(PACKAGES), debs()
    assert all(field(p, "Version") == VERSION for p in PACKAGES)
    tools, lib, dev = contents("solar"), contents("libsolar0"), contents("libsolar-dev")
    py, plugin = contents("python3-solar"), contents("solar-slurm-plugin")
    assert {f"usr/bin/{p}" for p in PROGRAMS} <= tools, sorted(tools)
    assert f"usr/lib/{MULTIARCH}/solar/libsolar_preload.so" in tools
    assert any(re.fullmatch(rf"usr/lib/{MULTIARCH}/libsolar\.so\.0\.\S+", f) for f in lib), lib
    assert f"usr/lib/{MULTIARCH}/solar/libsolar-direct.so" in lib
    # Headers, CMake files and solar.pc only in -dev; the unversioned link only there too.
    for f in tools | lib | py | plugin:
        assert not re.search(r"^usr/include/|/cmake/solar/|\.pc$|libsolar\.so$", f), f
    assert "usr/include/solar/solar.h" in dev and f"usr/lib/{MULTIARCH}/libsolar.so" in dev
    assert f"usr/lib/{MULTIARCH}/pkgconfig/solar.pc" in dev
    assert any(f.startswith("usr/lib/python3/dist-packages/solar/") for f in py), py
    assert f"usr/lib/{MULTIARCH}/slurm-wlm/solar_spank.so" in plugin, plugin
    assert "etc/slurm/plugstack.conf.d/solar.conf" in plugin
    for package, files in [("solar", tools), ("libsolar0", lib), ("libsolar-dev", dev),
                           ("python3-solar", py), ("solar-slurm-plugin", plugin)]:
        assert f"usr/share/doc/{package}/copyright" in files, package
        assert f"usr/share/doc/{package}/changelog.gz" in files, package


def test_dependencies_runtime_only_and_no_mpi():
    names = {}
    for package in PACKAGES:
        depends = field(package, "Depends")
        names[package] = {d.strip().split()[0] for d in depends.replace("|", ",").split(",") if d}
        assert not [n for n in names[package] if n.endswith("-dev") and package != "libsolar-dev"]
        # Serial HDF5 serves every program: no Open MPI (or its UCX, ibverbs, X11) on a node.
        assert not [n for n in names[package] if re.search(r"mpi|hdf5-openmpi", n)], depends
    # dpkg-shlibdeps found the shared libraries the programs need.
    assert {"libc6", "libfabric1", "libstdc++6", "libsolar0"} <= names["solar"], names["solar"]
    assert any(n.startswith("libhdf5-") for n in names["libsolar0"]), names["libsolar0"]
    assert "libsolar0" in names["libsolar-dev"] and "libsolar0" in names["python3-solar"]


def test_the_plugin_declares_the_slurm_release_it_was_built_for():
    depends = field("solar-slurm-plugin", "Depends")
    assert SLURM_RELEASE, "ctest passes SOLAR_SLURM_RELEASE"
    major, minor = SLURM_RELEASE.split(".")
    nxt = f"{major}.{int(minor) + 1:02d}"
    assert f"slurm-wlm-basic-plugins (>= {SLURM_RELEASE}~)" in depends, depends
    assert f"slurm-wlm-basic-plugins (<< {nxt}~)" in depends, depends
    assert re.search(rf"\bsolar \(= {re.escape(VERSION)}\)", depends), depends
    # dpkg -I, as the issue asks an admin to check it.
    info = run("dpkg", "-I", debs()["solar-slurm-plugin"]).stdout
    assert "slurm-wlm-basic-plugins" in info and "/etc/slurm/plugstack.conf.d/solar.conf" in info
    assert SLURM_RELEASE in info  # the description names it


def test_the_plugstack_snippet_is_a_commented_conffile(stage):
    text = (stage / "etc/slurm/plugstack.conf.d/solar.conf").read_text()
    active = [l for l in text.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    assert active == [], active  # nothing enabled until the admin says so
    line = [l for l in text.splitlines() if "solar_spank.so" in l and l.startswith("#optional")]
    assert line and f"/usr/lib/{MULTIARCH}/slurm-wlm/solar_spank.so" in line[0], text
    conffiles = run("dpkg-deb", "-I", debs()["solar-slurm-plugin"], "conffiles").stdout
    assert conffiles.split() == ["/etc/slurm/plugstack.conf.d/solar.conf"]


def test_libsolar0_runs_ldconfig_by_trigger_and_declares_its_shlibs():
    deb = debs()["libsolar0"]
    assert run("dpkg-deb", "-I", deb, "triggers").stdout.strip() == "activate-noawait ldconfig"
    assert re.search(r"^libsolar 0 libsolar0 \(>= ", run("dpkg-deb", "-I", deb, "shlibs").stdout, re.M)
    listing = run("dpkg-deb", "-I", deb).stdout
    assert " postinst" not in listing and " postrm" not in listing, listing


def test_apt_can_install_them_here():
    """apt resolves every dependency from Debian 12 (simulated: this machine stays as it is)."""
    paths = [os.path.abspath(p) for p in debs().values()]
    p = run("apt-get", "install", "-s", "-q", *paths)
    for package in PACKAGES:
        assert re.search(rf"^Inst {re.escape(package)} ", p.stdout, re.M), p.stdout
    # A compute node of a batch-mode site: the tools and the plugin pull no Open MPI.
    p = run("apt-get", "install", "-s", "-q", debs()["solar"], debs()["libsolar0"])
    assert not re.search(r"^Inst (libopenmpi|openmpi|libucx|libhdf5-openmpi)", p.stdout, re.M), p.stdout


def test_lintian_pedantic_with_the_projects_overrides():
    """lintian --pedantic: no tag left but those packaging/debian/*.lintian-overrides explain."""
    paths = [os.path.abspath(p) for p in debs().values()]
    p = subprocess.run(["lintian", "--pedantic", "--fail-on", "error,warning,info,pedantic",
                        "--display-info", *paths], capture_output=True, text=True, timeout=600,
                       env=clean_env())
    tags = [l for l in p.stdout.splitlines() if re.match(r"^[EWIPX]: ", l)]
    assert p.returncode == 0 and not tags, p.stdout + p.stderr
    # Each override says why (a comment above it).
    for path in glob.glob(os.path.join(SOURCE, "packaging", "debian", "*.lintian-overrides")):
        lines = open(path).read().splitlines()
        for i, line in enumerate(lines):
            if line.strip() and not line.startswith("#"):
                assert i > 0 and lines[i - 1].startswith("#"), f"{path}:{i + 1}: no reason given"


def test_man_pages_have_real_text(stage):
    for page in PROGRAMS:
        path = stage / "usr" / "share" / "man" / "man1" / f"{page}.1.gz"
        raw = gzip.decompress(path.read_bytes())
        raw.decode("ascii")  # every character spelled as groff's \[uXXXX]
        text = raw.decode()
        assert f".TH {page.upper().replace('-', chr(92) + '-')} " in text, text[:300]
        name = re.search(r"^\.SH NAME\n(.*)$", text, re.M).group(1)
        assert name != f"{page} \\- {page}" and len(name) > len(page) + 12, name
        for section in ("DESCRIPTION", "SEE ALSO"):
            assert f'.SH "{section}"' in text or f".SH {section}" in text, (page, section)
    solar = gzip.decompress((stage / "usr/share/man/man1/solar.1.gz").read_bytes()).decode()
    for sub in ("solar run", "solar gen", "solar stat", "solar slurm-check", "solar bench loader"):
        assert f'.SS "{sub}"' in solar, sub
    assert "ENVIRONMENT" in solar and "FILES" in solar
    spank = gzip.decompress((stage / "usr/share/man/man8/solar_spank.8.gz").read_bytes()).decode()
    for arg in ("agent=", "plan_dir=", "max_buffer=", "on_error=", "preload=", "zero_copy="):
        assert f".BI {arg} " in spank, arg
    for opt in ("dataset", "buffer", "transparent", "order\\-file", "start\\-epoch"):
        assert f"\\fB\\-\\-solar\\-{opt}\\fR" in spank, opt
    assert "SOLAR_DATASET" in spank and "Incompatible Slurm plugin" in spank
    assert not re.search(r"@[A-Z_]+@", spank), "a placeholder left in solar_spank.8"


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


def test_plugin_is_lean_and_the_examples_are_there(stage):
    plugin = stage / "usr" / "lib" / MULTIARCH / "slurm-wlm" / "solar_spank.so"
    assert plugin.is_file(), sorted(map(str, stage.glob("usr/lib/**/*.so")))
    needed = run("readelf", "-d", plugin).stdout
    assert not re.search(r"mpi|hdf5|fabric|curl", needed), needed
    assert (stage / "usr" / "share" / "doc" / "solar" / "examples" / "plugstack.conf").is_file()


def test_every_binary_is_hardened(stage):
    """PIE, full RELRO with BIND_NOW, a non-executable stack, the stack protector and fortified
    calls on every program and library (what lintian's hardening tags and hardening-check look
    at)."""
    binaries = [stage / "usr" / "bin" / p for p in PROGRAMS]
    binaries += sorted((stage / "usr" / "lib").glob("**/*.so*"))
    binaries = [b for b in binaries if b.is_file() and not b.is_symlink()
                and b.read_bytes()[:4] == b"\x7fELF"]
    # 4 programs, libsolar, libsolar-direct, the interposer, the plugin
    assert len(binaries) == 8, binaries
    for b in binaries:
        dyn = run("readelf", "-d", "-W", b).stdout
        assert "BIND_NOW" in dyn or re.search(r"FLAGS.*\bNOW\b", dyn), (b, dyn)
        seg = run("readelf", "-l", "-W", b).stdout
        assert "GNU_RELRO" in seg, b
        stack = [l for l in seg.splitlines() if "GNU_STACK" in l]
        assert stack and "RWE" not in stack[0], (b, stack)
        if b.parent.name == "bin":
            assert "DYN (Position-Independent Executable" in run("readelf", "-h", b).stdout, b
        syms = run("readelf", "--dyn-syms", "-W", b).stdout
        assert "__stack_chk_fail" in syms, b
    # Fortified calls where the compiler could check sizes (the programs all copy memory).
    for name in PROGRAMS:
        syms = run("readelf", "--dyn-syms", "-W", stage / "usr" / "bin" / name).stdout
        assert re.search(r"__\w+_chk@", syms), name


def test_license_and_copyright_file(stage):
    doc = stage / "usr" / "share" / "doc" / "solar"
    copyright = (doc / "copyright").read_text()
    assert copyright.startswith("Format: https://www.debian.org/doc/packaging-manuals/"
                                "copyright-format/1.0/"), copyright[:200]
    assert "License: Apache-2.0" in copyright
    # Debian keeps the text in common-licenses (lintian: extra-license-file); a prefix install
    # has LICENSE itself (test_module.py).
    assert "/usr/share/common-licenses/Apache-2.0" in copyright
    assert not (doc / "LICENSE").exists()


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
    # in the staged libsolar's private folder (libsolar itself links no HDF5 or libfabric).
    assert (libdir(stage) / "solar" / "libsolar-direct.so").is_file()
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
