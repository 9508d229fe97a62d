"""Metric names used by rules and dashboards, checked against ../shared/METRICS.md (the contract)."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO

METRICS_MD = REPO.parent / "shared" / "METRICS.md"
# Named by the lead's brief for the remediation guardrails but not (yet) in METRICS.md.
# supernode_cdu_pump_speed_setpoint_ratio: exported by the CDU profiles (exporters/modbus_metrics.py); the
# flow-low rule holds off after a set point change.
EXTRA = {"supernode_remediation_circuit_breaker_open", "supernode_cdu_pump_speed_setpoint_ratio",
         # issue 10: the engine's own faults (journal on a failing disk, remediation not running)
         "supernode_journal_writable", "supernode_journal_errors_total", "supernode_journal_pending_entries",
         "supernode_journal_moved_aside", "supernode_remediation_degraded"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_NAME = re.compile(r"(?<![:\w])(supernode_[a-z0-9_]+)")


def metric_names(expr: str) -> set[str]:
    """`supernode_*` metric names in a PromQL expression (recording rule names contain ':' and are skipped)."""
    return set(_NAME.findall(expr))


def catalogue() -> set[str]:
    """Every name METRICS.md declares, with its `, _suffix` siblings and `_pending`/`_failure` variants."""
    if not METRICS_MD.exists():
        pytest.fail(f"{METRICS_MD} missing")
    names = set(EXTRA)
    for line in METRICS_MD.read_text().splitlines():
        if not line.startswith("| supernode_"):
            continue
        first = line.split("|")[1].strip()
        base, *siblings = [part.strip() for part in first.split(",")]
        names.add(base)
        tokens = base.split("_")
        for sib in siblings:
            if sib.startswith("supernode_"):
                names.add(sib)
                continue
            names.update("_".join(tokens[:i]) + sib for i in range(2, len(tokens)))
        for extra in re.findall(r"`(_[a-z_]+)`", line.split("|")[-2]):
            names.add(base + extra)
        if "histogram" in line:
            names.update(base + s for s in HISTOGRAM_SUFFIXES)
    return names
