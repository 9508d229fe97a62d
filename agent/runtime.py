"""Runs each source on its own schedule: own interval, timeout and backoff, never overlapping itself.

One failing device never delays another: each poll runs as its own asyncio
task bounded by its timeout, and blocking drivers run on their own threads
(exporters.base.BlockingCaller). A failing source logs once until it
recovers, so a dead CDU does not flood the journal every half second; a
crashing collector's traceback is logged once per failure streak too. Leak
and coolant sources back off at most `max_backoff` (2 s by default).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from agent.config import SourceSettings
from agent.loop_calls import call_soon_from_anywhere
from agent.snapshot import SnapshotStore
from exporters.base import EventStream, PollTrigger, Source
from exporters.model import Kind, SourceError

log = logging.getLogger("supernode.runtime")
# A source polled more often than this publishes a poll that read what its last publish did (values, qualities,
# labels; not the times, nor the counters no detector reads: a client's requests) only once this long after it;
# between, its entry is vouched fresh (`SnapshotStore.touch`) and nobody is notified: no detector pass, no fact,
# no status update (issue 38: the two leak inputs' dry polls, four a second, were most of the detectors' and the
# store's work on a demo node). A change, a partial error or a wet leak reading is published at once (a leak's
# confirmation is its second consecutive wet poll); the detectors' holds count on with a publish at least this
# often, and /metrics shows such a counter at most this old.
REPUBLISH_SECONDS = 2.0
LEAK_DETECTED = "supernode_leak_detected"  # exporters.cooling.modbus_metrics.LEAK_DETECTED, which trays fill too
COUNTER = Kind.COUNTER


@dataclass
class ScheduledSource:
    source: Source
    settings: SourceSettings


class SourceRunner:
    """Polls one source into the store, with exponential backoff after consecutive failures."""

    def __init__(self, source: Source, settings: SourceSettings, store: SnapshotStore, stale_after_intervals: float):
        self.source = source
        self.settings = settings
        self.store = store
        store.register(source.name, source.device, settings.interval, stale_after_intervals)
        self.failures = 0
        self.next_allowed = 0.0
        self.polls = 0
        self.running = False
        self.stale_after_intervals = stale_after_intervals
        self.closed = False
        self.again = False  # a poll was asked for while one ran: run one more right after it
        self.stream: EventStream | None = getattr(source, "event_stream", None)
        # Set by rack coordination for a shared device: poll only while it says True (no gate: always). None
        # means "not this agent's to poll at all now": what the source holds open on the device is let go.
        self.gate: Callable[[], bool | None] | None = None
        self.holding = False  # polled since its source last let go of the device (see `_let_go`)
        self._published: tuple[list, float] | None = None  # (the readings of its last publish, monotonic when)
        self.monotonic: Callable[[], float] = time.monotonic  # when its last publish was (a test drives it)
        self._letting_go: asyncio.Task | None = None

    def _attach_stream(self) -> None:
        """Give the source's event stream (if any) a store entry of its own and a thread-safe way into it."""
        stream = self.stream
        if stream is None or stream.attached:
            return
        loop = asyncio.get_running_loop()
        self.store.register(stream.name, stream.device, self.settings.interval, self.stale_after_intervals)

        def publish(readings: list) -> None:
            if not self.closed:
                try:
                    self.store.publish(stream.name, stream.device, readings, 0.0)
                except KeyError:  # unregistered by a reload meanwhile
                    pass

        def fail(kind: str, message: str) -> None:
            if not self.closed:
                log.warning("event stream failed", extra={"source": stream.name, "device": stream.device,
                                                          "kind": kind, "error": message})
                try:
                    self.store.fail(stream.name, stream.device, kind, message, 0.0)
                except KeyError:
                    pass

        def alive() -> None:  # from the stream's thread: the store is thread-safe, and nothing is notified
            if not self.closed:
                try:
                    self.store.touch(stream.name, stream.device)
                except KeyError:
                    pass

        stream.attach(lambda readings: loop.call_soon_threadsafe(publish, readings), self.settings.interval,
                      lambda kind, message: loop.call_soon_threadsafe(fail, kind, message), alive)

    @property
    def job_id(self) -> str:
        return f"{self.source.name}/{self.source.device}"

    def _backoff(self) -> float:
        if self.failures < 2:
            return 0.0
        return min(self.settings.interval * 2 ** (self.failures - 1), self.settings.max_backoff)

    async def run_once(self, timed: bool = False) -> None:
        try:
            await self._run_once(timed)
        except asyncio.CancelledError:
            if not self.closed:
                raise
            # The agent is stopping and abandoned this poll: what it waited on is no failure of the device, and
            # raised on into apscheduler it would be logged as a job error, with a traceback, on every restart.

    async def _run_once(self, timed: bool = False) -> None:
        if self.running or time.monotonic() < self.next_allowed:
            return
        if self.gate is not None:
            allowed = self.gate()
            if not allowed:
                if allowed is None:
                    self._let_go()
                return
        if timed and self._deferred():
            return
        self._attach_stream()
        self.running = True
        self.holding = True
        try:
            await self._poll()
        finally:
            self.running = False
        if self.again and not self.closed:
            # An event arrived during that poll: what it announced may have come after the read.
            self.again = False
            await self._run_once()

    def _deferred(self) -> bool:
        """A timer's poll the source leaves out (a Redfish service whose event stream is confirmed up: its events
        poll at once, and it polls every `confirmed_interval` as the fallback): its store entry is vouched fresh
        instead, since the stream would have told of any change. False (poll) unless its last word was a publish."""
        defer = getattr(self.source, "defer_timed_poll", None)
        return defer is not None and defer() and self.store.touch(self.source.name, self.source.device)

    def _let_go(self) -> None:
        """Another agent polls this device now: a source that holds something open on it (a Redfish event
        subscription and login session) closes it, so the device sees only its pollers as clients."""
        release = getattr(self.source, "release", None)
        if not self.holding or release is None or (self._letting_go is not None and not self._letting_go.done()):
            return
        self.holding = False

        async def run() -> None:
            try:
                await release()
            except Exception as exc:  # the device may be gone: what it held expires there by itself
                log.info("source release failed", extra={"source": self.source.name, "device": self.source.device,
                                                         "error": f"{type(exc).__name__}: {exc}"[:200]})
        self._letting_go = asyncio.ensure_future(run())

    async def _poll(self) -> None:
        start = time.perf_counter()
        src = self.source
        try:
            async with asyncio.timeout(self.settings.timeout):  # in this task: no task of its own per poll
                result = await src.poll()
        except TimeoutError:
            self._failed("timeout", f"poll exceeded {self.settings.timeout}s", start)
        except SourceError as exc:
            self._failed(exc.kind, str(exc), start)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in a collector must not kill the scheduler
            if self.failures == 0:  # the traceback once per failure streak, not on every poll
                log.exception("source poll crashed", extra={"source": src.name, "device": src.device})
            self._failed("internal", f"{type(exc).__name__}: {exc}", start)
        else:
            duration = time.perf_counter() - start
            if self.failures:
                log.info("source recovered", extra={"source": src.name, "device": src.device,
                                                    "after_failures": self.failures})
            self.failures = 0
            self.next_allowed = 0.0
            quiet = result.unchanged or self._reads_the_same(result.readings)
            if not (quiet and not result.partial_errors and self.store.touch(src.name, src.device, duration)):
                self.store.publish(src.name, src.device, result.readings, duration, result.partial_errors)
                self._published = (result.readings, self.monotonic())
        finally:
            self.polls += 1

    def _reads_the_same(self, readings: list) -> bool:
        """Whether this poll may stay unpublished (see REPUBLISH_SECONDS): a source polled more often than that,
        its last publish younger than that, every reading as it was then (same order, family, labels, value and
        quality), and no leak input wet."""
        last = self._published
        if last is None or self.settings.interval >= REPUBLISH_SECONDS or self.monotonic() - last[1] >= REPUBLISH_SECONDS:
            return False
        before = last[0]
        if len(before) != len(readings):
            return False
        read = _read_counters()
        for new, old in zip(readings, before):
            if new.spec is not old.spec or new.quality is not old.quality or new.labels != old.labels:
                return False
            if new.value != old.value and not (new.value != new.value and old.value != old.value) \
                    and (new.spec.kind is not COUNTER or new.spec.name in read):  # NaN = NaN here
                return False
            if new.spec.name == LEAK_DETECTED and new.value >= 0.5:
                return False  # every wet poll is news: the second one confirms the leak
        return True

    def _failed(self, kind: str, message: str, start: float) -> None:
        duration = time.perf_counter() - start
        self.failures += 1
        src = self.source
        if self.failures == 1:
            log.warning("source failed", extra={"source": src.name, "device": src.device, "kind": kind,
                                                "error": message})
        self.store.fail(src.name, src.device, kind, message, duration)
        self.next_allowed = time.monotonic() + self._backoff()


