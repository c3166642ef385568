# SPDX-License-Identifier: Apache-2.0
"""Every source file of the repository names its license (SPDX-License-Identifier:
Apache-2.0, the LICENSE file's) in its first lines, as Debian, Spack and REUSE tooling read it;
files that cannot carry a comment (fuzz corpora, JSON, plans, man page sources) are covered by
packaging/debian/copyright's `Files: *`."""
import os
import re
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TAG = "SPDX-License-Identifier: Apache-2.0"


def is_source(path):
    base = os.path.basename(path)
    if path.startswith("tests/fuzz/corpus/"):
        return False
    return bool(re.search(r"\.(cpp|h|hpp|c|py|cmake|sh|sbatch|toml|lua\.in|tcl\.in|service\.in)$",
                          base)) or base == "CMakeLists.txt" or path.startswith("scripts/") or \
        path in ("bench/plan-scenarios", "bench/sweep", ".ci/run")


def tracked_files():
    p = subprocess.run(["git", "-C", ROOT, "ls-files"], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip("not a git checkout: the list of the repository's files comes from git")
    return p.stdout.split()


def test_every_source_file_has_an_spdx_header():
    files = [f for f in tracked_files() if is_source(f)]
    assert len(files) > 300, len(files)
    missing = []
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8") as fh:
            head = [fh.readline() for _ in range(3)]
        if not any(TAG in line for line in head):
            missing.append(f)
    assert not missing, f"no '{TAG}' in the first 3 lines of: {missing}"


def test_the_license_is_apache_2():
    text = open(os.path.join(ROOT, "LICENSE"), encoding="utf-8").read()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
