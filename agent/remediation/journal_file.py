"""The journal's file: its SQLite schema, the migrations between versions, opening it (a corrupt one moved aside).

Why apart from the Journal: the format (tables, triggers, versions) changes
only by adding a migration, and opening a file (its version, its integrity, a
corrupt one moved aside) is done before any row is queued or read; the
Journal above it only queues, commits and reads rows.

Why a schema version: the file outlives the code that wrote it. `PRAGMA user_version`
says which migrations a file has had; `open()` applies the missing ones in order,
each in one transaction with its version bump (a crash leaves the old version, whole).
A journal written before versions existed (user_version 0 with the tables present)
is version 1. A file from a newer agent is refused, never moved aside or rewritten.

Why move a corrupt file aside: a journal that cannot be read must cost
remediation its history, never the agent its observation; the damaged
file is kept (`journal.db.corrupt-<time>`) for a person to look at.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("supernode.journal")
COLUMNS = "seq, ts, kind, action_id, incident_id, playbook, action, target, result, detail"

# Migration N takes a file from version N-1 to N; 1 is the format written before versions existed.
# A released migration never changes (files on disk were made by it): a change is a new migration.
SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS journal (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  ts REAL NOT NULL,
  kind TEXT NOT NULL,            -- intent, result, blocked, incident, approval, breaker
  action_id TEXT,
  incident_id TEXT,
  playbook TEXT,
  action TEXT,
  target TEXT,
  result TEXT,                   -- done, dry_run, failed, undone, blocked, reconciled_*, open, resolved...
  detail TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS journal_action ON journal(action_id);
CREATE INDEX IF NOT EXISTS journal_incident ON journal(incident_id);
CREATE TABLE IF NOT EXISTS webhook_alerts (
  fingerprint TEXT NOT NULL,
  starts_at TEXT NOT NULL,
  status TEXT NOT NULL,
  ts REAL NOT NULL,
  PRIMARY KEY (fingerprint, starts_at, status)
);
CREATE TRIGGER IF NOT EXISTS journal_no_update BEFORE UPDATE ON journal
  BEGIN SELECT RAISE(ABORT, 'journal is append-only'); END;
CREATE TRIGGER IF NOT EXISTS journal_no_delete BEFORE DELETE ON journal
  BEGIN SELECT RAISE(ABORT, 'journal is append-only'); END;
"""
SCHEMA_V2 = """
CREATE TABLE journal_retention_run (started REAL NOT NULL);
DROP TRIGGER journal_no_delete;
CREATE TRIGGER journal_no_delete BEFORE DELETE ON journal
  WHEN NOT EXISTS (SELECT 1 FROM journal_retention_run)
  BEGIN SELECT RAISE(ABORT, 'journal is append-only (only retention deletes)'); END;
CREATE INDEX journal_ts ON journal(ts);
CREATE INDEX webhook_alerts_ts ON webhook_alerts(ts);
"""
MIGRATIONS = {1: SCHEMA_V1, 2: SCHEMA_V2}
SCHEMA_VERSION = max(MIGRATIONS)


@dataclass(frozen=True, slots=True)
class Entry:
    seq: int
    ts: float
    kind: str
    action_id: str | None
    incident_id: str | None
    playbook: str | None
    action: str | None
    target: str | None
    result: str | None
    detail: dict[str, Any]


def _entry(row: tuple) -> Entry:
    return Entry(*row[:9], json.loads(row[9] or "{}"))


class JournalError(Exception):
    """The journal cannot be opened (not even a fresh one): remediation runs degraded."""


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None, timeout=5.0)
    try:
        _refuse_newer(db, path)  # before anything writes to the file, even the WAL switch
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        check = db.execute("PRAGMA quick_check").fetchone()
        if not check or check[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
        migrate(db, path)
    except BaseException:
        db.close()
        raise
    return db


def schema_version(db: sqlite3.Connection) -> int:
    """The file's version: user_version, or 1 for a journal written before versions existed."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version == 0 and db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='journal'").fetchone():
        return 1
    return int(version)


def _refuse_newer(db: sqlite3.Connection, path: Path) -> None:
    version = schema_version(db)
    if version > SCHEMA_VERSION:
        raise JournalError(f"{path}: journal schema version {version} is newer than this agent's ({SCHEMA_VERSION}); "
                           "left untouched")


def migrate(db: sqlite3.Connection, path: Path) -> int:
    """Apply the missing migrations in order, each with its version bump in one transaction."""
    _refuse_newer(db, path)
    version = schema_version(db)
    for target in range(version + 1, SCHEMA_VERSION + 1):
        try:
            db.executescript(f"BEGIN IMMEDIATE;\n{MIGRATIONS[target]}\nPRAGMA user_version = {target};\nCOMMIT;")
        except sqlite3.Error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        if version:
            log.warning("journal migrated", extra={"path": str(path), "from_version": target - 1, "to_version": target})
    return SCHEMA_VERSION


def _corrupt(exc: sqlite3.Error) -> bool:
    """Damage in the file (not a database, malformed), as opposed to a full disk or a lock: only those move aside."""
    return type(exc) is sqlite3.DatabaseError or "malformed" in str(exc) or "not a database" in str(exc)


def open_db(path: Path) -> tuple[sqlite3.Connection, Path | None]:
    """A writable connection; a corrupt file is renamed `<name>.corrupt-<UTC time>` and a fresh one opened."""
    try:
        return _connect(path), None
    except sqlite3.Error as exc:
        if not _corrupt(exc):
            raise JournalError(f"{path}: {exc}") from None
        moved = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}")
        try:
            for suffix in ("", "-wal", "-shm"):
                side = Path(f"{path}{suffix}")
                if side.exists():
                    os.replace(side, Path(f"{moved}{suffix}"))
        except OSError as err:
            raise JournalError(f"{path}: {exc}; could not move it aside: {err}") from None
        log.error("journal unreadable: moved aside, fresh journal opened",
                  extra={"path": str(path), "moved_to": str(moved), "error": str(exc)})
    try:
        return _connect(path), moved
    except sqlite3.Error as exc:
        raise JournalError(f"{path}: fresh journal: {exc}") from None
