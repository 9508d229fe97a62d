"""Sources of one interval share a timer, and still poll on their own: a stuck one holds up neither the others nor
itself (it never overlaps its own poll in flight), on a real AsyncIOScheduler."""

from __future__ import annotations

import asyncio
import threading

from agent.config import SourceSettings
from agent.runtime import LoopScheduler, ScheduledSource, SourceScheduler
from agent.snapshot import SnapshotStore
from exporters.model import PollResult
from tests.helpers import await_for


class Counting:
    """A source that counts its polls; while `stuck`, a poll waits until released (a device that does not answer)."""

    def __init__(self, device: str, stuck: bool = False, beside: "Counting | None" = None):
        self.name, self.device = "cdu", device
        self.beside = beside
        self.polls = 0
        self.polls_beside_stuck = 0  # polls made while `beside` had one of its own in flight
        self.in_flight = 0
        self.most_in_flight = 0
        self.release = asyncio.Event()
        if not stuck:
            self.release.set()

    async def poll(self) -> PollResult:
        self.polls += 1
        if self.beside is not None and self.beside.in_flight:
            self.polls_beside_stuck += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.release.wait()
        finally:
            self.in_flight -= 1
        return PollResult([])

    async def close(self) -> None:
        return None


def test_one_timer_per_interval_and_a_stuck_source_holds_up_no_other():
    async def run() -> None:
        stuck = Counting("stuck", stuck=True)
        fast, slow = Counting("fast", beside=stuck), Counting("slow")
        every_tick = SourceSettings(interval=0.1, timeout=0.4)
        sched = SourceScheduler(SnapshotStore())
        sched.start()
        try:
            await sched.replace([ScheduledSource(fast, every_tick), ScheduledSource(stuck, every_tick),
                                 ScheduledSource(slow, SourceSettings(interval=60.0, timeout=1.0))], 3.0)
            assert sorted(job.id for job in sched.scheduler.get_jobs()) == ["every 0.1s", "every 60s"]
            assert sched.timer("cdu/fast").id == sched.timer("cdu/stuck").id == "every 0.1s"
            await await_for(lambda: fast.polls_beside_stuck >= 5, 10, what="polls of a source while the other is stuck")
            await await_for(lambda: stuck.polls >= 2, 10, what="the stuck poll timed out and the next one started")
            assert stuck.most_in_flight == 1, "a source never overlaps its own poll"
            stuck.release.set()
            await await_for(lambda: any(s.device == "stuck" and s.up for s in sched.store.states()), 10,
                            what="the stuck source answering again")
            assert slow.polls == 1, "the 60 s source polled once, at its start, not on the 0.1 s timer"
        finally:
            await sched.shutdown()

    asyncio.run(run())


def test_the_timers_fire_on_the_loop_without_a_trip_through_its_self_pipe():
    """apscheduler's own AsyncIOScheduler hands every timer fire to `call_soon_threadsafe` (a write to the loop's
    self-pipe and one more wake-up); the agent's fires its jobs where the timer runs. A job added from another thread
    still reaches the loop."""
    async def run() -> None:
        loop = asyncio.get_running_loop()
        loop_thread = threading.current_thread()
        threadsafe_calls = []  # for each call: was it made on the loop's own thread, and what it asked to run
        plain = loop.call_soon_threadsafe

        def counted(callback, *args, **kwargs):
            threadsafe_calls.append((threading.current_thread() is loop_thread, getattr(callback, "__func__", None)))
            return plain(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counted
        ticking = Counting("ticking")
        sched = SourceScheduler(SnapshotStore())
        sched.start()
        try:
            await sched.replace([ScheduledSource(ticking, SourceSettings(interval=0.05, timeout=0.2))], 3.0)
            await await_for(lambda: ticking.polls >= 10, 10, what="ten polls on the 0.05 s timer")
            assert not any(on_loop for on_loop, _ in threadsafe_calls), "a timer's fire went through the self-pipe"

            fired = asyncio.Event()

            async def mark() -> None:
                fired.set()

            adder = threading.Thread(target=sched.scheduler.add_job, args=(mark, "date"))  # a job added off the loop
            adder.start()
            await asyncio.to_thread(adder.join)
            await asyncio.wait_for(fired.wait(), 10)
            assert (False, LoopScheduler._fire) in threadsafe_calls, "off the loop the wake-up takes the thread-safe path"
        finally:
            await sched.shutdown()
            loop.call_soon_threadsafe = plain

    asyncio.run(run())
