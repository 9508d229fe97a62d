"""Per-GPU time budgets for NVML reads: one hung GPU is skipped, the other GPUs keep reporting.

Why threads, and why this shape: an NVML call cannot be cancelled, so a GPU
whose calls block can only be left behind. The GPUs of one cycle are read
one after another on a worker thread (a single hand-off per cycle when all
is well, so the cycle costs what it did on one thread). When the GPU being
read overruns its budget, that worker is left blocked in the driver, the GPU
is marked hung, and a fresh worker carries on with the next GPU. A hung GPU
is then skipped until the blocked call has returned and a cheap probe (one
call, on its own thread) answers within the budget. So at most one thread is
ever blocked per GPU, and a hung GPU costs the cycle one budget, once.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")


class _Hung:
    """A GPU that overran its budget: `idle` is set once none of our threads is blocked on it."""

    __slots__ = ("idle", "answered", "since")

    def __init__(self) -> None:
        self.idle = threading.Event()
        self.answered = False  # the last probe returned within the budget
        self.since = time.time()


class _Batch(Generic[T]):
    """One cycle's GPUs to read, shared by the worker reading them and the cycle waiting on it."""

    __slots__ = ("pending", "read", "results", "lock", "done", "current")

    def __init__(self, todo: list[int], read: Callable[[int], T]):
        self.pending = collections.deque(todo)
        self.read = read
        self.results: dict[int, T | BaseException] = {}
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.current: tuple["_Worker", int, float] | None = None  # (worker, gpu index, monotonic start)


class _Worker:
    """A thread that serves batches; once left blocked on a hung GPU it ends when that call returns."""

    def __init__(self, name: str):
        self.jobs: "queue.SimpleQueue[_Batch | None]" = queue.SimpleQueue()
        self.left_behind: _Hung | None = None  # set (under the batch lock) when the cycle gave up on it
        self.thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self.thread.start()

    def submit(self, batch: _Batch | None) -> None:
        self.jobs.put(batch)

    def _loop(self) -> None:
        while True:
            batch = self.jobs.get()
            if batch is None or not self._serve(batch):
                return

    def _serve(self, batch: _Batch) -> bool:
        """Read GPUs until the batch is empty; False if this worker was left behind (the thread then ends)."""
        while True:
            with batch.lock:
                if not batch.pending:
                    batch.current = None
                    batch.done.set()
                    return True
                i = batch.pending.popleft()
                batch.current = (self, i, time.monotonic())
            try:
                out: Any = batch.read(i)
            except Exception as exc:  # the cycle re-raises it: a bug must not be mistaken for a hang
                out = exc
            with batch.lock:
                if self.left_behind is not None:
                    self.left_behind.idle.set()
                    return False
                batch.results[i] = out
                batch.current = None


class GpuLanes:
    """Reads GPUs 0..count-1 under a per-GPU time budget; `hung()` lists those being skipped."""

    def __init__(self, budget: float, probe: Callable[[int], Any], name: str = "nvml-gpu"):
        self.budget = budget
        self._probe = probe
        self._name = name
        self._worker: _Worker | None = None
        self._hung: dict[int, _Hung] = {}
        self._threads = 0  # workers and probes started (tests check that a hang does not pile threads up)

    def hung(self) -> list[int]:
        return sorted(self._hung)

    def hung_since(self, i: int) -> float | None:
        h = self._hung.get(i)
        return h.since if h is not None else None

    @property
    def threads_started(self) -> int:
        return self._threads

    def read(self, count: int, read: Callable[[int], T]) -> tuple[dict[int, T | BaseException], list[int]]:
        """`read(i)` for every GPU not hung, in order; (results by index, the hung indices below `count`)."""
        for i in [i for i in self._hung if i >= count]:
            del self._hung[i]  # no longer enumerated: the caller reports it as missing
        todo = [i for i in range(count) if not self._still_hung(i)]
        results: dict[int, T | BaseException] = {}
        if todo:
            results = self._run(_Batch(todo, read))
        return results, self.hung()

    def _still_hung(self, i: int) -> bool:
        """True while GPU i is skipped; starts a probe once no thread of ours is blocked on it."""
        h = self._hung.get(i)
        if h is None:
            return False
        if not h.idle.is_set():
            return True
        if h.answered:
            del self._hung[i]
            return False
        h.idle.clear()
        self._start(lambda: self._run_probe(i, h), f"{self._name}-probe{i}")
        return True

    def _run_probe(self, i: int, h: _Hung) -> None:
        start = time.monotonic()
        try:
            self._probe(i)
        except Exception:  # an error is an answer (a lost GPU is read, and reported lost, next cycle)
            pass
        h.answered = time.monotonic() - start <= self.budget
        h.idle.set()

    def _start(self, target: Callable[[], None], name: str) -> None:
        self._threads += 1
        threading.Thread(target=target, name=name, daemon=True).start()

    def _worker_now(self) -> _Worker:
        if self._worker is None:
            self._threads += 1
            self._worker = _Worker(self._name)
        return self._worker

    def _run(self, batch: _Batch[T]) -> dict[int, T | BaseException]:
        self._worker_now().submit(batch)
        while True:
            with batch.lock:
                cur = batch.current
            wait = self.budget if cur is None else cur[2] + self.budget - time.monotonic()
            if batch.done.wait(max(wait, 0.0)):
                return batch.results
            with batch.lock:
                cur = batch.current
                if batch.done.is_set():
                    return batch.results
                if cur is None or time.monotonic() - cur[2] < self.budget:
                    continue
                worker, i, _ = cur
                worker.left_behind = self._hung[i] = _Hung()
                batch.current = None
            self._worker = None  # that one stays blocked in the driver; a fresh worker reads the rest
            self._worker_now().submit(batch)

    def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.submit(None)
            self._worker = None
