"""The Python package's dataset-spec split (python/solar/dataset.py's split_dataset_spec, the
fallback that finds a sample's layout in the HDF5 file) against the golden table every parser
is tested with (dataset_spec_cases.json). Specs the front ends refuse are not its to refuse."""
import json
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "python"))
from solar.dataset import split_dataset_spec  # noqa: E402

CASES = [c for c in json.loads((HERE / "dataset_spec_cases.json").read_text())["cases"]
         if "error" not in c]


@pytest.mark.parametrize("case", [pytest.param(c, id=repr(c["spec"])) for c in CASES])
def test_python_splits_as_the_table_says(case):
    if case.get("fabric"):
        assert split_dataset_spec(case["spec"]) == (None, None)
    else:
        assert split_dataset_spec(case["spec"]) == (case["file"], case["dataset"])


def test_the_table_has_cases():
    assert len(CASES) > 8 and os.path.basename(__file__)
