"""A source polled more often than REPUBLISH_SECONDS (the leak inputs, twice a second) publishes a poll that read
what its last publish did only every REPUBLISH_SECONDS, and is vouched fresh in between (issue 38); a change, a
wet leak reading (each one: the second confirms the leak) or a partial error is published at once. The runner is
driven poll by poll, its clock by hand; the store and its listeners are the agent's own."""

from __future__ import annotations

import asyncio

from agent.config import SourceSettings
from agent.runtime import REPUBLISH_SECONDS, SourceRunner
from agent.snapshot import SnapshotStore
from exporters.cooling.modbus_metrics import LEAK_DETECTED, REQUESTS
from exporters.model import PollResult, Quality, make_reading


class Rope:
    """A leak controller whose next poll reads `wet` (and `partial` errors, when set); like the real one, each poll
    also counts its own requests (a counter no detector reads, different in every poll)."""

    name, device = "leak", "leak1"

    def __init__(self) -> None:
        self.wet = False
        self.partial: dict[str, int] = {}
        self.requests = 0

    async def poll(self) -> PollResult:
        self.requests += 1
        r = make_reading(LEAK_DETECTED, 1.0 if self.wet else 0.0, {"zone": "zone-a", "sensor": "rope"}, Quality.OK, 0.0)
        asked = make_reading(REQUESTS, float(self.requests), {"device": "leak1"}, Quality.OK, 0.0)
        return PollResult([r, asked], dict(self.partial))

    async def close(self) -> None:
        return None


def test_a_quiet_poll_is_vouched_for_and_news_is_published_at_once():
    async def run() -> list[int]:
        store = SnapshotStore()
        heard: list[str] = []
        store.add_listener(lambda snap, origin: heard.append(origin))
        rope = Rope()
        runner = SourceRunner(rope, SourceSettings(interval=0.5, timeout=0.4), store, 2.0)
        now = [100.0]
        runner.monotonic = lambda: now[0]
        seen = []

        async def poll(advance: float = 0.5) -> None:
            now[0] += advance
            await runner.run_once()
            seen.append(len(heard))
        await poll()  # the first poll: published
        await poll()  # the same, 0.5 s later: vouched for
        before = store.states()[0].last_success
        await poll()
        assert store.states()[0].last_success >= before  # ... fresh, its readings kept
        rope.wet = True
        await poll()  # wet: published
        await poll(0.01)  # wet again, the confirmation: published too
        rope.wet = False
        await poll()  # dry again: a change
        await poll(REPUBLISH_SECONDS - 0.6)  # the same, not yet REPUBLISH_SECONDS after the last publish
        await poll(0.6)  # the same, REPUBLISH_SECONDS after: published (the detectors' holds count on)
        rope.partial = {"timeout": 1}
        await poll(0.1)  # a partial error is news
        return seen

    assert asyncio.run(run()) == [1, 1, 1, 2, 3, 4, 4, 5, 6]


def test_a_source_polled_no_faster_than_republish_publishes_every_poll():
    async def run() -> int:
        store = SnapshotStore()
        heard: list[str] = []
        store.add_listener(lambda snap, origin: heard.append(origin))
        runner = SourceRunner(Rope(), SourceSettings(interval=REPUBLISH_SECONDS, timeout=1.0), store, 2.0)
        for _ in range(3):
            await runner.run_once()
        return len(heard)

    assert asyncio.run(run()) == 3
