"""Hostile BACnet replies (issue 37, as issue 18 did for SNMP): bent bytes fault readings or fail the poll cleanly.

The wire half replays what another stack (legacy BACpypes, sim/bacnet_device.py) really answered, recorded
through a relay, from a UDP peer of ours that bends the poll's ReadPropertyMultiple-ACK: flipped, truncated,
spliced and random bytes. Whatever arrives, a poll ends with a SourceError (decode, protocol, timeout) or with
readings, within its bound, never another exception and never a hang; a reading it calls good is finite and in
range. The decoding half fuzzes the judgement of each object's properties directly (cheap: many examples).
"""

from __future__ import annotations

import asyncio
import math
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporters.cooling.bacnet.client import BacnetLink
from exporters.cooling.bacnet.decode import PropertyProblem, judge
from exporters.cooling.bacnet.profile import ANALOG, BINARY, load_profile
from exporters.cooling.bacnet.source import BacnetSource
from exporters.model import Quality, SourceError
from exporters.units import to_base
from tests.bacnet_peer import bacnet_device
from tests.helpers import free_port

PROFILE = load_profile("reference-cdu")
CONFIRMED, COMPLEX_ACK = 0x00, 0x30


class _Relay(asyncio.DatagramProtocol):
    """Client <-> device on loopback, recording each reply by its request (invoke id zeroed)."""

    def __init__(self, device: tuple[str, int]):
        self.device = device
        self.replies: dict[bytes, bytes] = {}
        self.iam = b""
        self._pending: dict[int, bytes] = {}
        self.client: tuple[str, int] | None = None
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        assert self.transport is not None
        if addr == self.device:
            apdu = data[6:]
            if apdu[:1] == b"\x10" and apdu[1:2] == b"\x00":  # I-Am
                self.iam = data
            elif apdu[0] & 0xF0 == COMPLEX_ACK and apdu[1] in self._pending:
                self.replies[self._pending.pop(apdu[1])] = data
            if self.client is not None:
                self.transport.sendto(data, self.client)
            return
        self.client = addr
        apdu = data[6:]
        if apdu and apdu[0] & 0xF0 == CONFIRMED:
            self._pending[apdu[2]] = _key(data)
        self.transport.sendto(data, self.device)


def _key(request: bytes) -> bytes:
    """A confirmed request without its invoke id (and without the stack's max-APDU byte): what it asks."""
    apdu = request[6:]
    return apdu[:1] + apdu[3:]


class _Hostile(asyncio.DatagramProtocol):
    """Answers as the recorded device did, but the poll's ReadPropertyMultiple-ACK is `bent`."""

    def __init__(self, iam: bytes, replies: dict[bytes, bytes], poll_key: bytes, bent: bytes):
        self.iam, self.replies, self.poll_key, self.bent = iam, replies, poll_key, bent
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        assert self.transport is not None
        apdu = data[6:]
        if apdu[:2] == b"\x10\x08":  # Who-Is
            self.transport.sendto(self.iam, addr)
            return
        if not apdu or apdu[0] & 0xF0 != CONFIRMED:
            return
        key = _key(data)
        reply = self.bent if key == self.poll_key else self.replies.get(key)
        if reply is None:
            return
        reply = bytearray(reply)
        if len(reply) > 7:
            reply[7] = apdu[2]  # its invoke id
        self.transport.sendto(bytes(reply), addr)


@pytest.fixture(scope="module")
def recorded() -> tuple[bytes, dict[bytes, bytes], bytes]:
    """What legacy BACpypes answers to the identification and one poll of the reference CDU's coolant objects."""
    with bacnet_device("reference-cdu") as dev:
        dev.command(set={"secondary_supply_temp": 21.5, "secondary_flow": 600.0, "pump_1_running": 1})

        async def run():
            loop = asyncio.get_running_loop()
            relay = _Relay(dev.endpoint)
            port = free_port(socket.SOCK_DGRAM)
            transport, _ = await loop.create_datagram_endpoint(lambda: relay, local_addr=("127.0.0.1", port))
            link = BacnetLink("127.0.0.1", port, timeout=2.0)
            src = BacnetSource("cdu", "cdu1", PROFILE, link, subset="cdu", cov=False)
            try:
                await src.poll()
            finally:
                await link.close()
                transport.close()
            return relay
        relay = asyncio.run(run())
    polls = [k for k, v in relay.replies.items() if len(v) > 600]  # the coolant poll's ACK is the long one
    assert relay.iam and len(polls) == 1, (len(relay.replies), [len(v) for v in relay.replies.values()])
    return relay.iam, relay.replies, polls[0]


def _poll_bent(recorded, bent: bytes) -> object:
    iam, replies, poll_key = recorded

    async def run():
        loop = asyncio.get_running_loop()
        port = free_port(socket.SOCK_DGRAM)
        transport, _ = await loop.create_datagram_endpoint(lambda: _Hostile(iam, replies, poll_key, bent),
                                                           local_addr=("127.0.0.1", port))
        link = BacnetLink("127.0.0.1", port, timeout=0.15)
        src = BacnetSource("cdu", "cdu1", PROFILE, link, subset="cdu", cov=False)
        try:
            async with asyncio.timeout(5):  # a hang is a failure, not a slow pass
                return await src.poll()
        except SourceError as exc:
            return exc
        finally:
            await link.close()
            transport.close()
    return asyncio.run(run())


