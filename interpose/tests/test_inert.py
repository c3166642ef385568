# SPDX-License-Identifier: Apache-2.0
"""a. Processes that never open the dataset see no difference: bash, python, gcc under the
preload, configured with a real dataset file and a socket nobody listens on."""
import pytest

from conftest import PYTHON, plain_env, preload_env, run

BASH = r'''
echo "hello $((6*7))"; ls / | head -3; cat /nonexistent-file; printf 'a\nb\n' | sort -r
exec 5</etc/hostname; read -r line <&5; exec 5<&-; echo "fd5 ok"
sha256sum "$DATASET" | cut -c1-16; (exit 3)
'''

PY = r'''
import os, subprocess, sys, tempfile
print(sum(range(100)))
with tempfile.TemporaryDirectory() as d:
    p = os.path.join(d, "x.bin")
    with open(p, "wb") as f: f.write(b"abc" * 1000)
    fd = os.open(p, os.O_RDONLY); print(os.pread(fd, 6, 10)); os.close(fd)
    print(subprocess.run(["echo", "child"], capture_output=True).stdout)
pid = os.fork()
if pid == 0: os._exit(7)
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print("to stderr", file=sys.stderr); sys.exit(5)
'''

C_SRC = r'''
#include <stdio.h>
int main(void) { puts("compiled"); return 0; }
#warning "a warning on stderr"
'''


@pytest.mark.parametrize("verbose", [False, True])
def test_bash_python_gcc_identical(lib, h5file, tmp_path, verbose):
    dataset, _ = h5file
    src = tmp_path / "prog.c"
    src.write_text(C_SRC)
    (tmp_path / "plain").mkdir()
    (tmp_path / "pre").mkdir()
    env_pre = preload_env(lib, dataset, tmp_path / "nobody.sock", verbose)
    env_plain = plain_env()
    for env in (env_pre, env_plain):
        env["DATASET"] = str(dataset)
    cases = [
        (["bash", "-c", BASH], None),
        ([PYTHON, "-c", PY], None),
        (["gcc", "-O2", str(src), "-o", "prog"], "prog"),
    ]
    for cmd, output in cases:
        a = run(cmd, env_plain, cwd=tmp_path / "plain")
        b = run(cmd, env_pre, cwd=tmp_path / "pre")
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), cmd[:2]
        if output:
            assert a.returncode == 0
            assert (tmp_path / "plain" / output).read_bytes() == \
                (tmp_path / "pre" / output).read_bytes()
    # The preload really was loaded into these processes.
    probe = run(["bash", "-c", "grep -c solar_preload /proc/self/maps"], env_pre)
    assert probe.stdout.strip() != b"0"
