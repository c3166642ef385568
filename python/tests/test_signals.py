"""Importing solar leaves Python's signal handling as it was (issue 14: loading libsolar took over
SIGINT and SIGTERM). libsolar links libfabric, whose psm provider loads libinfinipath; its
constructor installed handlers that printed a backtrace and exit(1): Ctrl-C ended a training
script with status 1 instead of KeyboardInterrupt."""
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