def _check(outcome: object) -> None:
    if isinstance(outcome, SourceError):
        assert outcome.kind in ("decode", "protocol", "timeout"), outcome
        return
    for r in outcome.readings:  # type: ignore[attr-defined]
        if r.ok and r.name.startswith("supernode_cdu_") and r.name != "supernode_cdu_info":
            assert math.isfinite(r.value), r


def test_the_recorded_reply_itself_reads_good(recorded):
    outcome = _poll_bent(recorded, recorded[1][recorded[2]])
    assert not isinstance(outcome, SourceError), outcome
    flow = [r for r in outcome.readings if r.name == "supernode_cdu_flow_cubic_meters_per_second"]
    assert [(r.value, r.ok) for r in flow] == [(0.01, True)]


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bent_replies_fault_readings_or_fail_the_poll_cleanly(recorded, data):
    good = recorded[1][recorded[2]]
    how = data.draw(st.sampled_from(["flip", "truncate", "splice", "random", "length"]))
    body = bytearray(good)
    if how == "flip":
        for _ in range(data.draw(st.integers(1, 8))):
            body[data.draw(st.integers(9, len(body) - 1))] ^= data.draw(st.integers(1, 255))
    elif how == "truncate":
        body = body[:data.draw(st.integers(9, len(body) - 1))]
    elif how == "splice":
        at = data.draw(st.integers(9, len(body) - 1))
        body[at:at] = data.draw(st.binary(min_size=1, max_size=64))
    elif how == "random":
        body = body[:9] + bytearray(data.draw(st.binary(max_size=1400)))
    else:  # an application tag that announces a huge length (extended length 0xFFFF...)
        at = data.draw(st.integers(9, len(body) - 4))
        body[at:at + 4] = b"\x45\xfe\xff\xff"
    body[2:4] = len(body).to_bytes(2, "big")  # the BVLL length stays true: the bytes inside are what lie
    _check(_poll_bent(recorded, bytes(body)))


def test_a_value_of_the_wrong_type_faults_that_reading_only(recorded):
    """A well-formed reply whose first present value (21.5, a Real) is a character string instead."""
    good = recorded[1][recorded[2]]
    real = bytes.fromhex("4441ac0000")  # application tag 4 (Real), 21.5
    assert good.count(real) == 1
    body = bytearray(good.replace(real, bytes.fromhex("7505006162636400")[:7]))
    body[2:4] = len(body).to_bytes(2, "big")
    outcome = _poll_bent(recorded, bytes(body))
    assert not isinstance(outcome, SourceError), outcome
    temps = {(r.label("loop"), r.label("point")): r.quality for r in outcome.readings
             if r.name == "supernode_cdu_temperature_celsius"}
    assert temps.pop(("secondary", "supply")) is Quality.SENSOR_FAULT
    flow = [r for r in outcome.readings if r.name == "supernode_cdu_flow_cubic_meters_per_second"]
    assert set(temps.values()) == {Quality.OK} and [r.value for r in flow if r.ok] == [0.01]


def test_a_datagram_of_the_largest_size_is_read_within_the_bound(recorded):
    good = recorded[1][recorded[2]]
    body = bytearray(good[:9] + b"\x1e" + b"\x2e" * 1400 + b"\x1f")  # nested opening tags, never closed
    body[2:4] = len(body).to_bytes(2, "big")
    _check(_poll_bent(recorded, bytes(body)))


VALUES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**40, 2**40), st.text(max_size=8),
                   st.sampled_from(["active", "inactive"]), st.none(), st.booleans(),
                   st.builds(PropertyProblem, st.sampled_from(["error", "decode"]), st.text(max_size=20)))
FLAGS = st.one_of(st.tuples(st.booleans(), st.booleans(), st.booleans(), st.booleans()), st.none(),
                  st.builds(PropertyProblem, st.just("decode"), st.just("x")))
RELIABILITY = st.one_of(st.none(), st.sampled_from(["no-fault-detected", "open-loop", "over-range", "99"]))
UNITS = st.one_of(st.none(), st.sampled_from(["degrees-celsius", "degrees-fahrenheit", "liters-per-minute",
                                              "kilowatt-hours", "percent"]))


@given(st.sampled_from(PROFILE.points), VALUES, FLAGS, RELIABILITY, st.one_of(st.none(), st.booleans()), UNITS)
def test_a_good_reading_is_a_finite_value_in_range_whatever_the_properties_say(point, pv, flags, rel, oos, units):
    got = {"present-value": pv, "status-flags": flags, "reliability": rel, "out-of-service": oos, "units": units}
    value, quality, leak_fault = judge(point, got)
    if quality is not Quality.OK:
        return
    assert math.isfinite(value)
    assert not (isinstance(flags, tuple) and any(flags[1:])) and oos is not True
    assert rel in (None, "no-fault-detected") and leak_fault is None
    if point.object_type in BINARY:
        assert value in (0.0, 1.0)
    elif point.object_type in ANALOG and point.range is not None:
        lo, hi = to_base(point.range[0], point.unit), to_base(point.range[1], point.unit)
        assert lo - 1e-9 <= value <= hi + 1e-9
