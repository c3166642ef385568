"""The interposer's own reading of SOLAR_DATASET (interpose/src/preload.c: the file is
everything before the last ':/') against the golden table every parser is tested with
(tests/protocol/dataset_spec_cases.json). Driven through the real library: with
SOLAR_DATASET=spec, a process opens and reads the table's file; the interposer, taking it for
the dataset, asks the node agent for its buffer (a socket nobody listens on) and, verbose,
says it got none. A fabric:// spec leaves it inactive. Specs the front ends refuse are not its
to refuse."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import PYTHON

TABLE = Path(__file__).resolve().parents[2] / "tests" / "protocol" / "dataset_spec_cases.json"
CASES = [c for c in json.loads(TABLE.read_text())["cases"] if "error" not in c]
ASKED = "solar: no buffer from the node agent at "

READ = "import os, sys\nfd = os.open(sys.argv[1], os.O_RDONLY)\nos.pread(fd, 4, 0)\n"


def reads(lib, cwd, spec, path):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_PRELOAD": lib,
           "SOLAR_DATASET": spec, "SOLAR_SOCKET": str(cwd / "nobody.sock"), "SOLAR_VERBOSE": "1"}
    p = subprocess.run([PYTHON, "-c", READ, path], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stderr


@pytest.mark.parametrize("case", [pytest.param(c, id=repr(c["spec"])) for c in CASES])
def test_interposer_takes_the_tables_file(lib, tmp_path, case):
    spec = case["spec"]
    # An absolute spec lands under tmp_path (a prefix without ':/' splits the same way).
    if spec.startswith("/"):
        spec = str(tmp_path) + spec
    if case.get("fabric"):
        (tmp_path / "name").write_bytes(b"data")
        assert ASKED not in reads(lib, tmp_path, spec, "name")
        return
    path = str(tmp_path) + case["file"] if case["file"].startswith("/") else case["file"]
    full = tmp_path / path
    full.parent.mkdir(parents=True, exist_ok=True)
    full.write_bytes(b"data")
    assert ASKED in reads(lib, tmp_path, spec, path)
