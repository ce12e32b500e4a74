"""Shared by every layer of the tests: ``tests/`` on the path, so that ``shared_workers.py``
(rank workers and the values they fill and expect) can be imported by the tests of each
folder and by the rank processes they start (which inherit the path)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
