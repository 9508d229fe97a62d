"""The BACnet/IP client (bacpypes3) against another stack's device (legacy BACpypes, sim/bacnet_device.py) on
127.0.0.1: every object of the reference and the vendor object list decoded, one ReadPropertyMultiple a poll (or
ReadProperty where the device has none), status flags and reliability as quality, a device that errs or keeps
silent as a failing source, priority-array aware writes, and `probe bacnet` as the real CLI."""

from __future__ import annotations

import asyncio
import math
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest

from exporters.cooling.bacnet.client import BacnetLink
from exporters.cooling.bacnet.control import read_control_point, write_control_point
from exporters.cooling.bacnet.probe import probe_bacnet
from exporters.cooling.bacnet.source import BacnetSource
from exporters.errors import ProbeError
from exporters.model import Quality, SourceError
from tests.bacnet_peer import bacnet_device
from tests.helpers import REPO, free_port

# Reference CDU: each point's present value in its device unit, and the reading in base units (by hand).
REFERENCE = {
    "secondary_supply_temp": (21.5, 21.5), "secondary_return_temp": (31.25, 31.25),
    "primary_supply_temp": (15.0, 15.0), "primary_return_temp": (25.5, 25.5),
    "secondary_flow": (600.0, 0.01), "secondary_supply_pressure": (250.0, 250_000.0),
    "secondary_return_pressure": (180.0, 180_000.0), "filter_differential_pressure": (12.5, 12_500.0),
    "pump_1_speed": (55.0, 0.55), "pump_2_speed": (45.0, 0.45), "reservoir_level": (80.0, 0.8),
    "ambient_temp": (24.0, 24.0), "ambient_humidity": (40.0, 0.4),
    "leak_input_1": (1, 1.0), "leak_input_2": (0, 0.0), "pump_1_running": (1, 1.0), "pump_2_running": (0, 0.0),
    "alarm_pump_fail": (1, 1.0), "alarm_low_flow": (0, 0.0), "alarm_supply_high": (0, 0.0),
    "alarm_reservoir_low": (1, 1.0), "alarm_leak": (1, 1.0),
    "supply_temp_setpoint": (24.0, 24.0), "pump_speed_setpoint": (70.0, 0.7),
    "zone_valve_1": (1, 1.0), "zone_valve_2": (0, 0.0),
}


@pytest.fixture(scope="module")
def cdu():
    with bacnet_device("reference-cdu") as dev:
        dev.command(set={name: raw for name, (raw, _) in REFERENCE.items()})
        yield dev


def _poll(dev, subset: str = "all", profile: str = "reference-cdu", link: BacnetLink | None = None, **kw):
    async def run():
        lk = link or BacnetLink(*dev.endpoint, timeout=2.0, name="cdu1")
        src = BacnetSource("cdu", "cdu1", profile, lk, subset=subset, cov=False, **kw)
        try:
            return await src.poll(), lk
        finally:
            if link is None:
                await lk.close()
    return asyncio.run(run())


def _by_point(result, profile: str = "reference-cdu") -> dict[str, tuple[float, Quality]]:
    from exporters.cooling.bacnet.profile import load_profile

    out = {}
    for p in load_profile(profile).points:
        want = dict(p.labels, **({"zone": f"cdu1-ch{p.channel}"} if p.channel else {}))
        match = [r for r in result.readings if r.name == p.metric and all(r.label(k) == v for k, v in want.items())]
        assert len(match) == 1, (p.name, match)
        out[p.name] = (match[0].value, match[0].quality)
    return out


def test_every_object_of_the_reference_cdu_is_decoded_in_base_units(cdu):
    result, _ = _poll(cdu)
    got = _by_point(result)
    assert set(got) == set(REFERENCE)
    for name, (_, want) in REFERENCE.items():
        value, quality = got[name]
        assert quality is Quality.OK, name
        assert math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-9), (name, value, want)
    info = [r for r in result.readings if r.name == "supernode_cdu_info"]
    assert [dict(r.labels)["firmware"] for r in info] == ["2.14"]  # from the device object, not the profile


def test_every_object_of_the_vendor_object_list_is_decoded():
    """Vertiv Liebert HPC (IntelliSlot BACnet, Table 89): multistate objects mapped by the table's states."""
    with bacnet_device("vertiv-liebert-hpc") as dev:
        dev.command(set={"pump_1_state": 2, "pump_2_state": 1, "system_status": 4, "system_operating_state": 1})
        result, _ = _poll(dev, profile="vertiv-liebert-hpc")
        got = _by_point(result, "vertiv-liebert-hpc")
        assert got == {"pump_1_state": (1.0, Quality.OK), "pump_2_state": (0.0, Quality.OK),
                       "system_status": (1.0, Quality.OK), "system_operating_state": (1.0, Quality.OK)}
        dev.command(set={"system_status": 3, "system_operating_state": 3, "pump_1_state": 7})  # 7: no such state
        got = _by_point(_poll(dev, profile="vertiv-liebert-hpc")[0], "vertiv-liebert-hpc")
        assert got["system_status"] == (0.0, Quality.OK) and got["system_operating_state"] == (0.0, Quality.OK)
        assert got["pump_1_state"][1] is Quality.SENSOR_FAULT


