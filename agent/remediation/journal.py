"""The action journal: append-only SQLite in WAL mode under the state directory.

Why: intent is written (and committed) before an action touches a device
and the result after, so a crash between the two leaves a visible "intent
without result" that `engine.start()` reconciles against real state before
anything else runs. Incidents, blocked decisions and webhook deliveries go
in the same file, so "what did the agent do and why" has one answer.
Rows are never updated or deleted (triggers refuse it).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
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


class Journal:
    """One connection guarded by a lock; every write commits before returning (durable on return)."""

    def __init__(self, path: Path | str, readonly: bool = False):
        self.path = Path(path)
        if readonly:
            self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def append(self, kind: str, *, action_id: str | None = None, incident_id: str | None = None,
               playbook: str | None = None, action: str | None = None, target: str | None = None,
               result: str | None = None, detail: dict[str, Any] | None = None, ts: float | None = None) -> int:
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO journal(ts, kind, action_id, incident_id, playbook, action, target, result, detail)"
                " VALUES (?,?,?,?,?,?,?,?,?)",
                (ts if ts is not None else time.time(), kind, action_id, incident_id, playbook, action, target,
                 result, json.dumps(detail or {}, default=str, sort_keys=True)))
            return int(cur.lastrowid)

    def entries(self, limit: int | None = None, incident_id: str | None = None, since_seq: int = 0) -> list[Entry]:
        sql = "SELECT seq, ts, kind, action_id, incident_id, playbook, action, target, result, detail FROM journal WHERE seq > ?"
        args: list[Any] = [since_seq]
        if incident_id:
            sql += " AND incident_id = ?"
            args.append(incident_id)
        if limit:
            sql = f"SELECT * FROM ({sql} ORDER BY seq DESC LIMIT ?) ORDER BY seq"
            args.append(limit)
        else:
            sql += " ORDER BY seq"
        with self._lock:
            return [_entry(r) for r in self._db.execute(sql, args).fetchall()]

    def last_result(self, action_id: str) -> Entry | None:
        """The latest result row for an action id (done, failed, undone...), or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT seq, ts, kind, action_id, incident_id, playbook, action, target, result, detail FROM journal"
                " WHERE action_id = ? AND kind = 'result' ORDER BY seq DESC LIMIT 1", (action_id,)).fetchone()
        return _entry(row) if row else None

    def intent(self, action_id: str) -> Entry | None:
        with self._lock:
            row = self._db.execute(
                "SELECT seq, ts, kind, action_id, incident_id, playbook, action, target, result, detail FROM journal"
                " WHERE action_id = ? AND kind = 'intent' ORDER BY seq LIMIT 1", (action_id,)).fetchone()
        return _entry(row) if row else None

    def unfinished_intents(self) -> list[Entry]:
        """Intents with no result row after them: what a crash may have left half-applied."""
        with self._lock:
            rows = self._db.execute(
                "SELECT i.seq, i.ts, i.kind, i.action_id, i.incident_id, i.playbook, i.action, i.target, i.result, i.detail"
                " FROM journal i WHERE i.kind = 'intent' AND NOT EXISTS (SELECT 1 FROM journal r"
                " WHERE r.kind = 'result' AND r.action_id = i.action_id AND r.seq > i.seq) ORDER BY i.seq").fetchall()
        return [_entry(r) for r in rows]

    def record_alert(self, fingerprint: str, starts_at: str, status: str) -> bool:
        """Durably record one Alertmanager alert; False if this (fingerprint, startsAt, status) was seen before."""
        with self._lock:
            try:
                self._db.execute("INSERT INTO webhook_alerts VALUES (?,?,?,?)", (fingerprint, starts_at, status, time.time()))
            except sqlite3.IntegrityError:
                return False
        return True
