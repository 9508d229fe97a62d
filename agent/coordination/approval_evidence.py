"""What a person is shown with a rack approval: a leak's dry history, carried in the etcd approval record.

Why in the record: the undo of a leak's shared step (the zone valve opened again) waits on the rack leader
for the scope's dry hold and then for a person (agent/remediation/leak_resume.py). That person approves on
any agent (`incidents`, the status page), and only the leader holds the detectors' dry history; so the
leader writes it into the pending record (`evidence`), and writes it again whenever a detector's state,
last wet time or dry start changes (never for the seconds that pass: every reader computes `dry_seconds`
from `dry_since` at the moment it shows the record). An approval written against an older history fails its
compare on the record's revision and is not written: the person sees the new history and approves again.

Read like every rack record (agent.coordination.records): the evidence is checked when the record is
(`approvals.pending_record`): at most MAX_ROWS detectors, names short strings, a state of dry / wet /
unreadable, times that are times and not ahead of the reader's clock by more than the allowed skew, the
hold a number in range. A record whose evidence fails is refused whole, counted, and shown by no agent; the
leader writes its record afresh (as for any record it finds garbled), so a person still gets one to approve,
never one whose history was made up.
"""

from __future__ import annotations

import math
from typing import Any

from agent.coordination.records import RecordError, as_object, wall_time

MAX_ROWS = 512  # every leak detector of an NVL72 rack (18 trays x a few, the zones', the CDUs') many times over
MAX_NAME = 200
MAX_HOLD_SECONDS = 30 * 86400.0
STATES = ("dry", "wet", "unreadable")
ROW_TIMES = ("last_wet_at", "dry_since", "last_read_at")


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise RecordError("evidence", f"{what}: expected a string of at most {MAX_NAME} characters")
    return value


def _time(value: Any, what: str, now: float, skew: float) -> float | None:
    if value is None:
        return None
    try:
        return wall_time(value, what, now, skew)
    except RecordError as exc:
        raise RecordError("evidence", exc.detail) from None


def check(raw: Any, now: float, skew: float) -> dict[str, Any]:
    """The record's `evidence`, checked and reduced to what a reader relies on; RecordError("evidence")."""
    doc = as_object(raw, "evidence")
    hold = doc.get("dry_hold_seconds")
    if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not math.isfinite(hold) \
            or not 0 <= hold <= MAX_HOLD_SECONDS:
        raise RecordError("evidence", f"evidence.dry_hold_seconds: expected 0..{MAX_HOLD_SECONDS:g}")
    rows = doc.get("dry_history")
    if not isinstance(rows, list) or len(rows) > MAX_ROWS:
        raise RecordError("evidence", f"evidence.dry_history: expected a list of at most {MAX_ROWS} detectors")
    out_rows = []
    for i, row in enumerate(rows):
        what = f"evidence.dry_history[{i}]"
        if not isinstance(row, dict):
            raise RecordError("evidence", f"{what}: expected an object")
        state = row.get("state")
        if state not in STATES:
            raise RecordError("evidence", f"{what}.state: expected one of {', '.join(STATES)}")
        clean = {"zone": _text(row.get("zone"), f"{what}.zone"), "sensor": _text(row.get("sensor"), f"{what}.sensor"),
                 "state": state}
        clean.update({k: _time(row.get(k), f"{what}.{k}", now, skew) for k in ROW_TIMES})
        if state == "dry" and clean["dry_since"] is None:
            raise RecordError("evidence", f"{what}: dry without dry_since")
        out_rows.append(clean)
    out: dict[str, Any] = {"leak_scope": _text(doc.get("leak_scope"), "evidence.leak_scope"),
                           "dry_hold_seconds": float(hold), "dry_history": out_rows}
    if doc.get("dry_hold_note") is not None:
        out["dry_hold_note"] = _text(doc["dry_hold_note"], "evidence.dry_hold_note")
    return out


def stored(evidence: dict[str, Any]) -> dict[str, Any]:
    """What the leader writes: the history without the seconds that pass (readers compute them), so the record
    changes only when a detector's state does."""
    out = {k: v for k, v in evidence.items() if k not in ("dry_history", "dry_hold_passed")}
    out["dry_history"] = [{k: v for k, v in row.items() if k != "dry_seconds"} for row in evidence["dry_history"]]
    return out


def view(evidence: dict[str, Any], now: float) -> dict[str, Any]:
    """A checked evidence as every agent lists it, read at `now`: each detector's dry seconds and whether the
    hold has passed for every one of them (as the leader judges it: leak_resume.py)."""
    rows = []
    for row in evidence["dry_history"]:
        dry = row["state"] == "dry" and row["dry_since"] is not None
        rows.append({**row, "dry_seconds": round(max(now - row["dry_since"], 0.0), 1) if dry else 0.0})
    passed = bool(rows) and all(r["state"] == "dry" and r["dry_seconds"] >= evidence["dry_hold_seconds"]
                                for r in rows)
    return {**evidence, "dry_history": rows, "dry_hold_passed": passed}