def test_a_poll_is_one_read_property_multiple_and_the_who_is_goes_to_the_device_only(cdu):
    async def run():
        link = BacnetLink(*cdu.endpoint, timeout=2.0, name="cdu1")
        src = BacnetSource("cdu", "cdu1", "reference-cdu", link, subset="cdu", cov=False)
        await src.poll()  # identifies the device (Who-Is, its Device object) and reads
        before = cdu.stats()
        for _ in range(3):
            await src.poll()
        after = cdu.stats()
        (udp,) = [layer.server for layer in link._app.link_layers.values()]  # the client's one UDP socket
        sockets = (udp.local_transport.get_extra_info("sockname"), udp.broadcast_address, udp.broadcast_transport)
        await link.close()
        return before, after, sockets
    before, after, (bound, broadcast_address, broadcast_socket) = asyncio.run(run())
    assert after["ReadPropertyMultipleRequest"] - before["ReadPropertyMultipleRequest"] == 3
    assert after.get("ReadPropertyRequest", 0) == before.get("ReadPropertyRequest", 0)
    assert after["WhoIsRequest"] == before["WhoIsRequest"]
    # Bound to the address that routes to the device, never 0.0.0.0, with no broadcast address or socket at all.
    assert bound[0] == "127.0.0.1" and broadcast_address is None and broadcast_socket is None


WHO_IS = bytes.fromhex("810a0008" "0100" "1008")  # BVLL unicast, NPDU, unconfirmed Who-Is (no limits)


def test_the_client_answers_no_one(cdu):
    async def run():
        link = BacnetLink(*cdu.endpoint, timeout=2.0)
        await BacnetSource("leak", "cdu1", "reference-cdu", link, subset="leak", cov=False).poll()
        (udp,) = [layer.server for layer in link._app.link_layers.values()]
        client = udp.local_transport.get_extra_info("sockname")
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            s.setblocking(False)
            s.sendto(WHO_IS, cdu.endpoint)  # the control: the device answers this very datagram with an I-Am
            answer = await asyncio.wait_for(loop.sock_recvfrom(s, 1500), 10)
            s.sendto(WHO_IS, client)
            s.sendto(bytes.fromhex("810a0011" "0104" "0005" "0c0c" "020003e9" "194b"), client)  # ReadProperty
            try:
                stray = await asyncio.wait_for(loop.sock_recvfrom(s, 1500), 1.0)
            except TimeoutError:
                stray = None
        await link.close()
        return answer, stray
    answer, stray = asyncio.run(run())
    assert answer[0][6:8] == b"\x10\x00"  # the device's I-Am
    assert stray is None


def test_a_device_without_read_property_multiple_is_read_property_by_property():
    with bacnet_device("reference-cdu", no_rpm=True) as dev:
        dev.command(set={name: raw for name, (raw, _) in REFERENCE.items()})
        result, link = _poll(dev)
        assert link.info is None or not link.info.rpm
        got = _by_point(result)
        assert all(q is Quality.OK for _, q in got.values())
        assert math.isclose(got["secondary_flow"][0], 0.01)
        stats = dev.stats()
        assert stats.get("ReadPropertyMultipleRequest", 0) == 0 and stats["ReadPropertyRequest"] >= len(REFERENCE)

        async def claims_rpm_then_rejects():
            lk = BacnetLink(*dev.endpoint, timeout=2.0)
            src = BacnetSource("cdu", "cdu1", "reference-cdu", lk, cov=False)
            (await lk.identify()).rpm = True  # as a device whose services list says more than it serves
            try:
                return await src.poll(), lk.info.rpm
            finally:
                await lk.close()
        result, rpm = asyncio.run(claims_rpm_then_rejects())
        assert rpm is False and dev.stats()["ReadPropertyMultipleRequest"] == 1
        assert all(q is Quality.OK for _, q in _by_point(result).values())


