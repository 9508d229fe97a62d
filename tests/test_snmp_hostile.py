"""Issue 18, SNMP: a misbehaving PDU agent (tests/bad_snmp_agent.py) gets a clean error or per-reading faults.

Each mode polls the simulated Raritan PDU through a real UDP agent on
127.0.0.1 that bends its answers; the collector must end with a
`SourceError` of a telling kind (never another exception, never a hang), or
mark only the bent readings as sensor faults while the rest stay good.
`probe snmp` is run as the real CLI process: a clean one-line error, no
traceback, and it ends by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path

import pytest

from sim.rack import RackModel
from sim.snmp_pdu import SimulatedRaritanPdu
from tests.bad_snmp_agent import BadSnmpAgent
from exporters.snmp import v2c as snmp_v2c
from exporters.model import Quality, SourceError
from exporters.power.pdu import PduSource
from exporters.power.pdu_metrics import OUTLET_POWER
from exporters.snmp.client import SnmpCredentials

REPO = Path(__file__).resolve().parents[1]


@contextlib.asynccontextmanager
async def hostile_pdu(mode: str, timeout: float = 1.0, **kw):
    """A simulated PDU served by the misbehaving agent in `mode`, and a collector polling it."""
    model = RackModel(nodes=2, gpus_per_node=4)
    dev = SimulatedRaritanPdu(model, name="pdu-a")
    dev.agent = BadSnmpAgent(mode)
    await dev.start()
    src = PduSource("pdu-a", "raritan-pdu2", dev.endpoint, SnmpCredentials(community="public"),
                    timeout=timeout, retries=0, **kw)
    try:
        yield dev, src
    finally:
        await src.close()
        await dev.stop()


async def poll_error(mode: str, **kw) -> SourceError:
    async with hostile_pdu(mode, **kw) as (_, src):
        with pytest.raises(SourceError) as err:
            await asyncio.wait_for(src.poll(), 60)
    return err.value


def outlet_power(result) -> dict[str, tuple[Quality, float]]:
    return {r.labels["outlet"]: (r.quality, r.value) for r in result.readings if r.spec is OUTLET_POWER}


def test_a_huge_oid_sub_identifier_is_a_decode_error_not_a_crash():
    err = asyncio.run(poll_error("huge_subid"))
    assert err.kind == "decode" and "sub-identifier" in str(err)


def test_a_column_that_never_ends_stops_at_the_row_bound():
    err = asyncio.run(poll_error("endless_column", max_rows=300))
    assert err.kind == "protocol" and "more than 300 rows" in str(err)


def test_a_walk_that_never_ends_stops_at_the_request_bound():
    err = asyncio.run(poll_error("endless_column", max_requests=40))
    assert err.kind == "protocol" and "after 40 requests" in str(err)


def test_an_oid_that_stops_increasing_is_an_error_not_a_short_column():
    err = asyncio.run(poll_error("not_increasing"))
    assert err.kind == "protocol" and "not increasing" in str(err)


def test_integers_wider_than_their_type_fault_that_reading_only():
    async def run():
        async with hostile_pdu("oversize_integers") as (_, src):
            return await src.poll()

    power = outlet_power(asyncio.run(run()))
    assert power["1"][0] is Quality.SENSOR_FAULT  # Gauge32 of 2^32 + 5
    assert power["2"][0] is Quality.SENSOR_FAULT  # INTEGER of 1,100 bits
    others = {k: q for k, (q, _) in power.items() if k not in ("1", "2")}
    assert len(others) >= 2 and set(others.values()) == {Quality.OK}


def test_decimal_digits_outside_the_mib_range_fault_that_reading_only():
    async def run():
        async with hostile_pdu("bad_digits") as (_, src):
            return await src.poll()

    result = asyncio.run(run())
    power = outlet_power(result)
    assert power["1"][0] is Quality.SENSOR_FAULT  # 400 digits: every value would read 0 W
    assert power["2"][0] is Quality.SENSOR_FAULT  # -400 digits: 10^400 overflowed before
    assert {q for k, (q, _) in power.items() if k not in ("1", "2")} == {Quality.OK}
    assert any(r.name == "supernode_pdu_inlet_power_watts" and r.ok for r in result.readings)


def test_spoofed_datagrams_are_dropped_before_their_varbinds_are_decoded(monkeypatch):
    decoded: list[int] = []
    real = snmp_v2c.decode_oid

    def spy(data: bytes, s: int, e: int):
        decoded.append(e - s)
        return real(data, s, e)

    monkeypatch.setattr(snmp_v2c, "decode_oid", spy)

    async def run():
        async with hostile_pdu("spoofed") as (dev, src):
            return await src.poll(), dev.agent.spoofed

    result, spoofed = asyncio.run(run())
    assert spoofed >= 1
    assert not [n for n in decoded if n > 1000]  # the 60 KB OIDs of other request-ids were never decoded
    assert outlet_power(result) and {q for q, _ in outlet_power(result).values()} == {Quality.OK}


def test_a_malformed_answer_to_our_request_is_a_decode_error_at_once():
    err = asyncio.run(poll_error("garbage_varbinds", timeout=30.0))  # not a timeout: the error comes first
    assert err.kind == "decode" and "malformed" in str(err)


@pytest.mark.parametrize("mode", ["garbage", "slow"])
def test_garbage_or_late_answers_time_out_cleanly(mode):
    err = asyncio.run(poll_error(mode, timeout=0.3))
    assert err.kind == "timeout"


@pytest.mark.parametrize("mode,args,expect", [
    ("endless_column", [], "max_walk_requests"),  # the default bounds end it
    ("huge_subid", [], "decode:"),
    ("not_increasing", [], "not increasing"),
])
def test_probe_snmp_prints_one_clean_error_and_ends(mode, args, expect):
    async def run():
        agent = BadSnmpAgent(mode)
        dev = SimulatedRaritanPdu(RackModel(nodes=2, gpus_per_node=4), name="pdu-a")
        dev.agent = agent
        await dev.start()
        host, port = dev.endpoint
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agent.cli", "probe", "snmp", "--profile", "raritan-pdu2",
                "--target", f"{host}:{port}", "--timeout", "2", "--retries", "0", *args, cwd=REPO,
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 90)
            return proc.returncode, out.decode(), err.decode()
        finally:
            await dev.stop()

    rc, out, err = asyncio.run(run())
    assert rc != 0 and out == ""
    assert "Traceback" not in err and expect in err
    assert len(err.strip().splitlines()) == 1


def test_walk_bounds_come_from_the_config_and_are_checked():
    from agent.config import ConfigError, parse_config
    from agent.sources import build_sources

    base = {"agent": {"rack": "r", "node": "n"}, "sources": {"nvml": {"enabled": False}}}
    pdu = {"name": "pdu-a", "profile": "raritan-pdu2", "host": "127.0.0.1", "port": 16100}
    loaded = parse_config({**base, "inventory": {"pdus": [{**pdu, "max_walk_rows": 50, "max_walk_requests": 7}]}})
    [pdu_source] = [s.source for s in build_sources(loaded) if s.source.name == "pdu"]
    assert (pdu_source.client.max_rows, pdu_source.client.max_requests) == (50, 7)
    with pytest.raises(ConfigError, match="max_walk_rows"):
        parse_config({**base, "inventory": {"pdus": [{**pdu, "max_walk_rows": 0}]}})


def test_oids_of_128_sub_identifiers_decode_and_longer_ones_are_refused():
    def decoded(oid):
        enc = snmp_v2c.encode_oid(oid)
        _, s, e = snmp_v2c._head(enc, 0, len(enc))
        return snmp_v2c.decode_oid(enc, s, e)

    longest = (1, 3) + tuple(range(126))
    assert decoded(longest) == longest
    with pytest.raises(snmp_v2c.BerError, match="longer than 128"):
        decoded(longest + (7,))
