"""Rack-wide rates and circuit breaker as etcd transactions: three coordinators race on a real etcd.

Three agents' coordinators (the production class, in this process) on one real etcd member ask for
actions at the same moment; the hourly rate and the breaker count every agent's actions, so together they
never pass a limit. A person resets the breaker on another agent than the one that tripped it.
"""

from __future__ import annotations

import asyncio
import types

import pytest

from agent.config import parse_config
from agent.coordination.etcd_rack import EtcdCoordinator
from agent.remediation.guardrails import Guardrails
from agent.snapshot import SnapshotStore
from tests.etcd import running_etcd
from tests.helpers import await_for

NODES = ["n1", "n2", "n3"]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    yield from running_etcd(tmp_path_factory.mktemp("etcd-guard"), 1)


def _coordinator(tmp_path, etcd, node: str, prefix: str, **guardrails) -> EtcdCoordinator:
    cfg = {"agent": {"rack": "r1", "node": node, "state_dir": str(tmp_path / node)},
           "inventory": {"nodes": NODES},
           "remediation": {"guardrails": guardrails},
           "coordination": {"backend": "etcd", "etcd": {"endpoints": etcd.endpoints, "prefix": prefix}}}
    return EtcdCoordinator(parse_config(etcd.authorize(cfg, tmp_path / node)))


async def _rack(tmp_path, etcd, prefix: str, **guardrails) -> list[EtcdCoordinator]:
    coords = [_coordinator(tmp_path, etcd, n, prefix, **guardrails) for n in NODES]
    for c in coords:
        await c.start(types.SimpleNamespace(store=SnapshotStore(), scheduler=types.SimpleNamespace(poll_now=None)))
    await await_for(lambda: all(c.up() for c in coords), 30, what="three coordinators up")
    return coords


async def _stop(coords: list[EtcdCoordinator]) -> None:
    for c in coords:
        await c.stop()


def test_racing_agents_never_pass_the_rack_hourly_rate(tmp_path, etcd):
    async def run() -> list:
        coords = await _rack(tmp_path, etcd, "/rate", rate_per_hour={"drain": 4, "default": 60})
        try:
            guard = Guardrails(coords[0].guardrails)
            asks = [c.reserve_action("drain", guard) for c in coords for _ in range(3)]
            return await asyncio.gather(*asks)
        finally:
            await _stop(coords)
    answers = asyncio.run(run())
    assert answers.count(None) == 4, answers
    assert all(a[0] == "rate_limit" and "rack-wide" in a[1] for a in answers if a is not None)


def test_the_rack_breaker_trips_for_every_agent_and_a_person_resets_it_anywhere(tmp_path, etcd):
    async def run() -> tuple:
        coords = await _rack(tmp_path, etcd, "/breaker", breaker_max_actions=3, breaker_window_seconds=600)
        try:
            guard = Guardrails(coords[0].guardrails)
            first = await asyncio.gather(*(c.reserve_action("cdu_write", guard) for c in coords for _ in range(2)))
            await await_for(lambda: all(c.breaker_open() for c in coords), 10, what="every agent sees the breaker")
            was = await coords[2].reset_breaker("person")
            await await_for(lambda: not any(c.breaker_open() for c in coords), 10, what="breaker closed everywhere")
            after = await coords[1].reserve_action("cdu_write", guard)
            return first, was, after
        finally:
            await _stop(coords)
    first, was, after = asyncio.run(run())
    assert first.count(None) == 3, first
    assert all(a[0] == "circuit_breaker" for a in first if a is not None), first
    assert was is True and after is None


def test_one_agents_counts_asked_together_go_in_one_txn_in_the_order_asked(tmp_path, etcd):
    """A playbook's steps start together (cap each GPU, drain the node): their counts are one write of the
    rack's action key, judged in the order asked (the count that reaches the breaker's limit runs and opens it,
    the next is refused), not a race between the steps of one agent."""
    async def run() -> tuple:
        coords = await _rack(tmp_path, etcd, "/batch", breaker_max_actions=2, breaker_window_seconds=600)
        try:
            guard = Guardrails(coords[0].guardrails)
            answers = await asyncio.gather(*(coords[0].reserve_action(k, guard) for k in ("gpu_power_cap", "drain",
                                                                                          "gpu_power_cap")))
            kv = await coords[0].client.get("/batch/r1/guard/actions")
            return answers, kv
        finally:
            await _stop(coords)
    answers, kv = asyncio.run(run())
    assert answers[:2] == [None, None], answers
    assert answers[2] is not None and answers[2][0] == "circuit_breaker", answers
    assert kv is not None and kv.create_revision == kv.mod_revision, "counted in more than one write"
    doc = kv.json()
    assert doc["breaker"]["open"] is True and len(doc["recent"]) == 2 and sorted(doc["kinds"]) == ["drain", "gpu_power_cap"]
