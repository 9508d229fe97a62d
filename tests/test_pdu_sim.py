"""The simulated Raritan PDU against the collector: power follows the model; switching, wraps, resets, outages."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from sim.rack import RackModel
from sim.snmp_pdu import SimulatedRaritanPdu
from exporters.model import Quality, Reading, SourceError
from exporters.power.pdu import INLET_POWER, PduSource, pdus_not_summed, rack_power_readings
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
            # Given the inventory's PDUs, the same sum while both are read...
            both = {r.name: r.value for r in rack_power_readings(readings, 50_000, ["pdu-a", "pdu-b"])}
            assert both["supernode_rack_power_watts"] == rack["supernode_rack_power_watts"]
            # ...and none once pdu-b stops answering (its poll fails: its readings leave the snapshot): pdu-a's half
            # is not the rack's power. The budget stays.
            b.set_offline(True)
            with pytest.raises(SourceError):
                await srcs[1].poll()
            only_a = [r for r in readings if r.labels.get("pdu") == "pdu-a"]
            assert pdus_not_summed(only_a, ["pdu-a", "pdu-b"]) == ["pdu-b"]
            assert [r.name for r in rack_power_readings(only_a, 50_000, ["pdu-a", "pdu-b"])] == [
                "supernode_rack_power_budget_watts"]
            # an inlet read but not OK is not summed either
            bad = [dataclasses.replace(r, quality=Quality.STALE) if r.spec is INLET_POWER and r.labels["pdu"] == "pdu-b"
                   else r for r in readings]
            assert pdus_not_summed(bad, ["pdu-a", "pdu-b"]) == ["pdu-b"]
            assert "supernode_rack_power_watts" not in {r.name for r in rack_power_readings(bad, None, ["pdu-a", "pdu-b"])}
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


def test_the_agents_rack_power_is_unknown_while_one_pdu_is_stale_and_says_so_once(caplog):
    """The derived rack power over the agent's own store: the inventory's two PDUs read, their sum; pdu-b's
    readings gone stale (it stopped answering), no rack power at all (warned once, however many polls), and the
    sum again once pdu-b answers (said once)."""
    import logging

    from agent.derived import RackPowerSource
    from agent.snapshot import SnapshotStore

    now = [1000.0]
    store = SnapshotStore(clock=lambda: now[0])
    for pdu in ("pdu-a", "pdu-b"):
        store.register("pdu", pdu, 1.0, 2)

    def publish(pdu: str, watts: float) -> None:
        store.publish("pdu", pdu, [Reading(INLET_POWER, watts, {"pdu": pdu, "inlet": "1"}, Quality.OK, now[0])], 0.01)

    def rack_power() -> float | None:
        result = asyncio.run(src.poll())
        return next((r.value for r in result.readings if r.name == "supernode_rack_power_watts"), None)

    src = RackPowerSource(store, 50_000.0, ["pdu-a", "pdu-b"])
    assert rack_power() is None  # before the PDUs' first polls: unknown, and no warning for it
    publish("pdu-a", 6000.0)
    publish("pdu-b", 5000.0)
    assert rack_power() == 11_000.0
    caplog.set_level(logging.INFO, logger="supernode.derived")
    for _ in range(3):  # pdu-b stops answering: after two intervals its readings are stale, pdu-a goes on
        now[0] += 1.5
        publish("pdu-a", 6000.0)
    assert rack_power() is None and rack_power() is None
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [(r.getMessage(), r.pdus) for r in warned] == [("rack power unknown: a PDU's inlets are not read", ["pdu-b"])]
    publish("pdu-b", 5000.0)
    assert rack_power() == 11_000.0
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        "rack power summed again: every PDU read"]
