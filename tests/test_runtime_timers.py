"""Sources of one interval share a timer, and still poll on their own: a stuck one holds up neither the others nor
itself (it never overlaps its own poll in flight), on a real AsyncIOScheduler."""

from __future__ import annotations

import asyncio

from agent.config import SourceSettings
from agent.runtime import ScheduledSource, SourceScheduler
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
