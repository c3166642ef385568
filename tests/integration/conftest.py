# SPDX-License-Identifier: Apache-2.0
"""The integration tests' shared helpers are tests/testlib.py: its folder goes on sys.path
before pytest imports the test files."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
