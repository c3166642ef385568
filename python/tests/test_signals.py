# SPDX-License-Identifier: Apache-2.0
"""Importing solar, and reading without an agent, leave Python's signal handling as it was
(issue 14: loading libsolar took over SIGINT and SIGTERM). libfabric's psm provider loads
libinfinipath, whose constructor installs handlers that print a backtrace and exit(1): Ctrl-C
ended a training script with status 1 instead of KeyboardInterrupt. libsolar no longer links
libfabric (issue 15); its direct path loads it, inside libsolar-direct.so, on first use, and
libsolar puts every disposition back around that load."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(HERE)  # python/: the solar package from this source tree


def start(body, *python_flags, prelude=""):
    """A Python process that imports solar (loading libsolar) and runs `body`, which prints
    'ready' once it waits for the signal. Returns the Popen once 'ready' was read."""
    code = textwrap.dedent(prelude) + "import os, signal, sys, time\nimport solar\n" + \
        textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=PACKAGE_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, *python_flags, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    line = p.stdout.readline()
    if line.strip() != "ready":
        out, err = p.communicate(timeout=60)
        raise AssertionError(f"not ready: {line}{out}\n{err}")
    return p


def finish(p):
    try:
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, out, err


def test_libsolar_is_loaded_from_this_build():
    p = start("""
        print("ready", flush=True)
        print(solar.library_path, file=sys.stderr)  # (stdout's next lines may sit in a buffer)
    """)
    rc, out, err = finish(p)
    assert rc == 0, err
    if os.environ.get("SOLAR_LIBRARY"):
        assert os.path.realpath(err.strip()) == os.path.realpath(os.environ["SOLAR_LIBRARY"]), err


def test_ctrl_c_raises_keyboard_interrupt():
    p = start("""
        try:
            print("ready", flush=True)
            time.sleep(120)
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", flush=True)
            sys.exit(7)
    """)
    p.send_signal(signal.SIGINT)
    rc, out, err = finish(p)
    assert rc == 7 and "caught KeyboardInterrupt" in out, (rc, out, err)


def test_uncaught_ctrl_c_ends_the_script_as_python_does():
    p = start("""
        print("ready", flush=True)
        time.sleep(120)
    """)
    p.send_signal(signal.SIGINT)
    rc, out, err = finish(p)
    # Python ends an uncaught KeyboardInterrupt by the signal itself (a shell shows 130).
    assert rc == -signal.SIGINT, (rc, err)
    assert "KeyboardInterrupt" in err, err
    assert "terminated with signal" not in err, err


def test_sigterm_keeps_its_default_action():
    p = start("""
        print("ready", flush=True)
        time.sleep(120)
    """)
    p.send_signal(signal.SIGTERM)
    rc, out, err = finish(p)
    assert rc == -signal.SIGTERM, (rc, err)
    assert "terminated with signal" not in err, err


def test_handlers_set_before_the_import_are_kept():
    # A training script (or torch) that handles SIGTERM and SIGUSR1 before importing solar.
    p = start("""
        print("ready", flush=True)
        time.sleep(120)
    """, prelude="""
        import signal, sys
        def on_term(sig, frame):
            print("SIGTERM handled", flush=True)
            sys.exit(5)
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    """)
    p.send_signal(signal.SIGUSR1)  # still ignored: the script goes on
    p.send_signal(signal.SIGTERM)
    rc, out, err = finish(p)
    assert rc == 5 and "SIGTERM handled" in out, (rc, out, err)


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="scripts/sanitize address: ASan's own SIGSEGV handler takes the "
                           "deliberate crash before Python's faulthandler can report it")
def test_faulthandler_still_reports_a_crash():
    p = start("""
        import faulthandler
        assert faulthandler.is_enabled()
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(120)
    """, "-X", "faulthandler")
    rc, out, err = finish(p)
    assert rc == -signal.SIGSEGV, (rc, err)
    assert "Fatal Python error: Segmentation fault" in err, err


def test_solar_torch_loader_script_gets_keyboard_interrupt():
    pytest.importorskip("torch")
    p = start("""
        import torch
        import solar.torch
        try:
            print("ready", flush=True)
            time.sleep(120)
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", flush=True)
            sys.exit(7)
    """)
    p.send_signal(signal.SIGINT)
    rc, out, err = finish(p)
    assert rc == 7 and "caught KeyboardInterrupt" in out, (rc, out, err)


DIRECT_BODY = """
    def mapped():
        with open("/proc/self/maps") as f:
            maps = f.read()
        return {n for n in ("libfabric", "libhdf5") if n in maps}
    assert not mapped(), mapped()  # importing solar loaded neither
    loader = solar.Loader()
    assert not loader.using_agent
    next(iter(loader))
    print(sorted(mapped()), file=sys.stderr, flush=True)
