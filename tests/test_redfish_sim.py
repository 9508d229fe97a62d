"""The simulator's Redfish BMCs and CDU on the wire: TLS, sessions, SSE and push events, each fault kind, the model.

A plain aiohttp client (tests/redfish_rig.py) talks to the simulator as a
Redfish client would; DMTF's own tools check the same services in
test_redfish_dmtf.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import ssl
import xml.etree.ElementTree as ET
from typing import Callable

import aiohttp
import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sim.faults import FaultError
from tests.helpers import REPO, await_for, free_port
from tests.redfish_rig import LONG, SESSIONS, TRAY_DETECTORS, message_is, record, rig, sse

COLD_PLATE_0 = "Chassis_0_LeakDetector_0_ColdPlate"
MANIFOLD_1 = "Chassis_0_LeakDetector_1_Manifold"
CSDL = REPO / "tests" / "fixtures" / "redfish" / "csdl"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 240))


def _schema_properties(*files: str) -> set[str]:
    names = set()
    for f in files:
        for el in ET.parse(CSDL / f).iter():
            if el.tag.endswith("}Property") or el.tag.endswith("}NavigationProperty"):
                names.add(el.attrib["Name"])
    return names


def test_tls_is_verified_with_the_simulators_ca_and_fails_without_it(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            status, root = await r.get("/redfish/v1/")
            assert status == 200 and root["Product"].startswith("GB200")
            async with aiohttp.ClientSession() as plain:  # the system trust store only: this CA is not in it
                with pytest.raises(aiohttp.ClientConnectorCertificateError):
                    await plain.get(r.url() + "/redfish/v1/")
            pinned = ssl.create_default_context(cafile=r.sim.devices["bmc-node01"].describe()["cert_file"])
            pinned.check_hostname = False  # a pinned leaf: trusted as itself, not through the CA
            async with aiohttp.ClientSession() as pin:
                with pytest.raises(aiohttp.ClientConnectorCertificateError):  # node02's BMC has another certificate
                    await pin.get(r.url("node02") + "/redfish/v1/", ssl=pinned)
    run(main())


def test_the_service_root_is_open_and_everything_else_asks_for_credentials(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            for path in ("/redfish", "/redfish/v1", "/redfish/v1/", "/redfish/v1/odata", "/redfish/v1/$metadata"):
                async with r.http.get(r.url() + path) as resp:
                    assert resp.status == 200, path
            async with r.http.get(r.url() + "/redfish/v1/odata") as resp:
                names = {v["name"] for v in (await resp.json())["value"]}
            assert {"Service", "Chassis", "Systems", "SessionService", "EventService"} <= names
            async with r.http.get(r.url() + "/redfish/v1/$metadata") as resp:
                meta = await resp.text()
            assert 'Namespace="LeakDetector.v1_6_0"' in meta and 'Extends="ServiceRoot.v1_20_0.ServiceContainer"' in meta
            async with r.http.get(r.url() + "/redfish/v1/Chassis") as resp:
                assert resp.status == 401
                assert resp.headers["WWW-Authenticate"].startswith("Basic")
                assert (await resp.json())["error"]["code"].endswith("NoValidSession")
            bad = {"Authorization": aiohttp.encode_basic_auth(r.rf["username"], "wrong")}
            async with r.http.get(r.url() + "/redfish/v1/Chassis", headers=bad) as resp:
                assert resp.status == 401
            status, chassis = await r.get("/redfish/v1/Chassis")
            assert status == 200 and chassis["Members"] == [{"@odata.id": "/redfish/v1/Chassis/Chassis_0"}]
            status, err = await r.get("/redfish/v1/Chassis/Nope")
            assert status == 404 and err["error"]["code"].endswith("ResourceNotFound")
    run(main())


def test_session_login_token_and_logout(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            async with r.http.post(r.url() + SESSIONS, json={"UserName": r.rf["username"], "Password": "nope"}) as resp:
                assert resp.status == 401 and "X-Auth-Token" not in resp.headers
            token, location = await r.login()
            assert location.startswith(SESSIONS + "/")
            status, session = await r.get(location, token=token)
            assert status == 200 and session["UserName"] == r.rf["username"] and session["@odata.id"] == location
            status, sessions = await r.get(SESSIONS, token=token)
            assert {"@odata.id": location} in sessions["Members"] and sessions["Members@odata.count"] == 1
            async with r.http.delete(r.url() + location, headers={"X-Auth-Token": token}) as resp:
                assert resp.status == 204
            assert (await r.get("/redfish/v1/Chassis", token=token))[0] == 401
            assert (await r.get(SESSIONS))[1]["Members"] == []
    run(main())


def test_an_idle_session_expires_after_the_session_timeout(tmp_path):
    async def main():
        async with rig(tmp_path, redfish_session_timeout=1.0) as r:
            status, service = await r.get("/redfish/v1/SessionService")
            assert service["SessionTimeout"] == 1
            token, location = await r.login()
            assert (await r.get("/redfish/v1/Systems", token=token))[0] == 200

            async def expired():
                return (await r.get("/redfish/v1/Systems", token=token))[0] == 401
            # each probe that still answers 200 renews the session: wait between probes longer than the timeout
            await await_for(expired, timeout=LONG, interval=1.5, what="the idle session to expire")
            assert (await r.get(location))[0] == 404
            token2, _ = await r.login()  # expiry is not a lockout
            assert (await r.get("/redfish/v1/Systems", token=token2))[0] == 200
    run(main())


def test_a_tray_leak_reaches_the_sse_stream_at_once_and_shows_in_the_detector(tmp_path):
    event_props = _schema_properties("Event_v1.xml", "Resource_v1.xml")

    async def main():
        async with rig(tmp_path) as r:
            token, _ = await r.login()
            async with sse(r, token=token) as stream:
                r.inject("tray-leak", node="node01", detector="0")
                origin = f"{TRAY_DETECTORS}/{COLD_PLATE_0}"
                event_id, payload = await stream.next_event(message_is("Environmental.1.1.LeakDetectedCritical", origin))
            rec = record(payload)
            assert rec["MessageArgs"] == [COLD_PLATE_0] and rec["MessageSeverity"] == "Critical"
            assert rec["EventId"] == str(event_id) == payload["Id"]
            unknown = {k for k in list(payload) + list(rec) if not k.startswith("@")} - event_props
            assert not unknown, f"Event properties not in DMTF's Event schema: {unknown}"
            status, det = await r.get(origin, token=token)
            assert det["DetectorState"] == "Critical" and det["Status"]["Health"] == "Critical"
            assert det["LeakDetectorType"] == "Moisture"
            _, group = await r.get("/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection", token=token)
            states = {d["DataSourceUri"].rsplit("/", 1)[1]: d["DetectorState"]
                      for d in group["LeakDetectorGroups"][0]["Detectors"]}
            assert states[COLD_PLATE_0] == "Critical" and list(states.values()).count("OK") == 3
            assert group["Status"]["Health"] == "Critical"
            _, other = await r.get(f"{TRAY_DETECTORS}/{COLD_PLATE_0}", service="node02")
            assert other["DetectorState"] == "OK"  # node02's tray is dry
            assert r.sim.state()["nodes"]["node01"]["tray_leaks"] == {COLD_PLATE_0: "critical"}
    run(main())


def test_a_warning_level_leak_and_its_return_to_normal(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            async with sse(r, service="node02") as stream:
                r.inject("tray-leak", node="node02", detector=MANIFOLD_1, level="warning")
                origin = f"{TRAY_DETECTORS}/{MANIFOLD_1}"
                await stream.next_event(message_is("Environmental.1.1.LeakDetectedWarning", origin))
                assert (await r.get(origin, service="node02"))[1]["DetectorState"] == "Warning"
                r.sim.clear()
                await stream.next_event(message_is("Environmental.1.1.LeakDetectedNormal", origin))
            assert (await r.get(origin, service="node02"))[1]["DetectorState"] == "OK"
    run(main())


def test_a_broken_detector_is_a_sensor_fault_never_a_leak(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            async with sse(r) as stream:
                r.inject("tray-leak-sensor-fault", node="node01", detector="3")
                origin = f"{TRAY_DETECTORS}/{MANIFOLD_1}"
                _, payload = await stream.next_event(message_is("ResourceEvent.1.3.ResourceErrorsDetected", origin))
            assert not any(record(p)["MessageId"].startswith("Environmental.1.1.LeakDetected") for _, p in stream.seen)
            _, det = await r.get(origin)
            assert det["DetectorState"] is None  # unknown while the sensor is broken (null here, absent in excerpts)
            _, group = await r.get("/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection")
            assert "DetectorState" not in group["LeakDetectorGroups"][0]["Detectors"][3]
            assert group["LeakDetectorGroups"][0]["Detectors"][0]["DetectorState"] == "OK"
            assert det["Status"]["State"] == "Enabled" and det["Status"]["Health"] == "Warning"
            (cond,) = det["Status"]["Conditions"]
            assert cond["MessageId"] == "ResourceEvent.1.3.ResourceErrorsDetected"
            assert cond["OriginOfCondition"]["@odata.id"] == origin
    run(main())


def test_fault_parameters_name_what_is_wrong(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            with pytest.raises(FaultError, match="detector: 7 out of range 0..3"):
                r.inject("tray-leak", node="node01", detector="7")
            with pytest.raises(FaultError, match="LeakDetector_9_ColdPlate. is not one of"):
                r.inject("tray-leak", node="node01", detector="Chassis_0_LeakDetector_9_ColdPlate")
            with pytest.raises(FaultError, match="node: 'node09' is neither"):
                r.inject("bmc-offline", node="node09")
            with pytest.raises(FaultError, match="level: expected critical or warning"):
                r.inject("tray-leak", level="soggy")
            assert r.sim.state()["nodes"]["node01"]["tray_leaks"] == {}
    run(main())


def test_force_off_powers_the_tray_down_in_the_rack_model_and_is_recorded(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            reset = r.url() + "/redfish/v1/Systems/System_0/Actions/ComputerSystem.Reset"
            token, _ = await r.login()
            auth = {"X-Auth-Token": token}
            async with r.http.post(reset, json={"ResetType": "Sideways"}, headers=auth) as resp:
                assert resp.status == 400 and "ResetType" in (await resp.json())["error"]["message"]
            async with r.http.post(reset, json={}, headers=auth) as resp:
                assert resp.status == 400
            assert r.sim.state()["nodes"]["node01"]["power_actions"] == []
            async with sse(r, token=token) as stream:
                async with r.http.post(reset, json={"ResetType": "ForceOff"}, headers=auth) as resp:
                    assert resp.status == 204
                await stream.next_event(message_is("ResourceEvent.1.3.ResourcePoweredOff", "/redfish/v1/Systems/System_0"))
            nodes = r.sim.state()["nodes"]
            assert nodes["node01"]["host_power"] == "Off"
            assert [a["reset_type"] for a in nodes["node01"]["power_actions"]] == ["ForceOff"]
            await await_for(lambda: all(g["power_w"] == 0 for g in r.sim.state()["nodes"]["node01"]["gpus"]),
                            timeout=LONG, what="node01's GPUs to stop drawing power")
            assert all(g["power_w"] > 0 for g in r.sim.state()["nodes"]["node02"]["gpus"])
            _, system = await r.get("/redfish/v1/Systems/System_0", token=token)
            assert system["PowerState"] == "Off"
            _, env = await r.get("/redfish/v1/Chassis/Chassis_0/EnvironmentMetrics", token=token)
            assert env["PowerWatts"]["Reading"] == r.sim.model.nodes["node01"].standby_w
            async with r.http.post(reset, json={"ResetType": "On"}, headers=auth) as resp:
                assert resp.status == 204
            await await_for(lambda: all(g["power_w"] > 0 for g in r.sim.state()["nodes"]["node01"]["gpus"]),
                            timeout=LONG, what="node01's GPUs to draw power again")
            assert [a["power_state"] for a in r.sim.state()["nodes"]["node01"]["power_actions"]] == ["Off", "On"]
    run(main())


def test_bmc_offline_closes_open_connections_then_refuses_then_comes_back(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            url = r.url()
            async with sse(r) as stream:
                assert (await r.get("/redfish/v1/Chassis"))[0] == 200  # a pooled keep-alive connection now exists
                r.inject("bmc-offline", node="node01")
                assert await stream.ended()
            with pytest.raises(aiohttp.ClientError):  # the pooled connection is closed under the client
                await r.get("/redfish/v1/Chassis")

            trust = ssl.create_default_context(cafile=r.rf["ca_file"])

            async def refused():
                try:
                    async with aiohttp.ClientSession() as fresh:  # a new connection, not the closed pooled one
                        await fresh.get(url + "/redfish/v1/", ssl=trust)
                except aiohttp.ClientConnectorError:
                    return True
                except aiohttp.ClientError:
                    return False
                return False
            await await_for(refused, timeout=LONG, interval=0.1, what="the offline BMC to refuse connections")
            assert (await r.get("/redfish/v1/Chassis", service="node02"))[0] == 200  # only node01's BMC is down
            assert r.sim.state()["devices"]["bmc-node01"]["faults"]["offline"] is True
            r.sim.clear()

            async def back():
                try:
                    return (await r.get("/redfish/v1/Chassis"))[0] == 200
                except aiohttp.ClientError:
                    return False
            await await_for(back, timeout=LONG, interval=0.1, what="the BMC to answer again at the same URL")
            assert r.url() == url
    run(main())


def test_bmc_slow_answers_late_but_answers(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            r.inject("bmc-slow", node="node01", ms=5000)
            assert r.sim.state()["devices"]["bmc-node01"]["faults"]["slow_ms"] == 5000
            with pytest.raises(asyncio.TimeoutError):  # the BMC holds every answer at least 5 s
                async with r.http.get(r.url() + "/redfish/v1/", timeout=aiohttp.ClientTimeout(total=1.0)):
                    pass
            async with r.http.get(r.url() + "/redfish/v1/", timeout=aiohttp.ClientTimeout(total=LONG + 10)) as resp:
                assert resp.status == 200  # late, not lost
            r.sim.clear()
            assert r.sim.state()["devices"]["bmc-node01"]["faults"]["slow_ms"] == 0
    run(main())


def test_bmc_auth_fail_refuses_login_tokens_and_basic_with_401(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            token, _ = await r.login()
            r.inject("bmc-auth-fail", node="node01")
            async with r.http.post(r.url() + SESSIONS, json={"UserName": r.rf["username"], "Password": r.password}) as resp:
                assert resp.status == 401
            assert (await r.get("/redfish/v1/Chassis", token=token))[0] == 401
            assert (await r.get("/redfish/v1/Chassis"))[0] == 401
            assert (await r.get("/redfish/v1/"))[0] == 200  # the service root stays open
            assert (await r.get("/redfish/v1/Chassis", service="node02"))[0] == 200
            r.sim.clear()
            assert (await r.get("/redfish/v1/Chassis", token=token))[0] == 200  # the session outlived the refusal
            await r.login()
    run(main())


def test_sessions_expire_fault_drops_tokens_and_their_streams_but_login_works(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            token, _ = await r.login()
            async with sse(r, token=token) as stream:
                assert "dropped 1 session" in r.inject("bmc-sessions-expire", node="node01")
                assert await stream.ended()
            assert (await r.get("/redfish/v1/Chassis", token=token))[0] == 401
            token2, _ = await r.login()
            assert (await r.get("/redfish/v1/Chassis", token=token2))[0] == 200
    run(main())


def test_logout_ends_the_sessions_sse_stream(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            token, location = await r.login()
            async with sse(r, token=token) as stream:
                async with r.http.delete(r.url() + location, headers={"X-Auth-Token": token}) as resp:
                    assert resp.status == 204
                assert await stream.ended()
    run(main())


def test_sse_filter_and_last_event_id_replay(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            crit = "Environmental.1.1.LeakDetectedCritical"
            async with sse(r, query=f"?$filter=MessageId eq '{crit}'") as only_critical, sse(r) as everything:
                r.inject("tray-leak-sensor-fault", node="node01", detector="1")
                r.inject("tray-leak", node="node01", detector="2")
                first_id, _ = await everything.next_event(message_is("ResourceEvent.1.3.ResourceErrorsDetected"))
                await everything.next_event(message_is(crit))
                _, payload = await only_critical.next_event()
                assert record(payload)["MessageId"] == crit  # the sensor fault before it was filtered out
            async with sse(r, last_event_id=first_id) as replay:  # a client reconnecting gets what it missed
                event_id, payload = await replay.next_event()
            assert event_id > first_id and record(payload)["MessageId"] == crit
            async with r.http.get(r.url() + "/redfish/v1/EventService/SSE?$filter=Severity gt 'OK'",
                                  headers=r.basic()) as resp:
                assert resp.status == 400 and "$filter" in (await resp.json())["error"]["message"]
            _, service = await r.get("/redfish/v1/EventService")
            assert service["ServerSentEventUri"] == "/redfish/v1/EventService/SSE"
    run(main())


def test_push_subscription_posts_leak_events_with_the_subscribers_headers(tmp_path):
    async def main():
        got: list[tuple[dict, dict]] = []
        arrived = asyncio.Event()

        async def receive(request: web.Request) -> web.Response:
            got.append((dict(request.headers), await request.json()))
            arrived.set()
            return web.Response(status=204)
        app = web.Application()
        app.router.add_post("/events", receive)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        dest = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/events"
        try:
            async with rig(tmp_path) as r:
                subs = r.url() + "/redfish/v1/EventService/Subscriptions"
                async with r.http.post(subs, headers=r.basic(),
                                       json={"Destination": "http://10.0.0.9/events", "Protocol": "Redfish"}) as resp:
                    assert resp.status == 400 and "Destination" in (await resp.json())["error"]["message"]
                async with r.http.post(subs, headers=r.basic(), json={
                        "Destination": dest, "Protocol": "Redfish", "Context": "agent-node01",
                        "RegistryPrefixes": ["Environmental"], "HttpHeaders": [{"Authorization": "Bearer sekrit"}]}) as resp:
                    assert resp.status == 201
                    location = resp.headers["Location"]
                _, sub = await r.get(location)
                assert sub["Destination"] == dest and sub["HttpHeaders"] == []  # the secret is never read back
                r.inject("tray-leak-sensor-fault", node="node01", detector="1")  # ResourceEvent: not subscribed
                r.inject("tray-leak", node="node01", detector="0")
                await asyncio.wait_for(arrived.wait(), LONG)
                headers, payload = got[0]
                assert headers["Authorization"] == "Bearer sekrit"
                assert payload["Context"] == "agent-node01"
                assert record(payload)["MessageId"] == "Environmental.1.1.LeakDetectedCritical"
                assert all(record(p)["MessageId"].startswith("Environmental.") for _, p in got)
                async with r.http.patch(r.url() + location, headers=r.basic(),  # a new token for the next POSTs
                                        json={"HttpHeaders": [{"Authorization": "Bearer rotated"}]}) as resp:
                    assert resp.status == 200 and (await resp.json())["HttpHeaders"] == []
                async with r.http.patch(r.url() + location, headers=r.basic(), json={"Destination": dest}) as resp:
                    assert resp.status == 400  # where events go is fixed at creation
                arrived.clear()
                r.inject("tray-leak", node="node01", detector="1")
                await asyncio.wait_for(arrived.wait(), LONG)
                assert got[-1][0]["Authorization"] == "Bearer rotated"
                async with r.http.delete(r.url() + location, headers=r.basic()) as resp:
                    assert resp.status == 204
                assert (await r.get(location))[0] == 404
        finally:
            await runner.cleanup()
    run(main())


def test_the_redfish_cdu_shows_the_rack_models_loop_and_its_faults(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            secondary = "/redfish/v1/ThermalEquipment/CDUs/1/SecondaryCoolantConnectors/1"
            c = r.sim.model.coolant
            _, conn = await r.get(secondary, service="rfcdu1")
            assert conn["FlowLitersPerMinute"]["Reading"] == pytest.approx(c.flow_lpm, abs=0.01)
            assert conn["SupplyTemperatureCelsius"]["Reading"] == pytest.approx(c.secondary_supply_c, abs=0.01)
            assert conn["HeatRemovedkW"]["Reading"] == pytest.approx(r.sim.model.heat_w() / 1000, abs=0.05)
            before = conn["FlowLitersPerMinute"]["Reading"]
            async with sse(r, service="rfcdu1") as stream:
                r.inject("pump-fail", pump=2)
                await stream.next_event(message_is("Environmental.1.1.PumpFailed", "/redfish/v1/ThermalEquipment/CDUs/1/Pumps/2"))
                r.inject("tray-leak", node="rfcdu1", detector="Moisture")
                await stream.next_event(message_is("Environmental.1.1.LeakDetectedCritical",
                                                   "/redfish/v1/Chassis/CDU/LeakDetectors/Moisture"))
            _, pump = await r.get("/redfish/v1/ThermalEquipment/CDUs/1/Pumps/2", service="rfcdu1")
            assert pump["Status"]["Health"] == "Critical" and pump["PumpSpeedPercent"]["Reading"] == 0
            _, cdu = await r.get("/redfish/v1/ThermalEquipment/CDUs/1", service="rfcdu1")
            assert cdu["Status"]["Health"] == "Critical"
            assert [cond["MessageId"] for cond in cdu["Status"]["Conditions"]] == ["Environmental.1.1.PumpFailed"]
            for path in ("/redfish/v1/Chassis/CDU/LeakDetectors/Moisture",
                         "/redfish/v1/ThermalEquipment/CDUs/1/LeakDetection/LeakDetectors/Moisture"):
                assert (await r.get(path, service="rfcdu1"))[1]["DetectorState"] == "Critical"
            _, conn = await r.get(secondary, service="rfcdu1")
            assert conn["FlowLitersPerMinute"]["Reading"] == pytest.approx(c.flow_lpm, abs=0.01)
            assert conn["FlowLitersPerMinute"]["Reading"] < before
            _, sensor = await r.get("/redfish/v1/Chassis/CDU/Sensors/SecondaryFlow", service="rfcdu1")
            assert sensor["Reading"] == conn["FlowLitersPerMinute"]["Reading"]
            set_mode = r.url("rfcdu1") + "/redfish/v1/ThermalEquipment/CDUs/1/Pumps/2/Actions/Pump.SetMode"
            async with r.http.post(set_mode, json={"Mode": "Enabled"}, headers=r.basic()) as resp:
                assert resp.status == 204
            assert c.pump_running == [True, True]
    run(main())


def test_the_state_api_tells_a_client_where_each_service_is(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            state = r.sim.state()
            assert set(state["redfish"]["bmcs"]) == {"node01", "node02"}
            for name in ("bmc-node01", "bmc-node02", "rfcdu1"):
                dev = state["devices"][name]
                assert dev["url"].startswith("https://127.0.0.1:") and dev["service_root"] == dev["url"] + "/redfish/v1/"
                assert dev["ca_file"] == state["redfish"]["ca_file"]
            assert (tmp_path / "redfish" / "password").stat().st_mode & 0o077 == 0
    run(main())


def test_patch_changes_writable_properties_whole_or_not_at_all(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            uri = "/redfish/v1/Managers/CDU/NetworkProtocol"
            url = r.url("rfcdu1") + uri
            async with r.http.get(url, headers=r.basic()) as resp:
                assert "PATCH" in resp.headers["Allow"]
                before = await resp.json()
            async with r.http.get(r.url("rfcdu1") + "/redfish/v1/Chassis/CDU", headers=r.basic()) as resp:
                assert "PATCH" not in resp.headers["Allow"]
            async with r.http.patch(r.url("rfcdu1") + "/redfish/v1/Chassis/CDU", json={"AssetTag": "x"},
                                    headers=r.basic()) as resp:
                assert resp.status == 405
            async with r.http.patch(url, json={"SSDP": {"ProtocolEnabled": False}, "HTTPS": {"Port": 8443}},
                                    headers=r.basic()) as resp:
                assert resp.status == 400 and "HTTPS" in (await resp.json())["error"]["message"]
            async with r.http.patch(url, json={"SSDP": {"NotifyTTL": "five"}}, headers=r.basic()) as resp:
                assert resp.status == 400 and (await resp.json())["error"]["code"].endswith("PropertyValueTypeError")
            assert (await r.get(uri, service="rfcdu1"))[1] == before  # refused bodies changed nothing
            async with r.http.patch(url, json={"SSDP": {"ProtocolEnabled": False, "NotifyTTL": 2}},
                                    headers=r.basic()) as resp:
                assert resp.status == 200
                after = await resp.json()
            assert after["SSDP"] == dict(before["SSDP"], ProtocolEnabled=False, NotifyTTL=2)  # merged, not replaced
            assert (await r.get(uri, service="rfcdu1"))[1]["SSDP"]["NotifyTTL"] == 2
    run(main())


def test_the_managers_event_log_holds_the_events_until_clear_log(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            log = "/redfish/v1/Managers/BMC_0/LogServices/Log"
            r.inject("tray-leak", node="node01", detector="0")
            r.inject("tray-leak-sensor-fault", node="node01", detector="1")

            async def entries():
                return (await r.get(log + "/Entries"))[1]["Members"]
            found = await await_for(entries, timeout=LONG, what="log entries")
            ids = [e["MessageId"] for e in found]
            assert ids == ["Environmental.1.1.LeakDetectedCritical", "ResourceEvent.1.3.ResourceErrorsDetected"]
            assert found[0]["Links"]["OriginOfCondition"]["@odata.id"] == f"{TRAY_DETECTORS}/{COLD_PLATE_0}"
            status, entry = await r.get(found[0]["@odata.id"])
            assert status == 200 and entry["Severity"] == "Critical" and entry["EntryType"] == "Event"
            async with r.http.post(r.url() + log + "/Actions/LogService.ClearLog", json={}, headers=r.basic()) as resp:
                assert resp.status == 204
            assert await entries() == []
    run(main())


def test_manager_reset_ends_every_session_and_stream(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            token, _ = await r.login()
            async with sse(r, token=token) as stream:
                async with r.http.post(r.url() + "/redfish/v1/Managers/BMC_0/Actions/Manager.Reset",
                                       json={"ResetType": "GracefulRestart"}, headers=r.basic()) as resp:
                    assert resp.status == 204
                assert await stream.ended()
            assert (await r.get("/redfish/v1/Chassis", token=token))[0] == 401
            assert r.sim.state()["nodes"]["node01"]["host_power"] == "On"  # the BMC restarted, not the tray
    run(main())


def _site_ca() -> tuple[str, Callable[[str], str]]:
    """A CA of the test's own (an operator's site CA): its PEM, and a function signing a CSR for 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "site CA for the test")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True).sign(key, hashes.SHA256()))

    def sign(csr_pem: str) -> str:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
        leaf = (x509.CertificateBuilder().subject_name(csr.subject).issuer_name(name).public_key(csr.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
                .sign(key, hashes.SHA256()))
        return leaf.public_bytes(serialization.Encoding.PEM).decode()
    return cert.public_bytes(serialization.Encoding.PEM).decode(), sign


async def _served_fingerprint(port: int) -> str:
    """SHA-256 of the certificate a TLS handshake with the port presents right now."""
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    return x509.load_pem_x509_certificate(pem.encode()).fingerprint(hashes.SHA256()).hex(":").upper()


def test_the_https_certificate_is_shown_and_rotates_through_generate_csr_and_replace_certificate(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            dev = r.sim.state()["devices"]["bmc-node01"]
            port = int(dev["endpoint"].rsplit(":", 1)[1])
            _, cert = await r.get(dev["certificate_uri"])
            assert cert["Fingerprint"] == await _served_fingerprint(port)  # what a client pins is what TLS presents
            _, locations = await r.get("/redfish/v1/CertificateService/CertificateLocations")
            assert locations["Links"]["Certificates"] == [{"@odata.id": dev["certificate_uri"]}]
            service = r.url() + "/redfish/v1/CertificateService/Actions/CertificateService."
            collection = {"@odata.id": dev["certificate_uri"].rsplit("/", 1)[0]}
            async with r.http.post(service + "GenerateCSR", headers=r.basic(),
                                   json={"CertificateCollection": collection}) as resp:
                assert resp.status == 400 and "CommonName" in (await resp.json())["error"]["message"]
            async with r.http.post(service + "GenerateCSR", headers=r.basic(), json={
                    "CertificateCollection": collection, "CommonName": "node01-bmc", "Organization": "test site",
                    "AlternativeNames": ["127.0.0.1"]}) as resp:
                assert resp.status == 200
                csr_pem = (await resp.json())["CSRString"]
            csr = x509.load_pem_x509_csr(csr_pem.encode())
            assert csr.is_signature_valid and csr.subject.rfc4514_string() == "O=test site,CN=node01-bmc"
            site_ca, sign = _site_ca()
            other = x509.CertificateSigningRequestBuilder().subject_name(csr.subject).sign(
                ec.generate_private_key(ec.SECP256R1()), hashes.SHA256())
            bad = sign(other.public_bytes(serialization.Encoding.PEM).decode())  # for a key the BMC never made
            replace = {"CertificateUri": {"@odata.id": dev["certificate_uri"]}, "CertificateType": "PEM"}
            async with r.http.post(service + "ReplaceCertificate", headers=r.basic(),
                                   json=dict(replace, CertificateString=bad)) as resp:
                assert resp.status == 400 and "key" in (await resp.json())["error"]["message"]
            async with r.http.post(service + "ReplaceCertificate", headers=r.basic(),
                                   json=dict(replace, CertificateString=sign(csr_pem))) as resp:
                assert resp.status == 204
            (tmp_path / "site-ca.crt").write_text(site_ca)
            site = ssl.create_default_context(cafile=str(tmp_path / "site-ca.crt"))
            async with aiohttp.ClientSession() as fresh:  # new handshakes present the site-signed certificate
                async with fresh.get(r.url() + "/redfish/v1/", ssl=site) as resp:
                    assert resp.status == 200
                with pytest.raises(aiohttp.ClientConnectorCertificateError):  # the simulator's CA no longer vouches
                    await fresh.get(r.url() + "/redfish/v1/", ssl=ssl.create_default_context(cafile=r.rf["ca_file"]))
            async with aiohttp.ClientSession() as fresh:
                async with fresh.get(r.url() + dev["certificate_uri"], ssl=site, headers=r.basic()) as resp:
                    rotated = await resp.json()
            assert rotated["Fingerprint"] == await _served_fingerprint(port) != cert["Fingerprint"]
            assert rotated["Issuer"]["CommonName"] == "site CA for the test"
    run(main())


def test_a_subscription_whose_deliveries_keep_failing_is_terminated_after_the_retries(tmp_path):
    async def main():
        async with rig(tmp_path) as r:
            subs = r.url() + "/redfish/v1/EventService/Subscriptions"
            dead = f"http://127.0.0.1:{free_port()}/events"  # nobody listens there
            async with r.http.post(subs, headers=r.basic(), json={"Destination": dead}) as resp:
                terminating = resp.headers["Location"]
                assert (await resp.json())["DeliveryRetryPolicy"] == "TerminateAfterRetries"
            async with r.http.post(subs, headers=r.basic(),
                                   json={"Destination": dead, "DeliveryRetryPolicy": "RetryForever"}) as resp:
                forever = resp.headers["Location"]
            async with r.http.post(subs, headers=r.basic(),
                                   json={"Destination": dead, "DeliveryRetryPolicy": "SuspendRetries"}) as resp:
                assert resp.status == 400 and "DeliveryRetryPolicy" in (await resp.json())["error"]["message"]
            r.inject("tray-leak", node="node01", detector="0")

            async def gone():
                return (await r.get(terminating))[0] == 404
            await await_for(gone, timeout=LONG, interval=0.2, what="the failing subscription to be terminated")
            assert (await r.get(forever))[0] == 200
    run(main())
