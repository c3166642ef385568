# SPDX-License-Identifier: Apache-2.0
"""solar-stored as a systemd service (issue 41, item 4), without systemd: the unit's own command
line (packaging/systemd/solar-stored@.service as configured into the build, its program the
build's solar-stored, its /etc/solar/stored-%i.conf a configuration in a temporary folder) run
the way systemd runs it, with $NOTIFY_SOCKET a datagram socket of this test and $JOURNAL_STREAM
set. Checked: the unit's hardening, readiness (READY=1 with the address, before which no client
is let in), the configuration file's options, the token from its file in no process listing,
the journal's priority prefixes, and STOPPING=1 and exit 0 on SIGTERM."""
import os
import re
import shlex
import signal
import socket
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import BIN, SOLAR, STORED, run  # noqa: E402

UNIT = os.path.join(os.path.abspath(BIN), "systemd", "solar-stored@.service")


def unit_fields():
    fields = {}
    for line in open(UNIT):
        line = line.strip()
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            fields.setdefault(key, []).append(value)
    return fields


def test_the_unit_runs_its_server_as_its_own_user_read_only():
    f = unit_fields()
    assert f["Type"] == ["notify"]
    assert f["User"] == ["solar-stored"] and f["Group"] == ["solar-stored"]
    for key, value in [("ProtectSystem", "strict"), ("NoNewPrivileges", "yes"),
                       ("ProtectHome", "read-only"), ("PrivateTmp", "yes"),
                       ("LimitMEMLOCK", "infinity")]:
        assert f[key] == [value], key
    argv = shlex.split(f["ExecStart"][0])
    assert argv[0].endswith("/solar-stored") and argv[1:] == ["--config", "/etc/solar/stored-%i.conf"]


def test_started_as_the_unit_starts_it(tmp_path):
    subprocess.run([SOLAR, "gen", str(tmp_path / "d.h5"), "--samples", "32", "--preset", "tiny",
                    "--no-progress"], check=True, capture_output=True)
    token = tmp_path / "stored-test.token"
    token.write_text("t0ken-of-the-service\n")
    token.chmod(0o600)
    conf = tmp_path / "stored-test.conf"
    conf.write_text(f'# as packaging/systemd/stored.conf.example\nlisten = "127.0.0.1:0"\n'
                    f'export = ["d={tmp_path / "d.h5"}:/data"]\nlabels = "/label"\n'
                    f'token-file = "{token}"\n')
    argv = [a.replace("%i", "test") for a in shlex.split(unit_fields()["ExecStart"][0])]
    argv[0] = STORED
    argv[argv.index("/etc/solar/stored-test.conf")] = str(conf)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(60)
    log = open(tmp_path / "stored.log", "w")
    env = dict(os.environ, NOTIFY_SOCKET=str(tmp_path / "notify"), JOURNAL_STREAM="8:1234")
    env.pop("SOLAR_STORED_TOKEN", None)
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready = notify.recv(4096).decode()
        assert "READY=1" in ready and f"MAINPID={proc.pid}" in ready, ready
        addr = re.search(r"STATUS=serving 1 export on (\S+)", ready).group(1)
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert b"t0ken" not in f.read()
        client = dict(os.environ, SOLAR_STORED_TOKEN="t0ken-of-the-service")
        p = run(SOLAR, "verify", f"fabric://{addr}/d", "--no-progress", env=client, check=False)
        assert p.returncode == 0, p.stdout + p.stderr
        client.pop("SOLAR_STORED_TOKEN")
        p = run(SOLAR, "verify", f"fabric://{addr}/d", "--no-progress", env=client, check=False)
        assert p.returncode != 0 and "token" in p.stderr, p.stderr
        proc.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in notify.recv(4096).decode()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
        notify.close()
    lines = (tmp_path / "stored.log").read_text().splitlines()
    assert lines and all(re.match(r"<[2-7]>", line) for line in lines), lines
    assert any(line.startswith("<6>") and "listening on" in line for line in lines), lines


def test_a_bad_configuration_is_named(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text('listen = "127.0.0.1:0"\nexprot = ["d=x.h5"]\n')
    p = subprocess.run([STORED, "--config", str(conf)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "exprot" in p.stderr, p.stderr
    p = subprocess.run([STORED, "--config", str(tmp_path / "missing.conf")], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "missing.conf" in p.stderr, p.stderr
