"""The Redfish client against DMTF's own mockups served as they are by sushy-static (OpenStack), over HTTPS.

Expected values are read from the mockup JSON files themselves (and converted to base units here), so
the test says "the agent exports exactly what DMTF publishes", not numbers copied by hand; two anchors
from the mockup (42 L/min, 827 kPa) check the conversion on its own.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from exporters.cooling import modbus_metrics as mm
from exporters.model import Quality, SourceError
from exporters.redfish import metrics as rm
from exporters.redfish.client import RedfishClient
from exporters.redfish.source import RedfishSource
from tests.helpers import REPO, require_binary
from tests.redfish_peer import MOCKUPS, copy_mockup, edit_resource, sushy_static

UNIT = {"Celsius": 1.0, "kPa": 1e3, "LitersPerMinute": 1 / 60000.0, "kW": 1e3, "Percent": 0.01}
CONNECTOR_FIELDS = {  # field -> (family, extra labels, unit)
    "SupplyTemperatureCelsius": (rm.CONNECTOR_TEMPERATURE, {"point": "supply"}, "Celsius"),
    "ReturnTemperatureCelsius": (rm.CONNECTOR_TEMPERATURE, {"point": "return"}, "Celsius"),
    "SupplyPressurekPa": (rm.CONNECTOR_PRESSURE, {"point": "supply"}, "kPa"),
    "ReturnPressurekPa": (rm.CONNECTOR_PRESSURE, {"point": "return"}, "kPa"),
    "DeltaPressurekPa": (rm.CONNECTOR_PRESSURE, {"point": "delta"}, "kPa"),
    "FlowLitersPerMinute": (rm.CONNECTOR_FLOW, {}, "LitersPerMinute"),
    "HeatRemovedkW": (rm.CONNECTOR_HEAT, {}, "kW"),
}


def _json(mockup: Path, uri: str) -> dict:
    return json.loads((mockup / uri.removeprefix("/redfish/v1").strip("/") / "index.json").read_text())


def _poll(url: str, ca: Path, kind: str = "cdu", name: str = "svc", **client_kw) -> tuple[RedfishSource, list]:
    async def run():
        src = RedfishSource(name, RedfishClient(url, ca_file=ca, **client_kw), kind=kind, events="off")
        try:
            return src, (await src.poll()).readings
        finally:
            await src.close()
    return asyncio.run(run())


def _value(readings, spec, **labels):
    got = [r for r in readings if r.spec is spec and all(r.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, (spec.name, labels, got)
    return got[0]


def _expected_connectors(mockup: Path, collection_uri: str, equipment: str, loop: str) -> list[tuple]:
    out = []
    for member in _json(mockup, collection_uri)["Members"]:
        res = _json(mockup, member["@odata.id"])
        for field, (spec, extra, unit) in CONNECTOR_FIELDS.items():
            if field in res:
                labels = {"bmc": "svc", "equipment": equipment, "connector": res["Id"], "loop": loop, **extra}
                out.append((spec, labels, res[field]["Reading"] * UNIT[unit]))
    return out


@pytest.fixture
def cooling_unit(tmp_path):
    with sushy_static(MOCKUPS / "public-cooling-unit", tmp_path) as peer:
        yield peer


def test_cooling_unit_exports_exactly_the_mockup_values(cooling_unit):
    mockup = MOCKUPS / "public-cooling-unit"
    src, readings = _poll(cooling_unit["url"], cooling_unit["ca"])
    expected = (_expected_connectors(mockup, "/redfish/v1/ThermalEquipment/CDUs/1/PrimaryCoolantConnectors",
                                     "CDUs/1", "primary")
                + _expected_connectors(mockup, "/redfish/v1/ThermalEquipment/CDUs/1/SecondaryCoolantConnectors",
                                       "CDUs/1", "secondary"))
    assert len(expected) == 14
    for spec, labels, want in expected:
        r = _value(readings, spec, **labels)
        assert r.ok and math.isclose(r.value, want, rel_tol=1e-12), (spec.name, labels, r.value, want)
    # The anchors of RECIPES.md, converted by hand: 42 L/min and 827 kPa.
    flow = _value(readings, rm.CONNECTOR_FLOW, loop="primary").value
    assert math.isclose(flow, 42 / 60000), flow
    assert _value(readings, rm.CONNECTOR_PRESSURE, loop="primary", point="supply").value == 827_000
    # Pumps: pump 1 runs at 38.5 %; pump 2 is UnavailableOffline, so its speed is a sensor fault and its
    # health Critical, as its JSON says.
    for pid in ("1", "2"):
        pump = _json(mockup, f"/redfish/v1/ThermalEquipment/CDUs/1/Pumps/{pid}")
        speed = _value(readings, rm.PUMP_SPEED, pump=pid)
        health = _value(readings, rm.HEALTH, kind="pump", resource=pid)
        assert health.value == {"OK": 0, "Warning": 1, "Critical": 2}[pump["Status"]["Health"]]
        if pump["Status"]["State"] == "Enabled":
            assert speed.ok and math.isclose(speed.value, pump["PumpSpeedPercent"]["Reading"] / 100)
        else:
            assert speed.quality is Quality.SENSOR_FAULT
    assert _value(readings, rm.HEALTH, kind="pump", resource="2").value == 2
    filt = _json(mockup, "/redfish/v1/ThermalEquipment/CDUs/1/Filters/1")
    assert _value(readings, rm.HEALTH, kind="filter", resource="1").value == \
        {"OK": 0, "Warning": 1, "Critical": 2}[filt["Status"]["Health"]]


def test_cooling_unit_leak_detectors_found_by_links_once_each(cooling_unit):
    """The CDU shows its two detectors twice (its LeakDetection and its chassis' LeakDetectors): one series each."""
    mockup = MOCKUPS / "public-cooling-unit"
    src, readings = _poll(cooling_unit["url"], cooling_unit["ca"], name="svc")
    states = [r for r in readings if r.spec is rm.DETECTOR_STATE]
    ids = sorted(m["@odata.id"].rsplit("/", 1)[-1]
                 for m in _json(mockup, "/redfish/v1/Chassis/CDU/LeakDetectors")["Members"])
    assert sorted(r.labels["detector"] for r in states) == ids == ["Moisture", "Overflow"]
    for r in states:
        res = _json(mockup, f"/redfish/v1/Chassis/CDU/LeakDetectors/{r.labels['detector']}")
        assert r.ok and r.value == {"OK": 0, "Warning": 1, "Critical": 2}[res["DetectorState"]]
        assert r.labels["type"] == res["LeakDetectorType"] and r.labels["chassis"] == "CDU"
    leaks = [r for r in readings if r.spec is mm.LEAK_DETECTED]
    assert sorted(r.labels["sensor"] for r in leaks) == ["svc/CDU/Moisture", "svc/CDU/Overflow"]
    assert all(r.ok and r.value == 0 and r.labels["zone"] == "svc" for r in leaks)
    info = _value(readings, rm.SERVICE_INFO)
    cdu = _json(mockup, "/redfish/v1/ThermalEquipment/CDUs/1")
    assert (info.labels["model"], info.labels["firmware"]) == (cdu["Model"], cdu["FirmwareVersion"])
    assert info.labels["redfish_version"] == _json(mockup, "/redfish/v1")["RedfishVersion"]


def test_liquid_cooled_server_exports_exactly_the_mockup_values(tmp_path):
    mockup = MOCKUPS / "public-liquid-cooled-server"
    with sushy_static(mockup, tmp_path) as peer:
        src, readings = _poll(peer["url"], peer["ca"], kind="tray")
    expected = _expected_connectors(mockup, "/redfish/v1/Chassis/1U/ThermalSubsystem/CoolantConnectors",
                                    "Chassis/1U", "chassis")
    assert len(expected) == 4  # two cold plates, supply and return each (no pressure, no flow in this mockup)
    for spec, labels, want in expected:
        r = _value(readings, spec, **labels)
        assert r.ok and math.isclose(r.value, want, rel_tol=1e-12), (spec.name, labels, r.value, want)
    for member in _json(mockup, "/redfish/v1/Chassis/1U/ThermalSubsystem/Pumps")["Members"]:
        pump = _json(mockup, member["@odata.id"])
        assert math.isclose(_value(readings, rm.PUMP_SPEED, pump=pump["Id"]).value,
                            pump["PumpSpeedPercent"]["Reading"] / 100)
    assert not [r for r in readings if r.spec is rm.DETECTOR_STATE]  # this server has no leak detectors
    system = src.tree.systems[0]
    assert system.reset_target == "/redfish/v1/Systems/437XR1138R2/Actions/ComputerSystem.Reset"
    assert {"ForceOff", "On"} <= set(system.reset_types)


def test_detector_states_decode_with_the_quality_rules(tmp_path):
    """Critical is wet; a missing DetectorState is a sensor fault (never a leak); Disabled is unsupported."""
    mockup = copy_mockup("public-cooling-unit", tmp_path)
    moisture, overflow = "/redfish/v1/Chassis/CDU/LeakDetectors/Moisture", "/redfish/v1/Chassis/CDU/LeakDetectors/Overflow"
    with sushy_static(mockup, tmp_path) as peer:
        edit_resource(mockup, moisture, DetectorState="Critical", Status={"State": "Enabled", "Health": "Critical"})
        _, readings = _poll(peer["url"], peer["ca"])
        assert _value(readings, rm.DETECTOR_STATE, detector="Moisture").value == 2
        wet = _value(readings, mm.LEAK_DETECTED, sensor="svc/CDU/Moisture")
        assert wet.ok and wet.value == 1
        edit_resource(mockup, moisture, DetectorState=None, Status={"State": "Enabled", "Health": "OK"})
        edit_resource(mockup, overflow, Status={"State": "Disabled"})
        _, readings = _poll(peer["url"], peer["ca"])
        fault = _value(readings, mm.LEAK_DETECTED, sensor="svc/CDU/Moisture")
        assert fault.quality is Quality.SENSOR_FAULT
        assert _value(readings, mm.LEAK_FAULT, sensor="svc/CDU/Moisture", fault="detector").value == 1
        assert _value(readings, rm.DETECTOR_STATE, detector="Overflow").quality is Quality.UNSUPPORTED
        assert not [r for r in readings if r.spec is mm.LEAK_DETECTED and r.labels["sensor"] == "svc/CDU/Overflow"]
        # Dry by its state but unhealthy itself (a cut cable): its "dry" cannot be trusted.
        edit_resource(mockup, moisture, DetectorState="OK", Status={"State": "Enabled", "Health": "Warning"})
        _, readings = _poll(peer["url"], peer["ca"])
        assert _value(readings, mm.LEAK_DETECTED, sensor="svc/CDU/Moisture").quality is Quality.SENSOR_FAULT


def test_a_moved_resource_is_found_again_by_a_new_walk(tmp_path):
    """A 404 on a cached detector walks the tree again from the root, and the detector's new place is read."""
    mockup = copy_mockup("public-cooling-unit", tmp_path)

    async def run(peer):
        src = RedfishSource("svc", RedfishClient(peer["url"], ca_file=peer["ca"]), kind="cdu", events="off")
        try:
            first = await src.poll()
            assert src.discoveries == {"first": 1}
            base = mockup / "Chassis" / "CDU" / "LeakDetectors"
            shutil.move(base / "Moisture", base / "Moisture2")
            edit_resource(mockup, "/redfish/v1/Chassis/CDU/LeakDetectors/Moisture2",
                 **{"@odata.id": "/redfish/v1/Chassis/CDU/LeakDetectors/Moisture2"})
            coll = json.loads((base / "index.json").read_text())
            coll["Members"][0]["@odata.id"] = "/redfish/v1/Chassis/CDU/LeakDetectors/Moisture2"
            (base / "index.json").write_text(json.dumps(coll))
            second = await src.poll()
            return first, second, dict(src.discoveries), [r.uri for r in src.tree.of("leak_detector")]
        finally:
            await src.close()

    with sushy_static(mockup, tmp_path) as peer:
        first, second, walks, uris = asyncio.run(run(peer))
    assert walks == {"first": 1, "not_found": 1}
    assert "/redfish/v1/Chassis/CDU/LeakDetectors/Moisture2" in uris
    # The CDU's own LeakDetection collection still lists .../Moisture as the same detector: the walk keeps
    # one detector per (chassis, Id), now read at its new place, and its state is read again.
    assert [r.value for r in second.readings if r.spec is rm.DETECTOR_STATE and r.labels["detector"] == "Moisture"] \
        == [0.0]
    assert _value(second.readings, rm.DISCOVERIES, why="not_found").value == 1


def test_tls_is_verified_never_skipped(cooling_unit, tmp_path):
    """No CA: refused as tls; the right pin: trusted; a wrong pin: refused. There is no insecure mode."""
    url = cooling_unit["url"]
    with pytest.raises(SourceError) as err:
        _poll(url, None)
    assert err.value.kind == "tls"
    src, readings = asyncio.run(_pinned(url, cooling_unit["pin"]))
    assert [r for r in readings if r.spec is rm.DETECTOR_STATE]
    with pytest.raises(SourceError) as err:
        asyncio.run(_pinned(url, "00" * 32))
    assert err.value.kind == "tls" and "pinned" in str(err.value)


async def _pinned(url: str, pin: str):
    src = RedfishSource("svc", RedfishClient(url, pinned_sha256=pin), kind="cdu", events="off")
    try:
        return src, (await src.poll()).readings
    finally:
        await src.close()


def _probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent.cli", "probe", "redfish", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_probe_prints_what_the_agent_exports_and_says_why_it_cannot(cooling_unit, tmp_path):
    promtool = require_binary("promtool")
    out = _probe("--target", cooling_unit["url"], "--ca-file", str(cooling_unit["ca"]), "--kind", "cdu",
                 "--name", "cdu-a")
    assert out.returncode == 0, out.stderr
    assert 'supernode_coolant_connector_flow_cubic_meters_per_second{bmc="cdu-a",connector="1",equipment="CDUs/1",' \
           'loop="primary"} 0.0007' in out.stdout
    assert 'supernode_leak_detector_state{bmc="cdu-a",chassis="CDU",detector="Moisture",type="Moisture"} 0.0' \
        in out.stdout
    check = subprocess.run([promtool, "check", "metrics"], input=out.stdout, capture_output=True, text=True)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check
    untrusted = _probe("--target", cooling_unit["url"])
    assert untrusted.returncode != 0 and "tls:" in untrusted.stderr and "--ca-file" in untrusted.stderr
    plain = _probe("--target", cooling_unit["url"].replace("https", "http"))
    assert plain.returncode != 0 and "https://" in plain.stderr
    # An HTTPS server that is not a Redfish service (a JSON root without RedfishVersion).
    other = tmp_path / "not-redfish"
    other.mkdir()
    (other / "index.json").write_text(json.dumps({"hello": "world"}))
    with sushy_static(other, tmp_path) as peer:
        wrong = _probe("--target", peer["url"], "--ca-file", str(peer["ca"]))
    assert wrong.returncode != 0 and "not a Redfish service" in wrong.stderr, wrong.stderr


def test_steady_state_reads_only_what_the_walk_found_and_walks_again_on_schedule(cooling_unit):
    """After the walk, a poll is one GET per found resource (never the root, never a collection); the tree is
    walked again once `rediscover_s` has passed on the source's clock."""
    now = [1000.0]

    async def run():
        client = RedfishClient(cooling_unit["url"], ca_file=cooling_unit["ca"])
        src = RedfishSource("svc", client, kind="cdu", events="off", rediscover_s=600.0, clock=lambda: now[0])
        try:
            await src.poll()
            walk = client.stats.requests
            per_poll = []
            for _ in range(3):
                before = client.stats.requests
                await src.poll()
                per_poll.append(client.stats.requests - before)
            now[0] += 601
            before = client.stats.requests
            await src.poll()
            return walk, per_poll, client.stats.requests - before, len(src.tree.resources), dict(src.discoveries)
        finally:
            await src.close()

    walk, per_poll, after_schedule, resources, walks = asyncio.run(run())
    assert resources == 7  # 2 detectors, 2 connectors, 2 pumps, 1 filter: what the mockup links
    assert per_poll == [resources] * 3 and walk > resources
    # The periodic walk costs what the first poll did: the same walk, then the same reads.
    assert walks == {"first": 1, "periodic": 1} and after_schedule == walk
