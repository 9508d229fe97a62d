"""The action journal: append-only SQLite in WAL mode under the state directory.

Why: intent is written (and committed) before an action touches a device
and the result after, so a crash between the two leaves a visible "intent
without result" that `engine.start()` reconciles against real state before
anything else runs. Incidents, blocked decisions and webhook deliveries go
in the same file, so "what did the agent do and why" has one answer.
Rows are never updated, and never deleted but by retention (triggers refuse anything else).

Why a schema version: the file outlives the code that wrote it. `PRAGMA user_version`
says which migrations a file has had; `open()` applies the missing ones in order,
each in one transaction with its version bump (a crash leaves the old version, whole).
A journal written before versions existed (user_version 0 with the tables present)
is version 1. A file from a newer agent is refused, never moved aside or rewritten.

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

Why a writer thread: a full or slow state disk must never stop a safety
step nor the event loop. `append` only queues the row (with its sequence
number) in memory; one thread commits the queue in order and, while the
disk refuses, retries with backoff (capped) and keeps the rows, so they
land once it recovers. A step about to write to a device awaits
`committed(seq)` for its intent (bounded by the caller), which the writer
thread resolves after the commit, so "intent on disk before the device
write" holds whenever the disk answers in time. Reads merge the committed rows with the queued
ones, and the indexes the engine asks on its hot path (last result of an
action, its first intent, webhook alerts seen) live in memory.

Why move a corrupt file aside: a journal that cannot be read must cost
remediation its history, never the agent its observation; the damaged
file is kept (`journal.db.corrupt-<time>`) for a person to look at.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time
from collections import deque
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
class Retention:
    """How long rows are kept; None keeps them forever."""

    resolved_incident_seconds: float | None = None
    webhook_dedup_seconds: float | None = None


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


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(True)


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


class Journal:
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

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued row is committed; False if the disk still refuses after `timeout`."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

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

    def append(self, kind: str, *, action_id: str | None = None, incident_id: str | None = None,
               playbook: str | None = None, action: str | None = None, target: str | None = None,
               result: str | None = None, detail: dict[str, Any] | None = None, ts: float | None = None) -> int:
        """Queue one row (never blocks on the disk); returns its sequence number."""
        if self.readonly:
            raise JournalError(f"{self.path}: opened read-only")
        if not self._opened:
            self.open()
        text = json.dumps(detail or {}, default=str, sort_keys=True)
        with self._cond:
            seq = self._next_seq
            self._next_seq += 1
            row = ("journal", (seq, ts if ts is not None else time.time(), kind, action_id, incident_id, playbook,
                               action, target, result, text))
            self._pending.append(row)
            self._index(_entry(row[1]))
            self._cond.notify_all()
        return seq

    def _index(self, e: Entry) -> None:
        if not e.action_id:
            return
        if e.kind == "result":
            self._last_result[e.action_id] = e
        elif e.kind == "intent":
            self._first_intent.setdefault(e.action_id, e)

    def _writer(self) -> None:
        delay = 0.05
        while True:
            with self._cond:
                while not self._pending and not self._closing and self._retention_wait() != 0.0:
                    self._cond.wait(self._retention_wait())
                if not self._pending and self._closing:
                    return
                batch = list(self._pending)[:256]
            if not batch:  # idle and retention is due
                self._retain_while_running()
                continue
            try:
                self._commit(batch)
            except sqlite3.Error as exc:
                with self._cond:
                    self.errors_total += 1
                    self.last_error = str(exc)
                    if self.writable:
                        log.error("journal write failed: rows kept in memory, retrying",
                                  extra={"error": str(exc), "rows": len(self._pending)})
                    self.writable = False
                    if self._closing:
                        return
                    self._cond.wait(delay)
                delay = min(delay * 2, self.max_backoff)
                continue
            delay = 0.05
            with self._cond:
                for _ in batch:
                    self._pending.popleft()
                self._committed_seq = max([self._committed_seq] + [v[0] for t, v in batch if t == "journal"])
                self._stalled = False
                self._wake_committed()
                if not self.writable:
                    log.warning("journal writable again: queued rows written", extra={"rows": len(batch)})
                self.writable = True
                self._cond.notify_all()

    def _wake_committed(self) -> None:
        """Resolve the waits for rows now on disk (writer thread, under the lock)."""
        still = []
        for seq, fut in self._commit_waiters:
            if seq > self._committed_seq:
                still.append((seq, fut))
                continue
            try:
                fut.get_loop().call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # its loop has closed: nobody waits any more
                pass
        self._commit_waiters = still

    async def committed(self, seq: int, timeout: float) -> bool:
        """True once row `seq` is on disk; False at once when the disk is known to refuse (or a previous
        wait ran out with nothing committed since), else after `timeout` seconds without its commit.
        Why False at once: a disk that is full or hung must cost one wait, not one per step."""
        with self._cond:
            if self._committed_seq >= seq:
                return True
            if self.readonly or not self.writable or self._stalled or timeout <= 0:
                return False
            fut = asyncio.get_running_loop().create_future()
            entry = (seq, fut)
            self._commit_waiters.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await fut
            return True
        except TimeoutError:
            with self._cond:
                if self._committed_seq >= seq:
                    return True
                self._stalled = True
            return False
        finally:
            with self._cond:
                if entry in self._commit_waiters:
                    self._commit_waiters.remove(entry)

    @property
    def commit_waits(self) -> int:
        """Steps waiting now for their intent to reach the disk."""
        with self._cond:
            return len(self._commit_waiters)

    def _commit(self, batch: list[tuple]) -> None:
        db = self._db
        assert db is not None
        try:
            db.execute("BEGIN IMMEDIATE")
            for table, values in batch:
                if table == "journal":
                    db.execute(f"INSERT OR IGNORE INTO journal({COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)", values)
                else:
                    db.execute("INSERT OR IGNORE INTO webhook_alerts VALUES (?,?,?,?)", values)
            db.execute("COMMIT")
        except sqlite3.Error:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise

    @property
    def pending(self) -> int:
        """Rows accepted but not yet on disk (intents kept in memory while the disk refuses)."""
        with self._cond:
            return len(self._pending)

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