_READ_COUNTERS: frozenset[str] | None = None


def _read_counters() -> frozenset[str]:
    """The counters some detector reads (agent.remediation.detectors, imported on first use: the runtime is the
    daemon's base and must not pull the detectors in with it)."""
    global _READ_COUNTERS
    if _READ_COUNTERS is None:
        from agent.remediation.detectors import Detectors

        _READ_COUNTERS = Detectors.counters()
    return _READ_COUNTERS


class LoopScheduler(AsyncIOScheduler):
    """apscheduler's AsyncIOScheduler, woken on its own loop without a trip through the loop's self-pipe.

    Why: the stock scheduler's timer calls `wakeup`, which always goes through `call_soon_threadsafe`: a write to
    the loop's self-pipe, one more return from epoll and a read, although the timer already runs on the loop.
    A demo follower's timers fire ~5 times a second (its two leak inputs at 0.5 s), and those writes were every
    self-pipe wake-up it had (strace: 47 in 10 s, all from the loop's own thread). Here a timer's fire processes
    the due jobs at once, and a `wakeup` asked on the loop (a job added or moved) is a plain `call_soon`; one asked
    from another thread keeps the thread-safe path."""

    def _start_timer(self, wait_seconds: float | None) -> None:
        self._stop_timer()
        if wait_seconds is not None:
            self._timeout = self._eventloop.call_later(wait_seconds, self._fire)

    def _fire(self) -> None:
        self._stop_timer()
        self._start_timer(self._process_jobs())

    def wakeup(self) -> None:
        if self._eventloop is not None:
            call_soon_from_anywhere(self._eventloop, self._fire)


