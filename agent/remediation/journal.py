"""The action journal: append-only SQLite in WAL mode under the state directory.

Why: intent is written (and committed) before an action touches a device
and the result after, so a crash between the two leaves a visible "intent
without result" that `engine.start()` reconciles against real state before
anything else runs. Incidents, blocked decisions and webhook deliveries go
in the same file, so "what did the agent do and why" has one answer.
Rows are never updated, and never deleted but by retention (triggers refuse anything else).

The journal is in parts, one job each: the file's schema, migrations and
opening (journal_file.py), retention (journal_retention.py), the writer thread
(journal_writer.py). This module is the Journal itself: opening and closing,
the in-memory indexes, the reads and the webhook deliveries. Reads merge the
committed rows with the queued ones, and the indexes the engine asks on its
hot path (last result of an action, its first intent, webhook alerts seen)
live in memory.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from .journal_file import SCHEMA_V1, SCHEMA_VERSION, COLUMNS, Entry, JournalError, _entry, open_db
from .journal_retention import Pruned, Retention, apply_retention
from .journal_writer import JournalWriter

__all__ = ["SCHEMA_V1", "SCHEMA_VERSION", "Entry", "Journal", "JournalError", "Retention"]

log = logging.getLogger("supernode.journal")


class Journal(JournalWriter):
    """Append-only rows: queued in memory at once, committed in order by one writer thread.

    `open()` (first append, or the engine's start, off the event loop) opens the file, moves a corrupt
    one aside and loads the in-memory indexes. Reads never wait for a write.
    """

    def __init__(self, path: Path | str, readonly: bool = False, max_backoff: float = 2.0,
                 retention: Retention | None = None, retention_every: float = 86400.0):
        self.path = Path(path)
        self.readonly = readonly
        self.retention = retention
        self.retention_every = retention_every  # a long-running agent prunes again this often (writer thread)
        self._next_retention = time.monotonic() + retention_every
        self.max_backoff = max_backoff
        self.moved_aside: Path | None = None
        self.writable = True
        self.errors_total = 0
        self.last_error = ""
        self._db: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._read_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pending: deque[tuple] = deque()
        self._next_seq = 1
        self._last_result: dict[str, Entry] = {}
        self._first_intent: dict[str, Entry] = {}
        self._alerts: set[tuple[str, str, str]] = set()
        self._committed_seq = 0  # every row up to this one is on disk
        self._commit_waiters: list[tuple[int, asyncio.Future]] = []
        self._stalled = False  # a wait ran out and nothing has committed since: later waits do not wait
        self._thread: threading.Thread | None = None
        self._closing = False
        self._opened = False
        # Told every row as it is queued (the engine's goodput tracker, agent/goodput_metrics.py); one slot, so
        # a reload's engine replaces its predecessor's instead of adding to it.
        self.on_append: Callable[[Entry], None] | None = None
        if not readonly:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    # -- open / close ----------------------------------------------------------------

    def open(self) -> None:
        """Open (once): raises JournalError if not even a fresh journal can be opened."""
        with self._cond:
            if self._opened or self.readonly:
                return
            self._db, self.moved_aside = open_db(self.path)
            if self.moved_aside is not None and self._reader is not None:
                self._reader.close()  # it read the file now moved aside
                self._reader = None
            pruned = self._retain()
            for e in self._read_db(0):
                self._index(e)
                self._next_seq = max(self._next_seq, e.seq + 1)
            self._committed_seq = self._next_seq - 1
            for row in self._db.execute("SELECT fingerprint, starts_at, status FROM webhook_alerts"):
                self._alerts.add(tuple(row))
            self._opened = True
            self._thread = threading.Thread(target=self._writer, name="journal-writer", daemon=True)
            self._thread.start()
        if self.moved_aside is not None:
            self.append("journal", result="moved_aside", detail={"moved_to": str(self.moved_aside)})
        if pruned and any(pruned.counts.values()):
            self.append("retention", result="pruned", detail=pruned.counts)

    def _retain_while_running(self) -> None:
        """Retention on the writer thread (the connection's only user once open): rows, then the indexes."""
        self._next_retention = time.monotonic() + self.retention_every
        pruned = self._retain()
        if not pruned or not any(pruned.counts.values()):
            return
        with self._cond:
            for index in (self._last_result, self._first_intent):
                for aid in [aid for aid, e in index.items() if e.incident_id in pruned.incidents]:
                    del index[aid]
            self._alerts = {k for k in self._alerts if (k[0], k[1]) not in pruned.alerts}
        self.append("retention", result="pruned", detail=pruned.counts)

    def _retention_wait(self) -> float | None:
        """Seconds until the next retention pass is due (0: due now), or None when there is no retention."""
        if self.retention is None:
            return None
        return max(0.0, self._next_retention - time.monotonic())

    def _retain(self) -> Pruned | None:
        """Retention at open (before the replay: what start reads stays bounded) and then every
        `retention_every` seconds. A failure keeps every row."""
        if self.retention is None or self._db is None:
            return None
        try:
            return apply_retention(self._db, self.retention, time.time())
        except sqlite3.Error as exc:
            log.error("journal retention failed: every row kept", extra={"error": str(exc)})
            return None

    def close(self, timeout: float = 2.0) -> None:
        if self._opened and not self.flush(timeout):
            log.error("journal closed with rows not written", extra={"rows": len(self._pending),
                                                                    "error": self.last_error})
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        with self._read_lock:
            for db in (self._db, self._reader):
                if db is not None:
                    db.close()
            self._db = self._reader = None

    # -- writing -----------------------------------------------------------------------

    def _index(self, e: Entry) -> None:
        if not e.action_id:
            return
        if e.kind == "result":
            self._last_result[e.action_id] = e
        elif e.kind == "intent":
            self._first_intent.setdefault(e.action_id, e)

    # -- reading -----------------------------------------------------------------------

    def _read_db(self, since_seq: int, incident_id: str | None = None) -> list[Entry]:
        if not self.path.exists():
            return []
        sql = f"SELECT {COLUMNS} FROM journal WHERE seq > ?"
        args: list[Any] = [since_seq]
        if incident_id:
            sql += " AND incident_id = ?"
            args.append(incident_id)
        with self._read_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
            return [_entry(r) for r in self._reader.execute(sql + " ORDER BY seq", args).fetchall()]

    def entries(self, limit: int | None = None, incident_id: str | None = None, since_seq: int = 0) -> list[Entry]:
        """Committed and queued rows in order (reads the file: call it off the event loop)."""
        with self._cond:
            queued = [_entry(v) for t, v in self._pending if t == "journal"]
        rows = {e.seq: e for e in self._read_db(since_seq, incident_id)}
        for e in queued:
            if e.seq > since_seq and (not incident_id or e.incident_id == incident_id):
                rows.setdefault(e.seq, e)
        out = [rows[k] for k in sorted(rows)]
        return out[-limit:] if limit else out

    def last_result(self, action_id: str) -> Entry | None:
        """The latest result row for an action id (done, failed, undone...), or None (from memory)."""
        if not self._opened and not self.readonly:
            self.open()
        with self._cond:
            return self._last_result.get(action_id)

    def intent(self, action_id: str) -> Entry | None:
        """The first intent of an action id (its plan carries what the agent owned), from memory."""
        if not self._opened and not self.readonly:
            self.open()
        with self._cond:
            return self._first_intent.get(action_id)

    def unfinished_intents(self) -> list[Entry]:
        """Intents with no result row after them: what a crash may have left half-applied."""
        open_: dict[str, Entry] = {}
        for e in self.entries():
            if e.kind == "intent" and e.action_id:
                open_[e.action_id] = e
            elif e.kind == "result" and e.action_id and e.action_id in open_ and open_[e.action_id].seq < e.seq:
                del open_[e.action_id]
        return sorted(open_.values(), key=lambda e: e.seq)

    # -- webhook deliveries ---------------------------------------------------------------

    def alert_seen(self, fingerprint: str, starts_at: str, status: str) -> bool:
        if not self._opened:
            self.open()
        with self._cond:
            return (fingerprint, starts_at, status) in self._alerts

    def record_alert(self, fingerprint: str, starts_at: str, status: str) -> bool:
        """Record one Alertmanager alert (after the engine accepted it); False if it was seen before."""
        if not self._opened:
            self.open()
        key = (fingerprint, starts_at, status)
        with self._cond:
            if key in self._alerts:
                return False
            self._alerts.add(key)
            self._pending.append(("webhook_alerts", (*key, time.time())))
            self._cond.notify_all()
        return True
