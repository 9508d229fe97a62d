"""The journal's schema version, its migration from the format written before versions, and retention.

The old format is taken from a real file, never from the current code: tests/fixtures/journal-pre-version/journal.db
was written by the journal module of commit ff77abe, before versions existed (its README says how). The migration
test migrates that file; the retention tests build their rows on its schema.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

from agent.remediation.journal import SCHEMA_VERSION, Journal, JournalError, Retention
from tests.helpers import REPO

DAY = 86400.0
OLD_FILE = REPO / "tests" / "fixtures" / "journal-pre-version" / "journal.db"


def _read(path: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


# The schema of the real old file (tables, indexes, triggers), as that agent created it.
PRE_VERSION_SCHEMA = ";\n".join(sql for (sql,) in _read(OLD_FILE, "SELECT sql FROM sqlite_master WHERE sql IS NOT NULL "
                                                                  "AND name != 'sqlite_sequence' ORDER BY rowid")) + ";"


def old_journal(path: Path, now: float) -> tuple[list[tuple], list[tuple]]:
    """A journal in the pre-version format with a little of everything; returns its rows."""
    old, recent = now - 100 * DAY, now - 1 * DAY
    rows = [
        # inc-a: resolved 100 days ago, its action finished: retention may remove it.
        (old, "incident", None, "inc-a", "leak-response", None, None, "open", '{"state": "open"}'),
        (old, "intent", "a1", "inc-a", "leak-response", "drain", "node01", None, "{}"),
        (old, "result", "a1", "inc-a", "leak-response", "drain", "node01", "done", "{}"),
        (old, "incident", None, "inc-a", "leak-response", None, None, "resolved", '{"state": "resolved"}'),
        # inc-b: resolved 100 days ago but an intent never got its result: kept for a person.
        (old, "incident", None, "inc-b", "gpu-lost", None, None, "open", "{}"),
        (old, "intent", "b1", "inc-b", "gpu-lost", "drain", "node02", None, "{}"),
        (old, "incident", None, "inc-b", "gpu-lost", None, None, "resolved", "{}"),
        # inc-c: old and still open: kept.
        (old, "incident", None, "inc-c", "nvlink-errors", None, None, "open", "{}"),
        # inc-d: resolved yesterday: kept.
        (recent, "incident", None, "inc-d", "gpu-thermal", None, None, "open", "{}"),
        (recent, "incident", None, "inc-d", "gpu-thermal", None, None, "resolved", "{}"),
        # Rows of no incident (the breaker): kept.
        (old, "breaker", None, None, None, None, None, "open", '{"actions": 31}'),
    ]
    webhook = [("fp-x", "2026-01-01T00:00:00Z", "firing", now - 10 * DAY),   # resolved 10 days ago: spent
               ("fp-x", "2026-01-01T00:00:00Z", "resolved", now - 10 * DAY),
               ("fp-y", "2026-01-02T00:00:00Z", "firing", now - 10 * DAY),   # never resolved: may still fire
               ("fp-z", "2026-01-03T00:00:00Z", "firing", recent),           # resolved yesterday: still of use
               ("fp-z", "2026-01-03T00:00:00Z", "resolved", recent)]
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(PRE_VERSION_SCHEMA)
    db.executemany("INSERT INTO journal(ts, kind, action_id, incident_id, playbook, action, target, result, detail) "
                   "VALUES (?,?,?,?,?,?,?,?,?)", rows)
    db.executemany("INSERT INTO webhook_alerts VALUES (?,?,?,?)", webhook)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    db.close()
    return rows, webhook


def _version(path: Path) -> int:
    db = sqlite3.connect(str(path))
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


def test_a_journal_of_the_pre_version_format_is_migrated_and_nothing_is_lost(tmp_path):
    """The real old file (no user_version) opens in the current agent: every row and webhook alert kept, the
    replay indexes rebuilt from it, the triggers still append-only, and the file at the current version."""
    path = tmp_path / "journal.db"
    shutil.copy(OLD_FILE, path)
    assert _version(path) == 0
    rows = _read(path, "SELECT ts, kind, action_id, incident_id, playbook, action, target, result, detail "
                       "FROM journal ORDER BY seq")
    webhook = _read(path, "SELECT fingerprint, starts_at, status FROM webhook_alerts")
    assert len(rows) == 8 and len(webhook) == 3  # what the fixture's README says it holds
    j = Journal(path)  # no retention: the migration alone
    j.open()
    try:
        entries = j.entries()
        assert [(e.ts, e.kind, e.action_id, e.incident_id, e.playbook, e.action, e.target, e.result, e.detail)
                for e in entries] == [(*r[:8], json.loads(r[8])) for r in rows]
        assert all(j.alert_seen(*key) for key in webhook)
        assert not j.alert_seen("fp-y", "2026-01-02T00:00:00Z", "resolved")
        assert j.last_result("a1").result == "done" and [e.action_id for e in j.unfinished_intents()] == ["b1"]
        assert j.intent("a1").detail == {"plan": {"reason": "x"}}
        j.append("incident", incident_id="inc-e", result="open")
        assert j.flush()
    finally:
        j.close()
    assert _version(path) == SCHEMA_VERSION == 2
    db = sqlite3.connect(str(path), isolation_level=None)
    try:
        assert db.execute("SELECT COUNT(*) FROM journal").fetchone()[0] == len(rows) + 1
        # Still append-only outside retention: neither update nor delete.
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("DELETE FROM journal WHERE incident_id = 'inc-a'")
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute("UPDATE journal SET result = 'x'")
    finally:
        db.close()
    again = Journal(path)  # a second open migrates nothing and keeps everything
    again.open()
    try:
        assert len(again.entries()) == len(rows) + 1
    finally:
        again.close()


def test_retention_removes_only_old_resolved_incidents_and_spent_webhook_rows(tmp_path):
    path = tmp_path / "journal.db"
    rows, _ = old_journal(path, time.time())
    j = Journal(path, retention=Retention(resolved_incident_seconds=90 * DAY, webhook_dedup_seconds=7 * DAY))
    j.open()
    try:
        entries = j.entries()
        assert {e.incident_id for e in entries if e.incident_id} == {"inc-b", "inc-c", "inc-d"}
        assert sum(e.kind == "breaker" for e in entries) == 1
        assert len([e for e in entries if e.incident_id]) == len(rows) - 4 - 1  # inc-a's 4 rows; not the breaker
        pruned = [e for e in entries if e.kind == "retention"]
        assert [p.detail for p in pruned] == [{"incidents": 1, "journal_rows": 4, "webhook_rows": 2}]
        assert not j.alert_seen("fp-x", "2026-01-01T00:00:00Z", "firing")
        assert not j.alert_seen("fp-x", "2026-01-01T00:00:00Z", "resolved")
        assert j.alert_seen("fp-y", "2026-01-02T00:00:00Z", "firing")
        assert j.alert_seen("fp-z", "2026-01-03T00:00:00Z", "resolved")
        assert j.last_result("a1") is None  # the replay no longer carries what was removed
    finally:
        j.close()
    assert _version(path) == SCHEMA_VERSION


def test_a_journal_from_a_newer_agent_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "journal.db"
    old_journal(path, time.time())
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode=DELETE")  # one file, so its bytes say whether anything was written
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 7}")
    db.close()
    before = path.read_bytes()
    j = Journal(path, retention=Retention(1.0, 1.0))
    with pytest.raises(JournalError, match="newer than this agent"):
        j.open()
    j.close()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if "corrupt" in p.name] == []


def test_retention_is_configured_from_the_remediation_settings(tmp_path):
    from tests.remediation_support import identity, inventory

    from agent.remediation.engine import RemediationEngine
    from agent.remediation.settings import RemediationSettings

    settings = RemediationSettings.model_validate({"journal_retention": {"resolved_incident_days": 30,
                                                                         "webhook_dedup_days": None}})
    eng = RemediationEngine(settings, "observe", identity("observe"), inventory(), tmp_path / "journal.db")
    assert eng.journal.retention == Retention(30 * DAY, None)
    default = RemediationEngine(RemediationSettings(), "observe", identity("observe"), inventory(),
                                tmp_path / "j2.db")
    assert default.journal.retention == Retention(90 * DAY, 7 * DAY)


def test_a_running_journal_prunes_again_and_forgets_what_it_removed(tmp_path):
    """A long-running agent: retention runs on the writer thread every `retention_every` seconds."""
    from tests.helpers import wait_for

    j = Journal(tmp_path / "journal.db", retention=Retention(90 * DAY, 7 * DAY), retention_every=0.2)
    j.open()
    try:
        old = time.time() - 100 * DAY
        j.append("incident", incident_id="inc-old", result="open", ts=old)
        j.append("intent", action_id="x1", incident_id="inc-old", action="drain", ts=old)
        j.append("result", action_id="x1", incident_id="inc-old", action="drain", result="done", ts=old)
        j.append("incident", incident_id="inc-old", result="resolved", ts=old)
        j.append("incident", incident_id="inc-new", result="resolved")
        wait_for(lambda: any(e.kind == "retention" for e in j.entries()), 30, what="a retention pass while running")
        assert j.last_result("x1") is None and j.intent("x1") is None
        assert {e.incident_id for e in j.entries() if e.incident_id} == {"inc-new"}
        retention = [e.detail for e in j.entries() if e.kind == "retention"]
        assert retention[0] == {"incidents": 1, "journal_rows": 4, "webhook_rows": 0}
        j.append("breaker", result="open")  # the writer still commits after its passes
        assert j.flush()
    finally:
        j.close()
