"""Modbus collectors against the simulated CDU and leak controllers over real TCP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess

import pytest
import yaml

from sim.modbus_devices import SimModbusDevice
from sim.rack import RackModel
from exporters.cooling import modbus_metrics as mm
from exporters.cooling.modbus import ModbusSource
from exporters.cooling.modbus_control import write_control_point
from exporters.cooling.modbus_probe import ProbeError, probe_modbus
from exporters.cooling.modbus_codec import decode
from exporters.cooling.modbus_profile import PROFILE_DIR, list_profiles, load_profile, parse_profile
from exporters.model import Quality, SourceError
from tests.helpers import await_for, free_port, require_binary


@contextlib.asynccontextmanager
async def simulated(profile: str, model: RackModel | None = None, tick: float = 0.05, port: int | None = None):
    """A running simulated device plus a model ticker (what sim/server.py does)."""
    model = model or RackModel(leak_zones={"zone-a": ["node01"], "zone-b": ["node02"]})
    dev = SimModbusDevice(profile, model, profile, port=port or free_port())
    await dev.start()

    async def ticker():
        while True:
            with model.lock:
                model.step(tick)
                dev.update(model)
            await asyncio.sleep(tick)

    task = asyncio.create_task(ticker())
    try:
        yield model, dev
    finally:
        task.cancel()
        await dev.stop()


def source(dev: SimModbusDevice, name: str = "cdu", **kw) -> ModbusSource:
    kw.setdefault("timeout", 0.5)
    kw.setdefault("channels", dev.zones)
    return ModbusSource(name, dev.name, dev.profile, *dev.endpoint, **kw)


def value(readings, spec, **labels):
    found = [r for r in readings if r.spec is spec and all(r.label(k) == v for k, v in labels.items())]
    assert len(found) == 1, f"{spec.name}{labels}: {found}"
    return found[0]


def expected_point_value(dev: SimModbusDevice, point) -> float:
    """What the simulator encoded for a point, decoded by hand (raw registers -> device unit -> base unit)."""
    words = [dev._tables[point.table][point.address + k] for k in range(point.width)]
    raw = words[0] if point.type == "bit" else decode(words, point.type, point.order)
    return point.to_base(raw * point.scale + point.offset)


@pytest.mark.parametrize("profile", list_profiles())
def test_every_point_decodes_to_what_the_simulator_set(profile):
    async def run():
        model = RackModel(leak_zones={"zone-a": ["node01"], "zone-b": ["node02"]})
        with model.lock:  # values away from defaults: negative, fractional, a wet zone, one pump off
            c = model.coolant
            c.ambient_c, c.humidity_pct, c.primary_supply_c = -3.5, 61.0, 13.25
            c.pump_running[1] = False
            c.leak_zones["zone-b"] = "wet"
            model.step(0.0)
        async with simulated(profile, model) as (model, dev):
            src = source(dev)
            with model.lock:
                dev.update(model)
                c = model.coolant
                truth = {"secondary_supply_c": c.secondary_supply_c, "ambient_c": c.ambient_c,
                         "primary_supply_c": c.primary_supply_c, "flow": c.flow_lpm / 60000}
            for p in dev.points:  # hold the registers still while the collector reads them
                dev.set_stuck(p.name)
            result = await src.poll()
            await src.close()
            assert result.partial_errors == {}
            checked = 0
            for p in dev.points:
                if not src.wired(p):  # a leak channel wired to no zone: not reported at all
                    assert not [r for r in result.readings if r.label("zone") == f"{dev.name}-ch{p.channel}"]
                    continue
                for n, bit in (p.bits or {}).items():
                    labels = {**p.labels, **bit.labels}
                    if "zone" in mm.ALL[bit.metric].labels:
                        labels["zone"] = src.zone(p.channel)
                    r = value(result.readings, mm.ALL[bit.metric], **labels)
                    word = dev._tables[p.table][p.address]
                    assert r.value == float((word >> n) & 1), (p.name, n)
                    if dev.bindings.bits.get(p.name, {}).get(n) == "leak.wet":
                        assert r.value == float(labels["zone"] == "zone-b"), labels
                    checked += 1
                quantity = dev.bindings.points.get(p.name)
                if p.metric is None or quantity is None:
                    continue
                labels = {**p.labels}
                if "zone" in mm.ALL[p.metric].labels:
                    labels["zone"] = src.zone(p.channel)
                r = value(result.readings, mm.ALL[p.metric], **labels)
                assert r.ok, r
                assert r.value == pytest.approx(expected_point_value(dev, p), rel=1e-6, abs=1e-9)
                if quantity in truth:  # and the model's own value, within the register's resolution
                    assert r.value == pytest.approx(truth[quantity], abs=abs(p.to_base(p.scale) - p.to_base(0)) + 1e-6)
                checked += 1
            assert checked > 0
    asyncio.run(run())


def test_reference_cdu_values_and_derived_readings():
    async def run():
        async with simulated("reference-cdu") as (model, dev):
            src = source(dev, rack_power_w=lambda: 20_000.0)
            result = await src.poll()
            await src.close()
            rs = result.readings
            with model.lock:
                c = model.coolant
                flow = c.flow_lpm / 60000
            assert value(rs, mm.FLOW, loop="secondary").value == pytest.approx(flow, rel=1e-3)
            assert value(rs, mm.PUMP_RUNNING, pump="2").value == 1.0
            sup = value(rs, mm.TEMPERATURE, loop="secondary", point="supply").value
            ret = value(rs, mm.TEMPERATURE, loop="secondary", point="return").value
            heat = value(rs, mm.HEAT_REMOVED).value
            assert heat == pytest.approx(flow * 1025 * 3900 * (ret - sup), rel=1e-3)
            dew = value(rs, mm.DEW_POINT).value
            assert dew == pytest.approx(11.3, abs=0.2)  # 24 C, 45 % RH (psychrometric tables: 11.3 C)
            assert value(rs, mm.DEW_MARGIN).value == pytest.approx(sup - dew)
            assert value(rs, mm.APPROACH).value == pytest.approx(sup - 18.0)
            assert value(rs, mm.FLOW_PER_POWER).value == pytest.approx(flow / 20_000.0, rel=1e-3)
            assert value(rs, mm.LEAK_DETECTED, zone="zone-a", sensor="cdu-leak-1").value == 0.0
            assert value(rs, mm.REQUESTS, device=dev.name).value == 4.0  # one request per contiguous block
    asyncio.run(run())


def test_gpu_load_heats_the_return_line_and_a_power_cap_cools_it():
    async def run():
        model = RackModel(leak_zones={"zone-a": ["node01"]})
        with model.lock:
            model.coolant.nominal_flow_lpm = 75.0  # a loop sized for this small rack, so the rise is visible
            for n in model.nodes.values():
                for g in n.gpus:
                    g.workload = 0.0
        async with simulated("reference-cdu", model) as (model, dev):
            src = source(dev)

            async def delta():
                rs = (await src.poll()).readings
                return (value(rs, mm.TEMPERATURE, loop="secondary", point="return").value
                        - value(rs, mm.TEMPERATURE, loop="secondary", point="supply").value), rs

            await await_for(lambda: _when(delta, lambda d: d < 0.3), timeout=10, what="idle rack settles")
            idle, _ = await delta()
            with model.lock:
                for n in model.nodes.values():
                    for g in n.gpus:
                        g.workload = 1.0
            await await_for(lambda: _when(delta, lambda d: d > idle + 0.5), timeout=10, what="return line heats up")
            hot, rs = await delta()
            with model.lock:
                gpu_heat = model.heat_w()
            assert value(rs, mm.HEAT_REMOVED).value == pytest.approx(gpu_heat, rel=0.05)
            with model.lock:
                for n in model.nodes.values():
                    for g in n.gpus:
                        model.set_power_limit(n.name, g.index, 200_000)
            await await_for(lambda: _when(delta, lambda d: d < hot * 0.5), timeout=10, what="a power cap cools it")
            await src.close()
    asyncio.run(run())


async def _when(fn, pred):
    d, _ = await fn()
    return pred(d)


def test_sentinel_and_out_of_range_are_sensor_faults_not_zero_flow():
    async def run():
        async with simulated("reference-cdu") as (model, dev):
            src = source(dev)
            dev.set_sentinel("secondary_flow")
            dev.set_sentinel("secondary_supply_temp")
            rs = (await src.poll()).readings
            flow = value(rs, mm.FLOW, loop="secondary")
            assert flow.quality is Quality.SENSOR_FAULT
            assert value(rs, mm.TEMPERATURE, loop="secondary", point="supply").quality is Quality.SENSOR_FAULT
            assert not any(r.spec is mm.HEAT_REMOVED for r in rs)  # nothing derived from a faulty input
            assert value(rs, mm.ALARM, alarm="low_flow").value == 0.0
            dev.set_sentinel("secondary_flow", False)
            dev.set_sentinel("secondary_supply_temp", False)
            with model.lock:
                model.coolant.reservoir_level = 1.5  # 150 %: outside the physical range
                dev.update(model)
            rs = (await src.poll()).readings
            assert value(rs, mm.RESERVOIR).quality is Quality.SENSOR_FAULT
            assert value(rs, mm.FLOW, loop="secondary").ok
            await src.close()
    asyncio.run(run())


@pytest.mark.parametrize("profile, sensor, zone_channel", [("rle-ld5000", "rope", 1), ("reference-cdu", "cdu-leak-2", 2)])
def test_cable_break_is_a_sensor_fault_never_a_leak(profile, sensor, zone_channel):
    async def run():
        async with simulated(profile) as (model, dev):
            src = source(dev, "leak", subset="leak")
            zone = dev.zones[zone_channel]
            with model.lock:
                model.coolant.leak_zones[zone] = "cable_break"
                dev.update(model)
            rs = (await src.poll()).readings
            assert value(rs, mm.LEAK_FAULT, zone=zone, sensor=sensor, fault="cable_break").value == 1.0
            leak = value(rs, mm.LEAK_DETECTED, zone=zone, sensor=sensor)
            assert leak.quality is Quality.SENSOR_FAULT and leak.value == 0.0
            with model.lock:
                model.coolant.leak_zones[zone] = "wet"
                dev.update(model)
            rs = (await src.poll()).readings
            leak = value(rs, mm.LEAK_DETECTED, zone=zone, sensor=sensor)
            assert leak.ok and leak.value == 1.0
            assert value(rs, mm.LEAK_FAULT, zone=zone, sensor=sensor, fault="cable_break").value == 0.0
            await src.close()
    asyncio.run(run())


def test_injected_leak_shows_within_two_leak_polls():
    """Counted in polls, not seconds: the poll under way when the zone turns wet may miss it, the next must not."""

    async def run():
        async with simulated("rle-ld2100") as (model, dev):
            src = source(dev, "leak", timeout=2.0)
            seen: dict[str, float] = {}
            polls = 0
            wet_at: int | None = None

            async def poller():
                nonlocal polls
                while True:
                    for r in (await src.poll()).readings:
                        if r.spec is mm.LEAK_DETECTED and r.ok:
                            seen[r.label("zone")] = r.value
                    polls += 1
                    await asyncio.sleep(0.05)

            task = asyncio.create_task(poller())
            await await_for(lambda: seen.get("zone-b") == 0.0, timeout=10, what="first leak poll")
            with model.lock:
                model.coolant.leak_zones["zone-b"] = "wet"
            injected_after = polls
            await await_for(lambda: seen.get("zone-b") == 1.0, timeout=20, what="the leak in a poll")
            wet_at = polls
            assert wet_at - injected_after <= 2, (injected_after, wet_at)
            assert seen.get("zone-a") == 0.0
            task.cancel()
            await src.close()
    asyncio.run(run())


def test_device_offline_raises_then_recovers_by_itself():
    async def run():
        async with simulated("reference-cdu") as (model, dev):
            src = source(dev, timeout=0.3)
            assert (await src.poll()).readings
            dev.set_offline(True)
            with pytest.raises(SourceError) as err:
                await src.poll()
            assert err.value.kind in ("connection", "timeout")
            dev.set_offline(False)
            result = await await_for(lambda: _poll_ok(src), timeout=5, what="source recovers")
            assert value(result.readings, mm.FLOW, loop="secondary").ok
            await src.close()
    asyncio.run(run())


async def _poll_ok(src):
    try:
        return await src.poll()
    except SourceError:
        return None


def test_slow_device_times_out_and_answers_again_when_fast():
    async def run():
        async with simulated("rle-ld5000") as (model, dev):
            src = source(dev, "leak", timeout=0.5)
            dev.set_slow(3000)
            with pytest.raises(SourceError) as err:
                await src.poll()
            assert err.value.kind == "timeout"
            dev.set_slow(50)  # slow but well within the timeout: a real answer
            rs = (await src.poll()).readings
            assert value(rs, mm.LEAK_DETECTED, zone="zone-a", sensor="rope").ok
            dev.set_slow(0)
            await src.close()
    asyncio.run(run())


@pytest.mark.parametrize("code", [6, 11])
def test_busy_and_gateway_exceptions_are_retried_and_counted(code):
    async def run():
        async with simulated("rle-ld5000") as (model, dev):
            src = source(dev, "leak", backoff_s=0.01)
            dev.set_exception(code, count=2)  # two refusals, then answers
            result = await src.poll()
            assert result.partial_errors == {}
            assert value(result.readings, mm.LEAK_DETECTED, zone="zone-a", sensor="rope").ok
            assert value(result.readings, mm.EXCEPTIONS, device=dev.name, code=str(code)).value == 2.0
            assert value(result.readings, mm.REQUESTS, device=dev.name).value == 3.0
            dev.set_exception(code)  # refuses for good: the whole device fails as a protocol error
            with pytest.raises(SourceError) as err:
                await src.poll()
            assert err.value.kind == "protocol"
            dev.set_exception(None)
            await src.close()
    asyncio.run(run())


def test_non_retryable_exception_is_a_partial_error():
    async def run():
        async with simulated("reference-cdu") as (model, dev):
            src = source(dev)
            dev.set_exception(2, count=1)  # first block refused with illegal address, the rest answer
            result = await src.poll()
            assert result.partial_errors == {"exception_2": 1}
            assert dev.requests == 4
            await src.close()
    asyncio.run(run())


def test_connection_dropped_mid_poll_is_reconnected():
    async def run():
        async with simulated("reference-cdu") as (model, dev):
            src = source(dev)
            await src.poll()
            dev.drop_connections()
            result = await src.poll()  # same source, same gateway: reconnects on its own
            assert value(result.readings, mm.FLOW, loop="secondary").ok
            await src.close()
    asyncio.run(run())


def test_the_device_counts_open_client_connections_not_every_connection_it_ever_had():
    """What the coordination tests read as "clients of this device" (how many agents poll it): a poller whose
    connection dropped and reconnected is one client, and a poller that closed its connection is none."""
    async def run() -> tuple[int, int, int]:
        async with simulated("reference-cdu") as (model, dev):
            src = source(dev)
            await src.poll()
            one = dev.clients(60.0)
            dev.drop_connections()
            await src.poll()  # reconnects: a new connection of the same poller
            await await_for(lambda: dev.clients(60.0) == 1, 10, what="the dropped connection forgotten")
            after_reconnect = dev.clients(60.0)
            await src.close()
            await await_for(lambda: dev.clients(60.0) == 0, 10, what="the closed connection forgotten")
            return one, after_reconnect, dev.clients(60.0)
    assert asyncio.run(run()) == (1, 1, 0)


def test_stuck_point_freezes_while_the_model_moves():
    async def run():
        async with simulated("reference-cdu") as (model, dev):
            src = source(dev)
            dev.set_stuck("ambient_temp")
            with model.lock:
                model.coolant.ambient_c = 31.0
                model.coolant.humidity_pct = 70.0
                dev.update(model)
            rs = (await src.poll()).readings
            assert value(rs, mm.AMBIENT_TEMP).value == pytest.approx(24.0)
            assert value(rs, mm.AMBIENT_HUMIDITY).value == pytest.approx(0.70)
            await src.close()
    asyncio.run(run())


def test_shared_gateway_serves_cdu_and_fast_leak_sources_on_one_connection():
    async def run():
        async with simulated("reference-cdu") as (model, dev):
            cdu, leak = source(dev, subset="cdu"), source(dev, "leak", subset="leak")
            assert cdu._gw() is leak._gw()
            a, b = await asyncio.gather(cdu.poll(), leak.poll())
            assert not any(r.spec is mm.LEAK_DETECTED for r in a.readings)
            assert any(r.spec is mm.LEAK_DETECTED for r in b.readings)
            await cdu.close()
            await leak.close()
    asyncio.run(run())


def test_write_control_point_validates_writes_and_moves_the_model():
    class Cfg:
        profile, host, unit = "reference-cdu", "127.0.0.1", None

    async def run():
        async with simulated("reference-cdu") as (model, dev):
            cfg = Cfg()
            cfg.port = dev.endpoint[1]
            assert await write_control_point(cfg, "supply_temp_setpoint", 22.5) == pytest.approx(22.5)
            with model.lock:
                assert model.coolant.secondary_supply_setpoint_c == pytest.approx(22.5)
            assert await write_control_point(cfg, "zone_valve_2", 0) == 0
            with model.lock:
                assert model.coolant.valve_open["zone-b"] is False and model.coolant.valve_open["zone-a"] is True
            with pytest.raises(ValueError, match="outside the allowed range"):
                await write_control_point(cfg, "supply_temp_setpoint", 60)
            with pytest.raises(ValueError, match="not a control point"):
                await write_control_point(cfg, "secondary_flow", 1)
            src = source(dev)
            rs = (await src.poll()).readings
            assert value(rs, mm.VALVE_OPEN, zone="zone-b").value == 0.0
            assert value(rs, mm.SUPPLY_SETPOINT).value == pytest.approx(22.5)
            await src.close()
    asyncio.run(run())


@pytest.mark.parametrize("profile", list_profiles())
def test_probe_prints_valid_exposition_for_every_profile(profile):
    promtool = require_binary("promtool")

    async def run():
        async with simulated(profile) as (model, dev):
            return await probe_modbus(profile, *dev.endpoint, timeout=0.5)

    text = asyncio.run(run())
    assert text.strip()
    kind = load_profile(profile).kind
    assert ("supernode_cdu_info{" in text) == (kind == "cdu")
    assert "supernode_leak_detected{" in text or kind == "cdu"
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr


def test_probe_fails_clearly_without_device_or_with_wrong_profile():
    async def run():
        with pytest.raises(ProbeError, match="cannot connect|no answer"):
            await probe_modbus("reference-cdu", "127.0.0.1", free_port(), timeout=0.3)
        async with simulated("rle-ld5000") as (model, dev):
            with pytest.raises(ProbeError, match="does not fit"):
                await probe_modbus("vertiv-liebert-dcd", *dev.endpoint, timeout=0.3)
            with pytest.raises(ProbeError, match="does not fit|protocol"):
                await probe_modbus("rle-ld5000", *dev.endpoint, unit=7, timeout=0.3)
        with pytest.raises(ProbeError, match="not found"):
            await probe_modbus("nope", "127.0.0.1", 1)
    asyncio.run(run())


def _mbpoll(mbpoll: str, port: int, table: str, ref: int, count: int, unit: int = 1) -> list[float]:
    out = subprocess.run([mbpoll, "-m", "tcp", "-p", str(port), "-a", str(unit), "-t", table, "-r", str(ref), "-0",
                          "-c", str(count), "-1", "-o", "2", "127.0.0.1"], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stdout + out.stderr
    vals = re.findall(r"^\[(\d+)\]:\s+(\S+)", out.stdout, re.M)
    assert len(vals) == count, out.stdout
    return [float(v) for _, v in vals]


def test_mbpoll_reads_the_simulator_and_agrees_with_the_profile():
    mbpoll = require_binary("mbpoll")

    async def run():
        results = {}
        for profile in ("reference-cdu", "vertiv-liebert-dcd"):
            async with simulated(profile) as (model, dev):
                with model.lock:
                    model.coolant.ambient_c = -4.5  # a signed value
                    model.coolant.pump_running[0] = False
                    dev.update(model)
                dev.set_stuck(dev.points[0].name)  # hold the registers still while both clients read
                for p in dev.points:
                    dev.set_stuck(p.name)
                src = source(dev)
                rs = (await src.poll()).readings
                await src.close()
                port = dev.endpoint[1]
                if profile == "reference-cdu":
                    regs = await asyncio.to_thread(_mbpoll, mbpoll, port, "3", 0, 16)
                    bits = await asyncio.to_thread(_mbpoll, mbpoll, port, "1", 0, 2)
                    results[profile] = (rs, regs, bits)
                else:
                    # mbpoll's default float word order is little endian (CDAB), the DCD's "float (sw)"
                    floats = [(await asyncio.to_thread(_mbpoll, mbpoll, port, "3:float", ref, 1))[0] for ref in (130, 134)]
                    results[profile] = (rs, floats)
        rs, regs, bits = results["reference-cdu"]
        signed = [v - 65536 if v >= 32768 else v for v in regs]
        assert value(rs, mm.TEMPERATURE, loop="secondary", point="supply").value == pytest.approx(signed[0] / 100)
        assert value(rs, mm.FLOW, loop="secondary").value == pytest.approx(regs[4] / 10 / 60000)
        assert value(rs, mm.AMBIENT_TEMP).value == pytest.approx(signed[11] / 100) == pytest.approx(-4.5)
        assert value(rs, mm.PRESSURE, loop="secondary", point="supply").value == pytest.approx(regs[5] * 100)
        assert [value(rs, mm.PUMP_RUNNING, pump=str(i)).value for i in (1, 2)] == bits == [0.0, 1.0]
        rs, floats = results["vertiv-liebert-dcd"]
        assert value(rs, mm.TEMPERATURE, loop="primary", point="supply").value == pytest.approx(floats[0], abs=1e-4)
        assert value(rs, mm.TEMPERATURE, loop="primary", point="return").value == pytest.approx(floats[1], abs=1e-4)

    asyncio.run(run())


def test_firmware_register_feeds_cdu_info():
    """A profile point marked `info: firmware` becomes the firmware label of supernode_cdu_info (drift alerts)."""
    async def run():
        model = RackModel()
        async with simulated("reference-cdu", model) as (model, dev):
            src = source(dev)
            info = value((await src.poll()).readings, mm.CDU_INFO)
            assert info.labels["firmware"] == "2.14"
            dev.set_sentinel("firmware_version")
            info = value((await src.poll()).readings, mm.CDU_INFO)
            assert info.labels["firmware"] == "unknown"  # an unreadable version is not a version
            await src.close()
    asyncio.run(run())


@pytest.mark.parametrize("profile", list_profiles())
def test_simulator_bindings_name_real_points_and_shipped_profiles_carry_none(profile):
    """The simulator's description of a device lives with the simulator; it cannot drift from the profile."""
    from sim.modbus_devices import load_bindings

    prof = load_profile(profile)
    points = {p.name: p for p in prof.expanded()}
    bindings = load_bindings(profile)
    assert set(bindings.points) <= set(points), set(bindings.points) - set(points)
    for name, bits in bindings.bits.items():
        assert set(bits) <= set(points[name].bits or {}), (name, bits)
    raw = yaml.safe_load((PROFILE_DIR / f"{profile}.yaml").read_text())
    raw["points"][0]["sim"] = "flow"  # a simulator field in a shipped profile is refused
    with pytest.raises(Exception, match="sim"):
        parse_profile(raw, profile)
