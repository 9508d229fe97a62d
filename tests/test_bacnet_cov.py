"""COV push from another stack's device (legacy BACpypes): a leak reaches the readings in one round trip without a
read, subscriptions are renewed by the polls and confirmed by a notification, a device that refuses COV is polled
only, and a source that lets go of the device cancels its subscriptions there."""

from __future__ import annotations

import asyncio

import pytest

from bacpypes3.primitivedata import ObjectIdentifier

from exporters.cooling.bacnet.client import BacnetLink
from exporters.cooling.bacnet.source import BacnetSource
from tests.bacnet_peer import bacnet_device
from tests.helpers import await_for


@pytest.fixture(scope="module")
def cdu():
    with bacnet_device("reference-cdu") as dev:
        dev.command(set={"leak_input_1": 0, "leak_input_2": 0})
        yield dev


def _leak(result, sensor: str) -> float | None:
    return next((r.value for r in result.readings if r.name == "supernode_leak_detected" and r.label("sensor") == sensor),
                None)


def test_a_leak_is_pushed_into_the_readings_within_one_round_trip_without_a_read(cdu):
    async def run():
        link = BacnetLink(*cdu.endpoint, timeout=2.0)
        src = BacnetSource("leak", "cdu1", "reference-cdu", link, subset="leak", cov_lifetime=60)
        asked: list[int] = []
        src.poll_trigger.attach(lambda: asked.append(1))  # what the runtime's poll_now would do
        try:
            first = await src.poll()
            await await_for(lambda: src.cov.up, 10, what="both leak inputs' subscriptions confirmed")
            assert _leak(first, "cdu-leak-1") == 0.0
            reads = cdu.stats()["ReadPropertyMultipleRequest"]
            asked.clear()
            await asyncio.to_thread(cdu.command, set={"leak_input_1": 1})
            await await_for(lambda: asked, 10, what="the notification asked for a poll")
            pushed = await src.poll()
            assert cdu.stats()["ReadPropertyMultipleRequest"] == reads  # the wet reading came with no read at all
            confirmed = await src.poll()  # the next poll (the leak detector's confirmation) reads the device
            assert cdu.stats()["ReadPropertyMultipleRequest"] == reads + 1
            return pushed, confirmed
        finally:
            await src.close()
            await asyncio.to_thread(cdu.command, set={"leak_input_1": 0})
    pushed, confirmed = asyncio.run(run())
    assert _leak(pushed, "cdu-leak-1") == 1.0 and _leak(pushed, "cdu-leak-2") == 0.0
    assert _leak(confirmed, "cdu-leak-1") == 1.0
    up = [r for r in pushed.readings if r.name == "supernode_bacnet_cov_up"]
    assert [(dict(r.labels), r.value) for r in up] == [({"device": "cdu1", "source": "leak"}, 1.0)]


def test_subscriptions_are_renewed_at_half_their_lifetime_and_cancelled_on_release(cdu):
    clock = [1000.0]

    async def run():
        link = BacnetLink(*cdu.endpoint, timeout=2.0)
        src = BacnetSource("leak", "cdu1", "reference-cdu", link, subset="leak", cov_lifetime=60)
        src.cov.clock = lambda: clock[0]
        device = ObjectIdentifier(("device", 1001))
        try:
            await src.poll()
            made = cdu.stats()["SubscribeCOVRequest"]
            active = await link.read_property(device, "active-cov-subscriptions")
            clock[0] += 29  # not yet half the lifetime: nothing to renew
            await src.poll()
            assert cdu.stats()["SubscribeCOVRequest"] == made
            clock[0] += 2
            await src.poll()
            renewed = cdu.stats()["SubscribeCOVRequest"] - made
            await src.release()  # another agent polls this device now
            after = await link.read_property(device, "active-cov-subscriptions")
            return active, renewed, after, src.cov.up
        finally:
            await src.close()
    active, renewed, after, up = asyncio.run(run())
    assert renewed == 2  # both leak inputs, renewed (the same process ids), not added
    assert len(active) == 2 and len(after) == 0 and up is False


def test_a_device_that_refuses_cov_is_polled_only_and_says_so():
    with bacnet_device("reference-cdu", no_cov=True) as dev:
        dev.command(set={"leak_input_2": 1})

        async def run():
            link = BacnetLink(*dev.endpoint, timeout=2.0)
            src = BacnetSource("leak", "cdu1", "reference-cdu", link, subset="leak")
            try:
                await src.poll()
                return await src.poll(), src.cov.unsupported
            finally:
                await src.close()
        result, why = asyncio.run(run())
    assert _leak(result, "cdu-leak-2") == 1.0
    assert why and "SubscribeCOV" in why
    assert [r.value for r in result.readings if r.name == "supernode_bacnet_cov_up"] == [0.0]


def test_the_pollers_facts_are_taken_by_every_agent_that_reads_the_same_cdu(cdu):
    """Rack coordination: another agent checks a poller's facts against its own BACnet source of the device (never
    polled there); a real poll's readings, a leak fault and COV state included, are all taken."""
    import time

    from agent.coordination.facts import Fact, FactSchema, decode, encode, parse

    channels = {1: "zone-a", 2: "zone-b"}
    cdu.command(status={"leak_input_2": {"reliability": "open-loop", "fault": True}})

    async def run():
        link = BacnetLink(*cdu.endpoint, timeout=2.0)
        polled = {}
        try:
            for name, subset in (("cdu", "cdu"), ("leak", "leak")):
                src = BacnetSource(name, "cdu1", "reference-cdu", link, subset=subset, channels=channels)
                polled[name] = (await src.poll()).readings
                await src.cov.close()
        finally:
            await link.close()
            cdu.command(status={"leak_input_2": {"reliability": "no-fault-detected", "fault": False}})
        return polled
    polled = asyncio.run(run())
    now = time.time()
    for name, readings in polled.items():
        theirs = BacnetSource(name, "cdu1", "reference-cdu", BacnetLink(*cdu.endpoint), subset=name, channels=channels)
        fact = decode(parse(encode(Fact("node01", name, "cdu1", True, readings, 0.01, at=now))),
                      FactSchema.of(f"{name}/cdu1", theirs), "node01", now, 5.0)
        assert len(fact.readings) == len(readings), name
    assert any(r.name == "supernode_leak_sensor_fault" for r in polled["leak"])
