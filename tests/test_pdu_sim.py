"""The simulated Raritan PDU against the collector: power follows the model; switching, wraps, resets, outages."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sim.rack import RackModel
from sim.snmp_pdu import SimulatedRaritanPdu
from exporters.model import SourceError
from exporters.power.pdu import PduSource, rack_power_readings
from exporters.snmp.client import SnmpCredentials
from tests.helpers import await_for


def by_key(result) -> dict[tuple, float]:
    return {(r.name, r.labels.get("inlet", ""), r.labels.get("phase", ""), r.labels.get("outlet", "")): r.value
            for r in result.readings if r.ok}


@contextlib.asynccontextmanager
async def rig(timeout: float = 3.0, **kw):
    """A 2-node rack model, its simulated PDU on a free port, and a collector polling it. The PDU is served from
    this test's own process: on a loaded machine it may take more than the shipped 0.3 s to answer, so the
    physics tests give it 3 s; the timeout test keeps the real budget."""
    model = RackModel(nodes=2, gpus_per_node=4)
    dev = SimulatedRaritanPdu(model, name="pdu-a", **kw)
    await dev.start()
    src = PduSource("pdu-a", "raritan-pdu2", dev.endpoint, SnmpCredentials(community="public"),
                    timeout=timeout, retries=0, outlet_feeds=dev.feeds())
    try:
        yield model, dev, src
    finally:
        await src.close()
        await dev.stop()


def tick(model: RackModel, dev: SimulatedRaritanPdu, dt: float) -> None:
    with model.lock:
        model.step(dt)
        dev.update(model)


def test_inlet_phase_and_outlet_power_follow_the_gpu_load():
    async def run():
        async with rig() as (model, dev, src):
            v = by_key(await src.poll())
            assert v[("supernode_pdu_inlet_power_watts", "1", "", "")] == round(model.rack_power_w())
            phases = sum(v[("supernode_pdu_phase_power_watts", "1", p, "")] for p in "123")
            assert phases == pytest.approx(model.rack_power_w(), abs=3)
            node1 = model.node_power_w("node01")
            assert v[("supernode_pdu_outlet_power_watts", "", "", "1")] == round(node1 / 2)
            assert v[("supernode_pdu_outlet_power_watts", "", "", "24")] == 0.0
            before = v[("supernode_pdu_inlet_power_watts", "1", "", "")]
            with model.lock:
                for g in model.nodes["node01"].gpus:
                    g.workload = 0.1
            tick(model, dev, 5.0)
            after = by_key(await src.poll())[("supernode_pdu_inlet_power_watts", "1", "", "")]
            assert after < before - 1000 and after == round(model.rack_power_w())
            feeds = {r.labels["outlet"]: r.labels["feeds"] for r in (await src.poll()).readings
                     if r.name == "supernode_pdu_outlet_info"}
            assert feeds == {"1": "node01", "2": "node01", "3": "node02", "4": "node02"}
    asyncio.run(run())


def test_outlet_set_reads_back_and_a_node_without_outlets_loses_power():
    async def run():
        async with rig() as (model, dev, src):
            assert await src.set_outlet(1, False) is True
            v = by_key(await src.poll())
            assert v[("supernode_pdu_outlet_on", "", "", "1")] == 0.0
            assert v[("supernode_pdu_outlet_power_watts", "", "", "1")] == 0.0
            assert v[("supernode_pdu_outlet_power_watts", "", "", "2")] == round(model.node_power_w("node01"))
            assert model.nodes["node01"].powered
            assert await src.set_outlet(2, False) is True
            tick(model, dev, 0.1)
            assert not model.nodes["node01"].powered
            assert all(g.power_w == 0.0 for g in model.nodes["node01"].gpus)
            v = by_key(await src.poll())
            assert v[("supernode_pdu_inlet_power_watts", "1", "", "")] == round(model.node_power_w("node02"))
            assert await src.set_outlet(2, True) is True and model.nodes["node01"].powered
            dev.trip_outlet(3)
            assert by_key(await src.poll())[("supernode_pdu_outlet_on", "", "", "3")] == 0.0
    asyncio.run(run())


def test_energy_counter_wrap_and_reset_never_go_backwards():
    async def run():
        key = ("supernode_pdu_inlet_energy_joules_total", "1", "", "")
        async with rig() as (model, dev, src):
            tick(model, dev, 3600.0)                  # about 6.6 kWh
            e0 = by_key(await src.poll())[key]
            assert e0 == pytest.approx(round(model.rack_power_w()) * 3600, rel=0.01)
            dev.counter_wrap(margin_wh=100.0)         # counter jumps to 2^32 - 100 Wh
            e1 = by_key(await src.poll())[key]
            tick(model, dev, 3600.0)                  # +6.6 kWh: the device counter wraps past 2^32
            e2 = by_key(await src.poll())[key]
            assert dev.inlet_energy_wh > 2 ** 32      # it really wrapped on the wire
            assert e2 - e1 == pytest.approx(round(model.rack_power_w()) * 3600, rel=0.01)
            dev.counter_reset()
            tick(model, dev, 360.0)
            e3 = by_key(await src.poll())[key]
            assert e2 < e3 < e2 + model.rack_power_w() * 400
            assert (src.counters.wraps, src.counters.resets) >= (1, 1)
    asyncio.run(run())


def test_pdu_that_stops_answering_times_out_and_comes_back():
    async def run():
        async def answered():
            """The poll's result once the PDU answers; None while a poll times out (a loaded machine can keep
            the simulated PDU, in this process, from answering within the 0.3 s budget once)."""
            try:
                return await src.poll()
            except SourceError as exc:
                if exc.kind != "timeout":
                    raise
                return None

        async with rig(timeout=0.3) as (model, dev, src):
            assert (await await_for(answered, timeout=10, what="PDU answering")).readings
            dev.set_offline(True)
            with pytest.raises(SourceError) as err:
                await src.poll()
            assert err.value.kind == "timeout"
            dev.set_offline(False)
            result = await await_for(answered, timeout=10, what="PDU answering again")
            assert by_key(result)[("supernode_pdu_inlet_power_watts", "1", "", "")] > 0
    asyncio.run(run())


def test_rack_power_sums_inlets_of_all_pdus_and_never_invents_zero():
    async def run():
        model = RackModel(nodes=4, gpus_per_node=2)
        a = SimulatedRaritanPdu(model, name="pdu-a", nodes=["node01", "node02"])
        b = SimulatedRaritanPdu(model, name="pdu-b", nodes=["node03", "node04"])
        await a.start()
        await b.start()
        srcs = [PduSource(d.name, "raritan-pdu2", d.endpoint, SnmpCredentials(community="public"), timeout=3.0,
                          retries=0) for d in (a, b)]
        try:
            readings = [r for s in srcs for r in (await s.poll()).readings]
            rack = {r.name: r.value for r in rack_power_readings(readings, 50_000)}
            assert rack["supernode_rack_power_watts"] == pytest.approx(model.rack_power_w(), abs=2)
            assert rack["supernode_rack_power_budget_watts"] == 50_000
            assert [r.name for r in rack_power_readings([], None)] == []
        finally:
            for s in srcs:
                await s.close()
            await a.stop()
            await b.stop()
    asyncio.run(run())


def test_switching_on_a_profile_without_control_is_refused():
    async def run():
        src = PduSource("x", "servertech-sentry4", ("127.0.0.1", 9), SnmpCredentials(community="c"))
        with pytest.raises(SourceError, match="no outlet_control"):
            await src.set_outlet(1, False)
        await src.close()
    asyncio.run(run())
