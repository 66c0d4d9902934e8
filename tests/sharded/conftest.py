"""Fixtures of the sharded checkpoint tests: this folder's helpers on the path."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

#: A script for the two-process tests, run with ``python -c``, never imported.
collect_ignore = ["worker.py"]
