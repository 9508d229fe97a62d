"""A cancelled task ends: the bug behind a stop that never returned (gh-86296).

Python 3.11's `asyncio.wait_for` swallows a cancellation that arrives in the same loop turn as the awaited
thing completes: the coordinator's reconcile loop woke on a watch event just as stop() cancelled it, went
round again, and stop() waited on it for ever (the rack-breaker test hung once in a full run). Every
bounded wait in the agent is an `asyncio.timeout` block instead, which runs in the caller's own task and
so cannot lose its cancel.
"""

from __future__ import annotations

import asyncio
import re

from agent.config import parse_config
from agent.coordination.etcd import KV
from agent.coordination.etcd_rack import EtcdCoordinator
from tests.helpers import REPO


def test_no_production_code_waits_with_asyncio_wait_for():
    offenders = []
    for root in ("agent", "exporters"):
        for path in sorted((REPO / root).rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\basyncio\.wait_for\(", line):
                    offenders.append(f"{path.relative_to(REPO)}:{n}")
    assert offenders == [], f"use `async with asyncio.timeout(t)` (3.11's wait_for can swallow a cancel): {offenders}"


def test_the_reconcile_loop_ends_when_cancelled_in_the_turn_its_wake_up_fires(tmp_path):
    loaded = parse_config({"agent": {"rack": "r1", "node": "n1", "state_dir": str(tmp_path)},
                           "inventory": {"nodes": ["n1", "n2"]},
                           "coordination": {"backend": "etcd", "etcd": {"endpoints": ["http://127.0.0.1:9"]}}})
    coord = EtcdCoordinator(loaded)
    coord.poll_now = None
    # another agent leads, so a reconcile round decides locally and sends nothing to etcd
    key = f"{coord.root}/leader"
    coord.mirror[key] = KV(key, b"n2", 5, 5, 0x99)

    async def run() -> list[bool]:
        ended = []
        for _ in range(20):
            task = asyncio.get_running_loop().create_task(coord._reconcile())
            for _ in range(3):
                await asyncio.sleep(0)  # the loop now waits on its wake-up event
            coord._changed.set()  # a watch event...
            task.cancel()  # ...in the same turn as stop()'s cancel
            done, _ = await asyncio.wait([task], timeout=5)
            ended.append(bool(done) and task.cancelled())
            if not done:
                task.cancel()
                await asyncio.wait([task], timeout=5)
        await coord.client.close()
        return ended

    ended = asyncio.run(run())
    assert all(ended), f"the reconcile loop outlived its cancel in {ended.count(False)} of {len(ended)} rounds"
