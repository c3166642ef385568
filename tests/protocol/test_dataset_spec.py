# SPDX-License-Identifier: Apache-2.0
"""The Python package's dataset-spec parser (python/solar/dataset.py's parse_dataset_spec, and
split_dataset_spec, the split as written) against the golden table every parser is tested with
(dataset_spec_cases.json), as tests/protocol/dataset_spec_test.cpp holds protocol's to it.
Specs the front ends refuse are not its to refuse: it says what they are, as protocol does."""
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))
from solar.dataset import parse_dataset_spec, split_dataset_spec  # noqa: E402

CASES = json.loads((HERE / "dataset_spec_cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", [pytest.param(c, id=repr(c["spec"])) for c in CASES])
def test_python_parses_as_the_table_says(case):
    d = parse_dataset_spec(case["spec"])
    if "file" in case:
        assert (d.kind, d.file, d.dataset) == ("file", case["file"], case["dataset"])
        assert (d.list, d.glob, d.rows) == (case.get("list", False), case.get("glob", False),
                                            case.get("rows", False))
        # The split as written is the parse before the @ and the [] come off.
        if not d.list and not d.rows:
            assert split_dataset_spec(case["spec"]) == (case["file"], case["dataset"])
    elif case.get("fabric"):
        assert d.kind == "fabric" and d.file is None and d.dataset is None
        assert split_dataset_spec(case["spec"]) == (None, None)
    else:
        assert d.kind == case["error"] and d.file is None


def test_the_split_keeps_the_at_and_the_brackets():
    """split_dataset_spec's contract is FILE[:/DATASET] as written (solar-stored's --export
    NAME=FILE[:/DATASET] splits so): parse_dataset_spec is what takes `@` and `[]` off."""
    assert split_dataset_spec("@files.txt:/x") == ("@files.txt", "/x")
    assert split_dataset_spec("dlio/:/records[]") == ("dlio/", "/records[]")


def test_the_table_covers_every_form():
    assert len(CASES) > 10
    assert {k for c in CASES for k in ("list", "glob", "rows", "fabric") if c.get(k)} == \
        {"list", "glob", "rows", "fabric"}
    assert {c["error"] for c in CASES if "error" in c} == {"unknown_scheme", "no_file"}
