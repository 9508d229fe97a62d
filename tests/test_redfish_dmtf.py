"""DMTF's own tools against the simulator's Redfish services: the Service and Interop Validators, the Tacklebox client.

The rack runs with its faults on (a tray leak, a broken tray detector, a failed
CDU pump, a CDU leak and a broken CDU sensor, a push subscription on each
service), so the validator checks the shapes a client meets on a bad day as
well as the nominal ones. The validator runs once per service (it takes a few
seconds each, more under load): the tray BMC with session login, the CDU with
Basic. Its schemas are DMTF's 2025.4 CSDL set in tests/fixtures/redfish/csdl,
used offline (`--skipschema`). It must report zero FAIL; WARNs are deprecation
notes (EventTypes, and the tray's LeakDetectors under ThermalSubsystem, where a
GB200 tray's BMC serves them). The Interop Validator checks the CDU against
OCP's CDU profile (with OCP's liquid-cooling and service baselines it requires)
and the tray BMC against OCP's service baseline, also with zero FAIL. DMTF's
tools verify no TLS certificate (their `redfish` library's default); the
simulator's own tests do.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import pytest

from tests.helpers import ALLOW_MISSING_PEERS, REPO, wait_for
from tests.redfish_rig import LONG, TRAY_DETECTORS
from sim.harness import SimRack

CSDL = REPO / "tests" / "fixtures" / "redfish" / "csdl"
PROFILES = REPO / "tests" / "fixtures" / "redfish" / "ocp-profiles"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.peer


def tool(name: str) -> list[str]:
    """A DMTF script installed with the test extra (the validator's console script, Tacklebox's .py scripts)."""
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            if ALLOW_MISSING_PEERS:
                pytest.skip(f"{name} not installed (SUPERNODE_TEST_ALLOW_MISSING_PEERS=1)")
            pytest.fail(f"DMTF tool {name!r} is not installed (pip install -e '.[test]')")
        path = Path(found)
    return [sys.executable, str(path)] if name.endswith(".py") else [str(path)]


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    rack = SimRack(tmp_path_factory.mktemp("rf-dmtf"), nodes=2, gpus=2).start()
    rack.inject("tray-leak", node="node01", detector="0")
    rack.inject("tray-leak-sensor-fault", node="node01", detector="3")
    rack.inject("pump-fail", pump=2)
    rack.inject("tray-leak", node="rfcdu1", detector="Moisture")
    rack.inject("tray-leak-sensor-fault", node="rfcdu1", detector="Overflow")

    async def subscribe():
        for name in ("bmc-node01", "rfcdu1"):  # a destination nobody listens on: deliveries fail, the resource stays
            rack.sim.devices[name].events.subscribe("http://127.0.0.1:9/events", "dmtf-test", {}, [], ["Environmental"],
                                                    retry_policy="RetryForever")
    rack.call(subscribe())
    rf = rack.sim.state()["redfish"]
    rack.rf = rf
    rack.password = Path(rf["password_file"]).read_text().strip()
    try:
        yield rack
    finally:
        rack.stop()


def _side_by_side(runs: dict[str, Callable[[], "Validation"]]) -> dict[str, "Validation"]:
    """The validator runs of one fixture at once, one per core (each is its own process, and the services
    are separate): the module takes the time of its slower run, not of both."""
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        futures = {name: pool.submit(run) for name, run in runs.items()}
        return {name: f.result() for name, f in futures.items()}


@dataclass
class Validation:
    rc: int
    stdout: str
    fails: list[str]
    summary: dict[str, int]
    validated: list[str]


def _validate(rack: SimRack, url: str, authtype: str, logdir: Path) -> Validation:
    argv = tool("rf_service_validator") + ["-r", url, "-u", rack.rf["username"], "-p", rack.password,
                                           "--authtype", authtype, "--schema_directory", str(CSDL), "--skipschema",
                                           "--logdir", str(logdir)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    logs = list(logdir.rglob("RedfishServiceValidatorDebug_*.log"))
    assert logs, f"the validator wrote no debug log; it said:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    fails, uri = [], "?"
    for line in logs[0].read_text().splitlines():  # each FAIL (or CRITICAL: a resource it could not read), by URI
        if " - Validating " in line:
            uri = line.split(" - Validating ", 1)[1].rstrip(".")
        for mark in (" - FAIL - ", " - CRITICAL - "):
            if mark in line:
                fails.append(f"{uri}: {line.split(mark, 1)[1]}")
    m = re.search(r"\|\s*PASS\s*\|\s*WARN\s*\|\s*FAIL\s*\|\s*NOT TESTED\s*\|\n[+-]+\n\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|"
                  r"\s*(\d+)\s*\|", proc.stdout)
    assert m, f"no summary table in the validator's output:\n{proc.stdout[-3000:]}"
    summary = dict(zip(("PASS", "WARN", "FAIL", "NOT TESTED"), map(int, m.groups())))
    validated = re.findall(r"^Validating (\S+)\.\.\.$", proc.stdout, re.M)
    return Validation(proc.returncode, proc.stdout, fails, summary, validated)


@pytest.fixture(scope="module")
def validations(rack, tmp_path_factory) -> dict[str, Validation]:
    """One validator run per service for the whole module: the tray BMC by session, the CDU by Basic."""
    return _side_by_side({
        "bmc": lambda: _validate(rack, rack.rf["bmcs"]["node01"], "Session", tmp_path_factory.mktemp("val-bmc")),
        "cdu": lambda: _validate(rack, rack.rf["cdus"]["rfcdu1"], "Basic", tmp_path_factory.mktemp("val-cdu"))})


def _assert_clean(v: Validation, must_cover: list[str]) -> None:
    assert not v.fails, "DMTF's service validator FAILed:\n" + "\n".join(v.fails)
    assert v.summary["FAIL"] == 0 and v.rc == 0, v.stdout[-3000:]
    assert v.summary["PASS"] > 300, v.summary  # it really walked the service
    missing = [u for u in must_cover if u not in v.validated]
    assert not missing, f"the validator never reached {missing}"


def test_dmtf_service_validator_passes_the_tray_bmc_with_session_login(validations):
    v = validations["bmc"]
    _assert_clean(v, [f"{TRAY_DETECTORS}/Chassis_0_LeakDetector_0_ColdPlate",
                      f"{TRAY_DETECTORS}/Chassis_0_LeakDetector_1_Manifold",
                      "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection",
                      "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/CoolantConnectors/TrayInlet",
                      "/redfish/v1/Systems/System_0", "/redfish/v1/Systems/System_0/ResetActionInfo",
                      "/redfish/v1/EventService", "/redfish/v1/EventService/Subscriptions/1"])
    assert any(u.startswith("/redfish/v1/SessionService/Sessions/") for u in v.validated)  # its own session


def test_dmtf_service_validator_passes_the_redfish_cdu_with_basic_auth(validations):
    _assert_clean(validations["cdu"], [
        "/redfish/v1/ThermalEquipment/CDUs/1", "/redfish/v1/ThermalEquipment/CDUs/1/Pumps/2",
        "/redfish/v1/ThermalEquipment/CDUs/1/SecondaryCoolantConnectors/1",
        "/redfish/v1/ThermalEquipment/CDUs/1/LeakDetection", "/redfish/v1/Chassis/CDU/LeakDetectors/Moisture",
        "/redfish/v1/Chassis/CDU/LeakDetectors/Overflow", "/redfish/v1/Chassis/CDU/Sensors/SecondaryHeatLoad",
        "/redfish/v1/EventService/Subscriptions/1"])


def _interop(rack: SimRack, url: str, profile: str, logdir: Path) -> Validation:
    argv = tool("rf_interop_validator") + ["-r", url, "-u", rack.rf["username"], "-p", rack.password,
                                           "--authtype", "Session", "--logdir", str(logdir), str(PROFILES / profile)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    reports = list(logdir.rglob("RedfishInteropValidatorReport_*.html"))
    assert reports, f"the interop validator wrote no report; it said:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    fails = []  # the report's FAIL rows: resource or property, and why (some, such as a missing resource, are only there)
    for row in re.findall(r"<tr[^>]*>(.*?)</tr>", reports[0].read_text(), re.S):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if "FAIL" in cells:
            fails.append(" | ".join(c for c in cells if c))
    m = re.search(r"\|\s*PASS\s*\|\s*WARN\s*\|\s*FAIL\s*\|\s*NOT TESTED\s*\|\n[+-]+\n\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|"
                  r"\s*(\d+)\s*\|", proc.stdout)
    assert m, f"no summary table in the interop validator's output:\n{proc.stdout[-3000:]}"
    summary = dict(zip(("PASS", "WARN", "FAIL", "NOT TESTED"), map(int, m.groups())))
    return Validation(proc.returncode, proc.stdout, fails, summary, re.findall(r"^Validating (\S+)\.\.\.$", proc.stdout, re.M))


@pytest.fixture(scope="module")
def interop(rack, tmp_path_factory) -> dict[str, Validation]:
    """One interop run per service: the CDU against OCP's CDU profile (which requires OCP's liquid-cooling and
    service baselines), the tray BMC against OCP's service baseline (OCP publishes no compute-tray profile)."""
    return _side_by_side({
        "cdu": lambda: _interop(rack, rack.rf["cdus"]["rfcdu1"], "OCPCoolantDistributionUnit.v1_0_0.json",
                                tmp_path_factory.mktemp("iop-cdu")),
        "bmc": lambda: _interop(rack, rack.rf["bmcs"]["node01"], "OCPServiceBaseline.v1_0_0.json",
                                tmp_path_factory.mktemp("iop-bmc"))})


