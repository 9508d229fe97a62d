"""Issue 18, Modbus: a misbehaving server (tests/bad_modbus_server.py) never reads as a leak, and fails cleanly.

The leak controller profile (rle-ld2100) is polled through the real
pymodbus client against a raw-MBAP server on 127.0.0.1 whose registers
are dry; its hostile frames carry `leak_detected=1`. A frame with
transaction id 0, another function code, or a byte count short of the
request must be refused (a `SourceError`, never a wet zone), and so must a
reply from another unit when the unit asked is 0 (pymodbus checks the unit
only when it is not 0); a frame for another transaction id is skipped, and
a frame from another unit than a non-zero one asked is skipped by
pymodbus's framer (the request then times out). Garbage and late answers
must end in a clean error within the timeout, a peer that hangs up fails the
request as a dropped connection, and the next honest poll must work again.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.bad_modbus_server import BadModbusServer
from exporters.cooling.modbus import ModbusSource
from exporters.cooling.modbus_client import gateway_for, release_gateway
from exporters.model import SourceError


@contextlib.asynccontextmanager
async def hostile_leak_controller(mode: str, timeout: float = 1.0, unit: int | None = None):
    server = BadModbusServer(mode)
    host, port = await server.start()
    src = ModbusSource("leak", "leak-a", "rle-ld2100", host, port, timeout=timeout, unit=unit)
    try:
        yield server, src
    finally:
        await src.close()
        await server.stop()


def wet_zones(result) -> list[str]:
    return [r.labels["zone"] for r in result.readings if r.name == "supernode_leak_detected" and r.value == 1]


@pytest.mark.parametrize("mode,unit,fragment", [("tid0", None, "transaction id 0"), ("wrong_fc", None, "function code"),
                                                ("short", None, "expected 40 values, got 39"),  # one read of 30001-30040
                                                ("wrong_unit", 0, "reply from unit 1, asked 0")])
def test_a_stray_frame_is_refused_and_never_reads_as_a_leak(mode, unit, fragment):
    async def run():
        async with hostile_leak_controller(mode, unit=unit) as (_, src):
            with pytest.raises(SourceError) as err:
                await asyncio.wait_for(src.poll(), 30)
            return err.value

    err = asyncio.run(run())
    assert err.kind == "protocol" and fragment in str(err)


def test_a_frame_for_another_transaction_is_skipped_and_the_answer_read():
    async def run():
        async with hostile_leak_controller("wrong_tid") as (server, src):
            result = await asyncio.wait_for(src.poll(), 30)
            return result, server.requests

    result, requests = asyncio.run(run())
    assert requests >= 1
    assert any(r.name == "supernode_leak_detected" for r in result.readings)
    assert wet_zones(result) == []


# garbage: pymodbus discards a frame with a bad protocol id and goes on waiting, so the request times out;
# wrong_unit (unit 1 asked): pymodbus's framer skips the other unit's frame before it is a response, the same way;
# hangup: pymodbus's connection callback fails the waiting request at once (a dropped connection, not a timeout)
# (a timeout long enough that a loaded host cannot make the hang-up look like one)
@pytest.mark.parametrize("mode,timeout,kinds", [("garbage", 0.3, {"connection", "protocol", "timeout"}),
                                                ("slow", 0.3, {"timeout"}), ("wrong_unit", 0.3, {"timeout"}),
                                                ("hangup", 20.0, {"connection"})])
def test_garbage_or_late_answers_end_in_a_clean_error(mode, timeout, kinds):
    async def run():
        async with hostile_leak_controller(mode, timeout=timeout) as (_, src):
            with pytest.raises(SourceError) as err:
                await asyncio.wait_for(src.poll(), 30)
            return err.value

    assert asyncio.run(run()).kind in kinds


def test_after_a_refused_frame_the_next_request_reads_the_honest_answer():
    async def run():
        server = BadModbusServer("tid0", registers={5: 42})
        host, port = await server.start()
        gw = gateway_for(host, port, 1.0)
        try:
            with pytest.raises(SourceError):
                await gw.read(4, 0, 8, 1)
            server.mode = "good"
            return await gw.read(4, 0, 8, 1)
        finally:
            release_gateway(gw)
            await server.stop()

    assert asyncio.run(run()) == [0, 0, 0, 0, 0, 42, 0, 0]  # honest, not the lie (register 0 = 1)


def _on_loop(loop_name: str, coro_fn):
    """Run `coro_fn()` on asyncio's own loop or on uvloop's (agent.event_loop), as the daemon would."""
    from agent.daemon import _loop_factory

    with asyncio.Runner(loop_factory=_loop_factory(loop_name)) as runner:
        return runner.run(coro_fn())


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_a_write_whose_connection_the_peer_closes_unanswered_is_sent_again_on_a_new_one(loop_name):
    """The peer hangs up on a valve write (a gateway that restarted): the write is sent once more on a new
    connection and done, not failed; a peer that hangs up again fails it as a dropped connection."""
    async def run():
        server = BadModbusServer("hangup_once")
        host, port = await server.start()
        gw = gateway_for(host, port, 5.0)
        try:
            await gw.write("holding", 7, [1], 1)
            done = (dict(server.written), server.requests, await gw.read(3, 7, 1, 1))
            server.mode = "hangup"
            with pytest.raises(SourceError) as err:
                await gw.write("holding", 8, [1], 1)
            return done, err.value, server.requests
        finally:
            release_gateway(gw)
            await server.stop()

    (written, requests, back), err, later = _on_loop(loop_name, run)
    assert written == {7: 1} and requests == 2 and back == [1]
    assert err.kind == "connection" and "dropped" in str(err) and later == requests + 1 + 2  # the read, 2 tries


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_a_write_on_a_connection_closed_before_pymodbus_heard_of_it_is_sent_on_a_new_one(loop_name):
    """The connection's transport is closed and pymodbus has not yet been told (its connection-lost callback is
    still queued) when a valve write comes: uvloop raises RuntimeError on the write, asyncio's loop drops its
    bytes. Either way the write is sent again on a new connection and done (the suite saw the uvloop case
    fail a valve close)."""
    async def run():
        server = BadModbusServer("good")
        host, port = await server.start()
        gw = gateway_for(host, port, 5.0)
        try:
            assert await gw.read(3, 7, 1, 1) == [0]
            gw._client.ctx.transport.close()  # closed under pymodbus, which still says connected until the callback
            await gw.write("holding", 7, [1], 1)
            return dict(server.written), await gw.read(3, 7, 1, 1)
        finally:
            release_gateway(gw)
            await server.stop()

    assert _on_loop(loop_name, run) == ({7: 1}, [1])
