"""The suite's schedule: test modules run longest first, so the longest never starts last.

Why: `make test` runs modules on parallel workers (pytest-xdist, `--dist loadfile`: a module's tests and peers stay
on one worker). xdist dispatches modules in the order it is given them (`--no-loadscope-reorder`; its own default
orders them by how many tests they hold, which puts a module of five tests that takes three minutes near the end,
where it alone decides when the suite finishes). Longest first (LPT scheduling) keeps every worker busy to the end.

`module_seconds.json` holds each module's measured seconds (a rough figure: it only orders, it never skips or
times anything). A module missing from it (a new one) is placed as if it took DEFAULT_SECONDS. Refresh it from a
run's JUnit report:

    .venv/bin/python -m pytest -n 3 --dist loadfile --junitxml=/tmp/junit.xml ...
    .venv/bin/python -m tests.module_seconds /tmp/junit.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

TABLE = Path(__file__).with_name("module_seconds.json")
DEFAULT_SECONDS = 20.0


def load() -> dict[str, float]:
    """module file name (`test_x.py`) -> seconds; empty when the table is missing or unreadable (order unchanged)."""
    try:
        data = json.loads(TABLE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))} if isinstance(data, dict) else {}


def longest_first(items: list, seconds: dict[str, float]) -> list:
    """`items` (pytest items) with their modules in descending expected seconds; a module's own tests keep their
    order (stable sort), and modules of equal weight keep the collection's order."""
    def weight(item) -> float:
        return -seconds.get(Path(str(item.fspath)).name, DEFAULT_SECONDS)

    return sorted(items, key=weight)


def from_junit(path: Path) -> dict[str, float]:
    """Per-module seconds summed from a JUnit XML report (classname `tests.test_x` or `tests.test_x.Class`)."""
    per: Counter[str] = Counter()
    for case in ET.parse(path).iter("testcase"):
        parts = (case.get("classname") or "").split(".")
        if len(parts) >= 2:
            per[parts[1] + ".py"] += float(case.get("time") or 0.0)
    return {name: round(secs, 1) for name, secs in sorted(per.items())}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.module_seconds JUNIT_XML")
    TABLE.write_text(json.dumps(from_junit(Path(sys.argv[1])), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {TABLE}")
