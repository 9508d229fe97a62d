"""Metric names used by rules and dashboards, checked against the catalogue the code declares (docs/metrics.md)."""

from __future__ import annotations

import re

from agent.catalogue import declared
from exporters.model import Kind

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_NAME = re.compile(r"(?<![:\w])(supernode_[a-z0-9_]+)")


def metric_names(expr: str) -> set[str]:
    """`supernode_*` metric names in a PromQL expression (recording rule names contain ':' and are skipped)."""
    return set(_NAME.findall(expr))


def catalogue() -> set[str]:
    """Every series name the agent can export: each declared family, with a histogram's sample suffixes."""
    names: set[str] = set()
    for name, (spec, _) in declared().items():
        names.add(name)
        if spec.kind is Kind.HISTOGRAM:
            names.update(name + s for s in HISTOGRAM_SUFFIXES)
    return names