class SourceScheduler:
    """The set of runners on one scheduler (`LoopScheduler`); `replace` swaps them all on reload.

    Sources of one interval share one apscheduler job, which starts each one's poll as a task of its own: each
    still polls on its own, bounded by its own timeout and backoff, and never overlaps itself, but the timer
    fires once a tick rather than once per source: apscheduler's bookkeeping is ~0.1 ms a fire, and twelve
    jobs at the demo's intervals cost 0.19 % of a core with nothing to poll. A source whose timer moves
    (`align`) leaves its interval's shared job for one at the phase asked, shared in turn by every source of
    that interval moved to that phase (a standby's two leak inputs, both half an interval after their first
    poller: one timer, not two)."""

    def __init__(self, store: SnapshotStore):
        self.store = store
        self.scheduler = LoopScheduler(job_defaults={"max_instances": 1, "coalesce": True,
                                                     "misfire_grace_time": None})
        self.runners: dict[str, SourceRunner] = {}
        self._members: dict[str, list[SourceRunner]] = {}  # job id -> the runners that job starts
        self._timer_of: dict[str, str] = {}  # runner's job id -> the id of the job that starts it
        self._tasks: set[asyncio.Future] = set()  # polls started and not yet done

    def start(self) -> None:
        self.scheduler.start()

    @staticmethod
    def _group_id(interval: float) -> str:
        return f"every {interval:g}s"

    def _add(self, runner: SourceRunner) -> None:
        self.runners[runner.job_id] = runner
        self._attach_trigger(runner)
        interval = runner.settings.interval
        timer_id = self._group_id(interval)
        if timer_id in self._members:
            self._join(timer_id, runner)
        else:
            self._new_timer(timer_id, runner, dt.datetime.now(dt.timezone.utc))

    async def _tick(self, group: list[SourceRunner]) -> None:
        now = time.monotonic()
        for runner in list(group):
            if not runner.running and now >= runner.next_allowed:  # else run_once would return at once
                self._start(runner, timed=True)

    def _start(self, runner: SourceRunner, timed: bool = False) -> None:
        task = asyncio.ensure_future(runner.run_once(timed))
        self._tasks.add(task)  # held until done: the loop keeps only weak references to tasks
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Future) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A poll's own failures are its runner's to count; anything escaping the task is a bug, said here.
            log.error("source poll task crashed", exc_info=task.exception())

    def timer(self, job_id: str) -> Any:
        """The apscheduler job that fires a source's polls: its own, or its interval's shared one (None: unknown)."""
        timer_id = self._timer_of.get(job_id)
        return None if timer_id is None else self.scheduler.get_job(timer_id)

    def poll_now(self, job_id: str, queue: bool = False) -> bool:
        """Poll a source at once, off its timer (a leak confirmation, an event); False if it is unknown, or busy
        and not `queue` (with `queue`, a busy source polls once more as soon as its poll ends)."""
        runner = self.runners.get(job_id)
        if runner is None:
            return False
        if runner.running:
            runner.again = runner.again or queue
            return queue
        self._start(runner)
        return True

    def align(self, job_id: str, anchor: float, offset: float, tolerance: float = 0.1) -> bool:
        """Move a source's timer to fire `offset` seconds after `anchor` (wall clock), modulo its interval, when it
        is more than `tolerance` of an interval off; True if moved.

        Why: two agents polling one leak controller at the same phase see a leak at the same moment, so the second
        poller adds nothing to how soon the rack hears of it; half an interval apart, one of them reads it within
        half an interval. The timer keeps its interval: only the next fire time moves, once."""
        runner, job = self.runners.get(job_id), self.timer(job_id)
        if runner is None or job is None or job.next_run_time is None:
            return False
        interval = runner.settings.interval
        off = (job.next_run_time.timestamp() - anchor - offset) % interval
        if min(off, interval - off) <= tolerance * interval:
            return False
        now = time.time()
        target = anchor + offset + math.ceil((now - anchor - offset) / interval) * interval
        when = dt.datetime.fromtimestamp(target, dt.timezone.utc)
        members = self._members[job.id]
        there = self._phased_timer(interval, target, tolerance, leaving=job.id)
        if there is None and members == [runner] and job.id != self._group_id(interval):
            job.modify(next_run_time=when)  # alone on a timer of its own: that timer moves
            return True
        members.remove(runner)
        if not members:  # a timer that would start nothing is not left to wake the loop
            job.remove()
            del self._members[job.id]
        if there is not None:  # another source of this interval was moved to that phase: its timer starts both
            self._join(there, runner)
            return True
        self._new_timer(job_id if job_id not in self._members else f"{job_id} @{target:.3f}", runner, when)
        return True

    def _new_timer(self, timer_id: str, runner: SourceRunner, first: dt.datetime) -> None:
        """A timer of the runner's interval that starts `runner` (and whoever joins it), first at `first`."""
        group = self._members[timer_id] = []
        self._join(timer_id, runner)
        self.scheduler.add_job(self._tick, "interval", seconds=runner.settings.interval, args=(group,), id=timer_id,
                               next_run_time=first, replace_existing=True)

    def _join(self, timer_id: str, runner: SourceRunner) -> None:
        self._members[timer_id].append(runner)  # the job's own list: it starts the runner from its next fire
        self._timer_of[runner.job_id] = timer_id

    def _phased_timer(self, interval: float, target: float, tolerance: float, leaving: str) -> str | None:
        """The id of a moved timer of `interval` (not its shared one, nor `leaving`) that fires within `tolerance`
        of an interval of the phase of `target`; None if there is none."""
        for timer_id, members in self._members.items():
            if timer_id in (leaving, self._group_id(interval)) or members[0].settings.interval != interval:
                continue
            job = self.scheduler.get_job(timer_id)
            if job is None or job.next_run_time is None:
                continue
            off = (job.next_run_time.timestamp() - target) % interval
            if min(off, interval - off) <= tolerance * interval:
                return timer_id
        return None

    def _attach_trigger(self, runner: SourceRunner) -> None:
        """A source that hears events (a Redfish SSE stream) asks for its own poll through its trigger."""
        trigger = getattr(runner.source, "poll_trigger", None)
        if isinstance(trigger, PollTrigger):
            job_id = runner.job_id
            trigger.attach(lambda: self.poll_now(job_id, queue=True))

    async def replace(self, sources: list[ScheduledSource], stale_after_intervals: float) -> None:
        old = self.runners
        self.runners = {}
        self._members = {}
        self._timer_of = {}
        for job in self.scheduler.get_jobs():
            job.remove()
        new_ids = {f"{s.source.name}/{s.source.device}" for s in sources}
        new_streams = {(s.name, s.device) for s in (getattr(x.source, "event_stream", None) for x in sources) if s}
        for job_id, runner in old.items():
            runner.closed = True
            if job_id not in new_ids:
                self.store.unregister(runner.source.name, runner.source.device)
            if runner.stream is not None and (runner.stream.name, runner.stream.device) not in new_streams:
                self.store.unregister(runner.stream.name, runner.stream.device)
            await _close_quietly(runner.source)
        for s in sources:
            self._add(SourceRunner(s.source, s.settings, self.store, stale_after_intervals))

    async def shutdown(self) -> None:
        """Stop the timers, abandon the polls in flight (a slow device's answer is not waited for), close the sources.

        Polls are cancelled before their sources close, so none fails on a connection closed under it and logs a
        device failure that was only the agent stopping."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)
        for runner in self.runners.values():
            runner.closed = True
        in_flight = list(self._tasks)  # every poll started and not done, reloaded-away runners' ones too
        for task in in_flight:
            task.cancel()
        if in_flight:
            await asyncio.wait(in_flight, timeout=2.0)
        for runner in self.runners.values():
            await _close_quietly(runner.source)


async def _close_quietly(source: Source) -> None:
    try:
        async with asyncio.timeout(2.0):
            await source.close()
    except Exception:  # closing a dead device must not block shutdown or reload
        log.debug("source close failed", extra={"source": source.name, "device": source.device})
