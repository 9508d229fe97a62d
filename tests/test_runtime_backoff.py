"""Source runner under a failing or crashing collector: bounded backoff for safety sources, one traceback per streak."""

from __future__ import annotations

import asyncio
import logging
import time

from agent.config import Config, SourceSettings
from agent.runtime import SourceRunner
from agent.snapshot import SnapshotStore
from exporters.model import PollResult, SourceError


class Flaky:
    """A source that fails (or crashes) while `mode` says so; the runner sees a real Source interface."""

    name, device = "leak", "cdu1"

    def __init__(self):
        self.mode = "ok"

    async def poll(self) -> PollResult:
        if self.mode == "crash":
            raise ZeroDivisionError("bug in a collector")
        if self.mode == "fail":
            raise SourceError("io", "controller not answering")
        return PollResult([])

    async def close(self) -> None:
        return None


def test_leak_and_coolant_back_off_at_most_two_seconds_by_default():
    cfg = Config.model_validate({"agent": {"rack": "r01", "node": "n01"},
                                 "sources": {"leak": {"interval": 0.5}, "cdu": {"interval": 5}}})
    assert cfg.sources.leak.max_backoff == 2.0 and cfg.sources.cdu.max_backoff == 2.0
    assert cfg.sources.links.max_backoff == 60.0  # not a safety source
    custom = Config.model_validate({"agent": {"rack": "r01", "node": "n01"},
                                    "sources": {"leak": {"max_backoff": 1.0}}})
    assert custom.sources.leak.max_backoff == 1.0
    src = Flaky()
    src.mode = "fail"
    runner = SourceRunner(src, cfg.sources.leak, SnapshotStore(), 2.0)

    async def main():
        for _ in range(12):  # 0.5 s * 2**11 would be ~17 minutes unbounded
            runner.next_allowed = 0.0
            await runner.run_once()
        return runner.next_allowed - time.monotonic()

    wait = asyncio.run(main())
    assert runner.failures == 12 and 0 < wait <= 2.0


def test_crashing_collector_logs_its_traceback_once_per_failure_streak(caplog):
    src = Flaky()
    runner = SourceRunner(src, SourceSettings(interval=1, timeout=1, max_backoff=1), SnapshotStore(), 2.0)

    async def polls(n: int) -> None:
        for _ in range(n):
            runner.next_allowed = 0.0
            await runner.run_once()

    def tracebacks() -> int:
        return sum(1 for r in caplog.records if r.exc_info and r.getMessage() == "source poll crashed")

    caplog.set_level(logging.INFO, logger="supernode.runtime")
    src.mode = "crash"
    asyncio.run(polls(5))
    assert runner.failures == 5 and tracebacks() == 1
    src.mode = "ok"
    asyncio.run(polls(1))
    assert runner.failures == 0
    src.mode = "crash"
    asyncio.run(polls(3))
    assert tracebacks() == 2  # a new streak: its traceback once