"""


def direct_env(plan, dataset, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOLAR_")
           or k in ("SOLAR_LIBRARY", "SOLAR_BIN", "SOLAR_BUILD_DIR")}
    env.update(SOLAR_PLAN=plan, SOLAR_DATASET=dataset, SOLAR_NODE="0", SOLAR_LOCAL_RANK="0",
               PYTHONPATH=PACKAGE_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra)
    return env


def test_ctrl_c_after_reading_directly_raises_keyboard_interrupt(plan, dataset):
    """The first direct read loads libsolar-direct.so (HDF5; libfabric and its providers only
    for a fabric:// source): Python's handlers are still there afterwards."""
    code = "import os, signal, sys, time\nimport solar\n" + textwrap.dedent(DIRECT_BODY) + \
        textwrap.dedent("""
        try:
            print("ready", flush=True)
            time.sleep(120)
        except KeyboardInterrupt:
            print("caught KeyboardInterrupt", flush=True)
            sys.exit(7)
        """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=direct_env(plan, dataset))
    line = p.stdout.readline()
    if line.strip() != "ready":
        out, err = p.communicate(timeout=60)
        raise AssertionError(f"not ready: {line}{out}\n{err}")
    p.send_signal(signal.SIGINT)
    rc, out, err = finish(p)
    assert rc == 7 and "caught KeyboardInterrupt" in out, (rc, out, err)
    # HDF5 came with the direct read, not before; libfabric not at all (a file, not fabric://)
    assert "['libhdf5']" in err, err


def test_a_missing_direct_module_is_a_clear_error(plan, dataset, tmp_path):
    missing = tmp_path / "libsolar-direct.so"
    code = "import solar\ntry:\n    solar.Loader()\nexcept solar.SolarError as e:\n" \
           "    print(e)\nelse:\n    raise SystemExit('no error')\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=direct_env(plan, dataset, SOLAR_DIRECT_LIBRARY=str(missing)))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"needs libsolar-direct.so, which could not be loaded from {missing} " \
           "(SOLAR_DIRECT_LIBRARY)" in p.stdout, p.stdout


def test_direct_module_is_found_after_a_chdir_when_libsolar_was_named_relatively(
        plan, dataset, tmp_path):
    """libsolar opened by a relative path (SOLAR_LIBRARY=build/client/libsolar.so), then the
    script changes directory before its first direct read: libsolar-direct.so is still found
    beside libsolar (its folder is resolved when libsolar is loaded)."""
    lib = os.environ.get("SOLAR_LIBRARY")
    if not lib:
        pytest.skip("needs SOLAR_LIBRARY (the build's libsolar.so)")
    folder, name = os.path.split(os.path.realpath(lib))
    code = textwrap.dedent(f"""
        import os, sys
        import solar
        os.chdir({str(tmp_path)!r})
        loader = solar.Loader()
        assert not loader.using_agent
        batch = next(iter(loader))
        print("read", len(batch.indices), flush=True)
        """)
    env = direct_env(plan, dataset, SOLAR_LIBRARY=os.path.join(".", name))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env, cwd=folder)
    assert p.returncode == 0 and "read " in p.stdout, p.stdout + p.stderr
