"""Shared pytest setup: `tests.helpers` and `helpers` both import; the repo root is importable."""

from __future__ import annotations

import sys
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
for p in (str(_TESTS), str(_TESTS.parent)):
    if p not in sys.path:
        sys.path.insert(0, p)