def test_dmtf_interop_validator_passes_the_cdu_against_ocps_cdu_profile(interop):
    v = interop["cdu"]
    assert not v.fails, "DMTF's interop validator FAILed the CDU against OCP's profiles:\n" + "\n".join(v.fails)
    assert v.summary["FAIL"] == 0 and v.rc == 0 and v.summary["PASS"] > 200, v.summary
    assert "/redfish/v1/ThermalEquipment/CDUs/1/SecondaryCoolantConnectors/1" in v.validated


def test_dmtf_interop_validator_passes_the_tray_bmc_against_ocps_service_baseline(interop):
    v = interop["bmc"]
    assert not v.fails, "DMTF's interop validator FAILed the tray BMC against OCP's service baseline:\n" + "\n".join(v.fails)
    assert v.summary["FAIL"] == 0 and v.rc == 0 and v.summary["PASS"] > 100, v.summary
    assert "/redfish/v1/CertificateService" in v.validated


def _tacklebox(rack: SimRack, script: str, url: str, *args: str) -> str:
    proc = subprocess.run(tool(script) + ["-u", rack.rf["username"], "-p", rack.password, "-r", url, *args],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{script} {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row of `text` whose first cell is `first`."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


def test_tacklebox_reads_the_cdus_leak_detectors_through_a_session_login(rack):
    out = _tacklebox(rack, "rf_thermal_equipment.py", rack.rf["cdus"]["rfcdu1"], "leakdetectors", "--type", "CDU")
    assert _row(out, "Moisture")[-1] == "Critical"  # the injected CDU leak
    assert _row(out, "Overflow")[-1] == "N/A"  # the broken float switch: its state unknown, not OK
    assert "Detectors in the CDU: Critical" in out


def test_tacklebox_reads_the_coolant_loop_and_the_failed_pump_the_rack_model_has(rack):
    url = rack.rf["cdus"]["rfcdu1"]
    out = _tacklebox(rack, "rf_thermal_equipment.py", url, "secondaryinfo", "--type", "CDU")
    flow = float(re.search(r"^\s*Flow: ([\d.]+) L/min", out, re.M).group(1))
    supply = float(re.search(r"^\s*SupplyTemperature: ([\d.]+) C", out, re.M).group(1))
    c = rack.sim.model.coolant
    assert flow == pytest.approx(c.flow_lpm, abs=0.01) and supply == pytest.approx(c.secondary_supply_c, abs=0.01)
    out = _tacklebox(rack, "rf_thermal_equipment.py", url, "pumpinfo", "--type", "CDU", "--pump", "2")
    assert "State: UnavailableOffline, Health: Critical" in out and "PumpSpeed: 0.0 %" in out


def test_tacklebox_reads_a_tray_leak_detector_through_a_session_login(rack):
    out = _tacklebox(rack, "rf_raw_request.py", rack.rf["bmcs"]["node01"],
                     "--request", f"{TRAY_DETECTORS}/Chassis_0_LeakDetector_0_ColdPlate")
    body = json.loads(out[out.index("{"):])
    assert body["DetectorState"] == "Critical" and body["LeakDetectorType"] == "Moisture"


def test_tacklebox_power_reset_force_off_powers_the_tray_down(rack):
    assert rack.sim.state()["nodes"]["node02"]["power_actions"] == []
    _tacklebox(rack, "rf_power_reset.py", rack.rf["bmcs"]["node02"], "-t", "ForceOff")
    node = rack.sim.state()["nodes"]["node02"]
    assert node["host_power"] == "Off" and [a["reset_type"] for a in node["power_actions"]] == ["ForceOff"]
    wait_for(lambda: all(g["power_w"] == 0 for g in rack.sim.state()["nodes"]["node02"]["gpus"]), timeout=LONG,
             what="node02's GPUs to stop drawing power")


def test_tacklebox_subscribes_and_the_tray_pushes_a_leak_event_to_it(rack):
    got: list[tuple[dict, dict]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            got.append((dict(self.headers), json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dest = f"http://127.0.0.1:{server.server_address[1]}/events"
        url = rack.rf["bmcs"]["node02"]
        _tacklebox(rack, "rf_event_service.py", url, "subscribe", "--destination", dest, "--context", "tacklebox",
                   "--registries", "Environmental", "--httpheaders", "Authorization:Bearer tb-token")
        info = _tacklebox(rack, "rf_event_service.py", url, "info")
        assert dest in info
        rack.inject("tray-leak", node="node02", detector="2")
        wait_for(lambda: got, timeout=LONG, what="the leak event pushed to the Tacklebox subscription")
        headers, payload = got[0]
        assert headers["Authorization"] == "Bearer tb-token" and payload["Context"] == "tacklebox"
        (rec,) = payload["Events"]
        assert rec["MessageId"] == "Environmental.1.1.LeakDetectedCritical"
        assert rec["OriginOfCondition"]["@odata.id"] == f"{TRAY_DETECTORS}/Chassis_0_LeakDetector_1_ColdPlate"
    finally:
        server.shutdown()
