"""Journal retention: the one sanctioned delete, of what no longer needs keeping.

Why retention is the one sanctioned delete path: an append-only journal and webhook
table grow forever and are replayed at every start. Retention removes (1) every row
of an incident that resolved, has no row newer than `resolved_incident_seconds` and
no intent left without its result, and (2) the webhook dedup rows of an alert whose
resolved delivery is older than `webhook_dedup_seconds` (Alertmanager stops resending
it long before; a firing alert without a resolved row is kept: it may still fire).
The delete trigger lets a delete through only while the same transaction holds a
row in `journal_retention_run`, which only `apply_retention` writes; what it
removed is itself journaled (kind `retention`). It runs at open, before the replay,
and then every `retention_every` seconds (a day) on the writer thread, the
connection's only user, which also drops the removed keys from the in-memory indexes.

Why apart: deciding what may go (in SQL, in one transaction, with the trigger's
permission row) is separate from when it runs, which the Journal decides.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Retention:
    """How long rows are kept; None keeps them forever."""

    resolved_incident_seconds: float | None = None
    webhook_dedup_seconds: float | None = None


# Incidents retention may remove: resolved, quiet since the cutoff, no intent left without a later result.
_PRUNABLE_INCIDENTS = """
SELECT j.incident_id FROM journal j WHERE j.incident_id IS NOT NULL GROUP BY j.incident_id
HAVING MAX(j.ts) < :cutoff AND SUM(j.kind = 'incident' AND j.result = 'resolved') > 0
AND NOT EXISTS (SELECT 1 FROM journal i WHERE i.incident_id = j.incident_id AND i.kind = 'intent'
                AND NOT EXISTS (SELECT 1 FROM journal r WHERE r.action_id = i.action_id AND r.kind = 'result'
                                AND r.seq > i.seq))
"""
_PRUNABLE_ALERTS = """
SELECT fingerprint, starts_at FROM webhook_alerts WHERE status = 'resolved' AND ts < :cutoff
"""


@dataclass
class Pruned:
    """What one retention pass removed: counts (journaled) and the keys, to drop from the in-memory indexes."""

    counts: dict[str, int]
    incidents: set[str]
    alerts: set[tuple[str, str]]


def apply_retention(db: sqlite3.Connection, retention: Retention, now: float) -> Pruned:
    """The one sanctioned delete: old resolved incidents' rows and spent webhook dedup rows (one transaction)."""
    counts = {"journal_rows": 0, "incidents": 0, "webhook_rows": 0}
    ids: list[str] = []
    spent: list[tuple[str, str]] = []
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("INSERT INTO journal_retention_run VALUES (?)", (now,))
        if retention.resolved_incident_seconds is not None:
            ids = [r[0] for r in db.execute(_PRUNABLE_INCIDENTS, {"cutoff": now - retention.resolved_incident_seconds})]
            for iid in ids:
                counts["journal_rows"] += db.execute("DELETE FROM journal WHERE incident_id = ?", (iid,)).rowcount
            counts["incidents"] = len(ids)
        if retention.webhook_dedup_seconds is not None:
            spent = db.execute(_PRUNABLE_ALERTS, {"cutoff": now - retention.webhook_dedup_seconds}).fetchall()
            for fingerprint, starts_at in spent:
                counts["webhook_rows"] += db.execute("DELETE FROM webhook_alerts WHERE fingerprint = ? AND starts_at = ?",
                                                     (fingerprint, starts_at)).rowcount
        db.execute("DELETE FROM journal_retention_run")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return Pruned(counts, set(ids), {(fp, starts) for fp, starts in spent})