def test_status_flags_reliability_and_units_become_quality(cdu):
    cdu.command(status={"secondary_return_temp": {"fault": True},
                        "primary_supply_temp": {"out_of_service": True},
                        "pump_1_speed": {"overridden": True},
                        "leak_input_2": {"reliability": "open-loop", "fault": True}},
                units={"ambient_temp": "degrees-fahrenheit", "reservoir_level": "kilowatt-hours"},
                set={"ambient_temp": 77.0, "secondary_supply_temp": 250.0})  # 250 C: outside the range
    try:
        result, _ = _poll(cdu)
        got = _by_point(result)
        assert got["secondary_return_temp"][1] is Quality.SENSOR_FAULT
        assert got["primary_supply_temp"][1] is Quality.STALE
        assert got["pump_1_speed"][1] is Quality.STALE
        assert got["leak_input_2"][1] is Quality.SENSOR_FAULT
        faults = [dict(r.labels) for r in result.readings if r.name == "supernode_leak_sensor_fault"]
        assert faults == [{"zone": "cdu1-ch2", "sensor": "cdu-leak-2", "fault": "cable_break"}]
        assert got["ambient_temp"] == (pytest.approx(25.0), Quality.OK)  # the device's own unit: 77 F
        assert got["reservoir_level"][1] is Quality.SENSOR_FAULT  # a unit the agent cannot convert
        assert got["secondary_supply_temp"][1] is Quality.SENSOR_FAULT
        assert got["secondary_flow"] == (pytest.approx(0.01), Quality.OK)  # the others stay good
    finally:
        cdu.command(status={n: {"fault": False, "out_of_service": False, "overridden": False,
                                "reliability": "no-fault-detected"}
                            for n in ("secondary_return_temp", "primary_supply_temp", "pump_1_speed", "leak_input_2")},
                    units={"ambient_temp": "degrees-celsius", "reservoir_level": "percent"},
                    set={"ambient_temp": 24.0, "secondary_supply_temp": 21.5})


@pytest.mark.parametrize("mode,kind", [("error", "protocol"), ("mute", "timeout")])
def test_a_device_that_errs_or_keeps_silent_fails_the_poll_and_recovers(cdu, mode, kind):
    async def run():
        link = BacnetLink(*cdu.endpoint, timeout=0.5, name="cdu1")
        src = BacnetSource("leak", "cdu1", "reference-cdu", link, subset="leak", cov=False)
        await src.poll()
        cdu.command(mode=mode)
        try:
            with pytest.raises(SourceError) as err:
                async with asyncio.timeout(10):
                    await src.poll()
            assert link.info is None  # learnt again (Who-Is) once it answers
        finally:
            cdu.command(mode="normal")
        back = await src.poll()
        await link.close()
        return err.value, back
    err, back = asyncio.run(run())
    assert err.kind == kind
    assert [r.value for r in back.readings if r.name == "supernode_leak_detected"] == [1.0, 0.0]


def test_a_valve_write_is_priority_array_aware(cdu):
    device = SimpleNamespace(profile="reference-cdu", host=cdu.endpoint[0], port=cdu.endpoint[1], name="cdu1")
    assert asyncio.run(write_control_point(device, "zone_valve_1", 0.0)) == 0.0
    assert ("zone_valve_1", 0) in cdu.writes
    assert asyncio.run(read_control_point(device, "zone_valve_1")) == 0.0
    cdu.command(command={"zone_valve_1": [1, 3]})  # a BMS holds the valve open at priority 3
    try:
        with pytest.raises(SourceError, match="overridden at priority 3"):
            asyncio.run(write_control_point(device, "zone_valve_1", 0.0))
        assert asyncio.run(read_control_point(device, "zone_valve_1")) == 1.0
    finally:
        cdu.command(command={"zone_valve_1": [None, 3]})
        asyncio.run(write_control_point(device, "zone_valve_1", 1.0))
    with pytest.raises(ValueError, match="outside the allowed range"):
        asyncio.run(write_control_point(device, "supply_temp_setpoint", 90.0))
    with pytest.raises(ValueError, match="not a control point"):
        asyncio.run(write_control_point(device, "secondary_flow", 1.0))


def _probe(*args: str) -> tuple[int, str, str]:
    proc = subprocess.run([sys.executable, "-m", "agent.cli", "probe", "bacnet", *args], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=90)
    return proc.returncode, proc.stdout, proc.stderr


def test_probe_bacnet_reads_the_cdu_and_says_in_one_line_when_it_cannot(cdu):
    host, port = cdu.endpoint
    rc, out, err = _probe("--profile", "reference-cdu", "--target", f"{host}:{port}")
    assert rc == 0, err
    assert f'supernode_cdu_flow_cubic_meters_per_second{{cdu="{host}:{port}",loop="secondary"}} 0.01' in out
    rc, out, err = _probe("--profile", "vertiv-liebert-hpc", "--target", f"{host}:{port}")
    assert rc == 1 and out == "" and "unknown-object" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ProbeError, match="no I-Am"):  # nothing there: the same error, without a third process
        asyncio.run(probe_bacnet("reference-cdu", "127.0.0.1", free_port(socket.SOCK_DGRAM), timeout=0.5))
