"""The journal's writer thread: rows queued in memory, committed in order, kept while the disk refuses.

Why a writer thread: a full or slow state disk must never stop a safety
step nor the event loop. `append` only queues the row (with its sequence
number) in memory; one thread commits the queue in order and, while the
disk refuses, retries with backoff (capped) and keeps the rows, so they
land once it recovers. A step about to write to a device awaits
`committed(seq)` for its intent (bounded by the caller), which the writer
thread resolves after the commit, so "intent on disk before the device
write" holds whenever the disk answers in time.

Why apart from the Journal: this is the only code that writes rows to the
file, and the only thread that touches the connection once it is open; the
Journal (journal.py) owns the state below and opens, reads and closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from .journal_file import COLUMNS, JournalError, _entry

log = logging.getLogger("supernode.journal")


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(True)


class JournalWriter:
    """Queue, commit and commit waits, a base of `Journal`: the state is created by `Journal.__init__`, and
    `open`, `_index` (the in-memory indexes) and the retention hooks are the Journal's."""

    path: Path
    readonly: bool
    max_backoff: float
    writable: bool
    errors_total: int
    last_error: str
    _db: sqlite3.Connection | None
    _cond: threading.Condition
    _pending: deque[tuple]
    _next_seq: int
    _committed_seq: int
    _commit_waiters: list[tuple[int, asyncio.Future]]
    _stalled: bool
    _closing: bool
    _opened: bool
    on_append: Any

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
            entry = _entry(row[1])
            self._index(entry)
            self._cond.notify_all()
        if self.on_append is not None:
            try:
                self.on_append(entry)
            except Exception:  # bookkeeping (the goodput series) never fails the row, nor the step writing it
                log.exception("journal row listener failed", extra={"kind": kind})
        return seq

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
