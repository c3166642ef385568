# SPDX-License-Identifier: Apache-2.0
"""The interposer's own reading of SOLAR_DATASET (interpose/src/preload.c: the file is
everything before the last ':/'; `@LIST`, a glob, a directory name many files) against the
golden table every parser is tested with (tests/protocol/dataset_spec_cases.json). Driven
through the real library: with SOLAR_DATASET=spec, a process opens and reads a file of the
dataset (one file: the table's file; a directory: an HDF5 file below it; a glob: a file it
matches; a list: any file); the interposer, taking it for the dataset's, asks the node agent
for its buffer (a socket nobody listens on) and, verbose, says it got none. A file a directory
or a glob does not take (another suffix, another name) is not asked about. A fabric:// spec
leaves it inactive. Specs the front ends refuse are not its to refuse."""
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


def member(pattern):
    """A path that the glob `pattern` matches: each wildcard made a plain character."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "[" and "]" in pattern[i + 2:]:
            close = pattern.index("]", i + 2)
            out.append(pattern[i + 1].lstrip("!^") or "a")
            i = close + 1
            continue
        out.append("a" if c in "*?" else c)
        i += 1
    return "".join(out)


def dataset_file(case):
    """(a file the interposer takes for one of the dataset's, one it does not or None) for a
    spec of the table, relative to the directory the process runs in."""
    file = case["file"]
    if case.get("list"):
        return "member.h5", None
    if case.get("glob"):
        return member(file), None if file.endswith("*") else member(file) + ".other"
    if file.endswith("/"):  # a directory: its HDF5 files (the stat tells; here, the slash)
        return file + "sub/x.hdf5", file + "notes.txt"
    return file, None


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
    if case.get("list"):
        (tmp_path / case["file"]).write_text("member.h5\n")
    taken, other = dataset_file(case)
    for path, asks in ((taken, True), (other, False)):
        if path is None:
            continue
        path = str(tmp_path) + path if path.startswith("/") else path
        full = tmp_path / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_bytes(b"data")
        assert (ASKED in reads(lib, tmp_path, spec, path)) == asks, (spec, path)


def test_a_directory_without_a_slash_is_told_by_stat(lib, tmp_path):
    """`train:/split` names a directory when train is one: its HDF5 files are the dataset's
    (any suffix of the four, in any case), other files and a file called `train` elsewhere not."""
    for name in ("a/x.h5", "b/y.HDF5", "c.hdf", "d.he5", "notes.txt"):
        (tmp_path / "train" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "train" / name).write_bytes(b"data")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "train").write_bytes(b"data")
    for name in ("a/x.h5", "b/y.HDF5", "c.hdf", "d.he5"):
        assert ASKED in reads(lib, tmp_path, "train:/split", f"train/{name}"), name
    assert ASKED not in reads(lib, tmp_path, "train:/split", "train/notes.txt")
    assert ASKED not in reads(lib, tmp_path, "train:/split", "elsewhere/train")
