"""A CDU over SNMP against snmpsim (the real peer) serving crafted recordings of PowerNet-MIB's InRow RC objects
(tests/fixtures/recordings/crafted/README.md): every point decoded into the Modbus CDU's families, the quality
rules (noSuchObject, out of range, a state outside the MIB's enumeration), the leak subset, v2c and v3."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from exporters.cooling.snmp_cdu import SnmpCduSource
from exporters.model import Quality, SourceError
from exporters.power.pdu import PduSource
from exporters.snmp.client import SnmpCredentials
from tests.helpers import REPO
from tests.snmpsim_peer import V3_AUTH, V3_PRIV, V3_USER, recordings, run_snmpsim

ZONES = {1: "zone-a"}


@pytest.fixture(scope="module")
def snmpsim(tmp_path_factory):
    yield from run_snmpsim(tmp_path_factory.mktemp("snmpsim"), recordings(), "apc-inrow-rc")


def poll(port: int, creds: SnmpCredentials, subset: str = "all", channels=ZONES, polls: int = 1):
    async def run():
        s = SnmpCduSource("leak" if subset == "leak" else "cdu", "cdu1", "apc-inrow-rc", ("127.0.0.1", port), creds,
                          timeout=1.0, retries=1, channels=channels, subset=subset)
        try:
            before = s.leak_sensors()
            results = [await s.poll() for _ in range(polls)]
            return results[-1], s.requests, before, s.leak_sensors()
        finally:
            await s.close()
    return asyncio.run(run())


def by_series(result) -> dict[tuple, object]:
    return {(r.name, tuple(sorted((k, v) for k, v in r.labels.items() if k != "cdu"))): r for r in result.readings}


def ok_value(readings: dict, name: str, **labels: str) -> float:
    r = readings[(name, tuple(sorted(labels.items())))]
    assert r.quality is Quality.OK, r
    return r.value


def test_every_point_decodes_into_the_modbus_cdu_families(snmpsim):
    result, requests, _, _ = poll(snmpsim, SnmpCredentials(community="apc-inrow-rc"))
    v = by_series(result)
    # PowerNet-MIB airIRRCUnitStatus: FluidFlowMetric 215 hundredths of L/s, Entering/Leaving 180/275 tenths of degC,
    # FluidValvePosition 63 %, RackInletTempMetric 221 tenths of degC, LeakSensor no-leak(1)
    assert ok_value(v, "supernode_cdu_flow_cubic_meters_per_second", loop="secondary") == pytest.approx(2.15e-3)
    assert ok_value(v, "supernode_cdu_temperature_celsius", loop="secondary", point="supply") == pytest.approx(18.0)
    assert ok_value(v, "supernode_cdu_temperature_celsius", loop="secondary", point="return") == pytest.approx(27.5)
    assert ok_value(v, "supernode_cdu_valve_position_ratio") == pytest.approx(0.63)
    assert ok_value(v, "supernode_cdu_ambient_temperature_celsius") == pytest.approx(22.1)
    assert ok_value(v, "supernode_leak_detected", zone="zone-a", sensor="inrow-leak") == 0.0
    # the derived readings of every CDU: heat removed = flow x 1025 kg/m3 x 3900 J/(kg K) x 9.5 K
    assert ok_value(v, "supernode_cdu_heat_removed_watts") == pytest.approx(2.15e-3 * 1025 * 3900 * 9.5)
    info = next(r for r in result.readings if r.name == "supernode_cdu_info")
    assert info.labels == {"cdu": "cdu1", "vendor": "APC", "model": "ACRC600", "firmware": "6.8.2",
                           "profile": "apc-inrow-rc"}
    polled = [k for k in v if k[0] not in ("supernode_cdu_info", "supernode_cdu_heat_removed_watts")]
    assert len(polled) == 6 and all(r.ok for r in result.readings) and result.partial_errors == {}
    assert requests == 2  # one GET of the six objects, one of the identity


def test_a_wet_sensor_is_a_leak_of_its_zone(snmpsim):
    result, _, _, _ = poll(snmpsim, SnmpCredentials(community="apc-inrow-rc-leak"))
    assert ok_value(by_series(result), "supernode_leak_detected", zone="zone-a", sensor="inrow-leak") == 1.0


def test_missing_object_out_of_range_and_unknown_state_are_never_values(snmpsim):
    # crafted/apc-inrow-rc-faults.snmprec: no FluidFlowMetric object, valve 250 %, leaving fluid 32767 tenths of
    # degC, LeakSensor 3 (neither no-leak(1) nor leak(2))
    result, _, _, _ = poll(snmpsim, SnmpCredentials(community="apc-inrow-rc-faults"))
    v = by_series(result)
    q = {k: r.quality for k, r in v.items()}
    assert q[("supernode_cdu_flow_cubic_meters_per_second", (("loop", "secondary"),))] is Quality.UNSUPPORTED
    assert q[("supernode_cdu_valve_position_ratio", ())] is Quality.SENSOR_FAULT
    assert q[("supernode_cdu_temperature_celsius", (("loop", "secondary"), ("point", "return")))] is \
        Quality.SENSOR_FAULT
    assert q[("supernode_leak_detected", (("sensor", "inrow-leak"), ("zone", "zone-a")))] is Quality.SENSOR_FAULT
    assert ok_value(v, "supernode_cdu_temperature_celsius", loop="secondary", point="supply") == pytest.approx(18.0)
    # nothing derived from a reading that is not ok
    assert "supernode_cdu_heat_removed_watts" not in {n for (n, _) in v}


def test_leak_subset_reads_the_leak_object_alone_and_knows_its_sensor_before_asking(snmpsim):
    result, requests, before, after = poll(snmpsim, SnmpCredentials(community="apc-inrow-rc-leak"), subset="leak",
                                           polls=3)
    assert before == after == [("zone-a", "inrow-leak")]
    assert {r.name for r in result.readings} == {"supernode_leak_detected"}
    assert requests == 3  # one GET a poll, no identity read on the fast schedule
    # a channel the inventory does not wire reads nothing and names no sensor
    result, _, before, after = poll(snmpsim, SnmpCredentials(community="apc-inrow-rc-leak"), subset="leak",
                                    channels={2: "zone-b"})
    assert before == after == [] and not result.readings


def test_v3_authpriv_reads_the_cdu(snmpsim):
    # (a wrong key is the client's: test_snmp_recordings.py::test_v3_authpriv_and_a_wrong_key)
    good = SnmpCredentials("3", v3_user=V3_USER, auth_key=V3_AUTH, priv_key=V3_PRIV, context="apc-inrow-rc-leak")
    result, _, _, _ = poll(snmpsim, good)
    assert ok_value(by_series(result), "supernode_leak_detected", zone="zone-a", sensor="inrow-leak") == 1.0


def test_a_device_without_the_objects_and_the_wrong_kind_of_profile_are_refused(snmpsim):
    with pytest.raises(SourceError) as err:   # an APC PDU answers none of the InRow RC objects
        poll(snmpsim, SnmpCredentials(community="apc-8641"))
    assert err.value.kind == "decode" and "matched no rows" in str(err.value)
    creds = SnmpCredentials(community="apc-inrow-rc")
    with pytest.raises(SourceError, match="is a cdu profile, not a PDU's"):
        PduSource("pdu-a", "apc-inrow-rc", ("127.0.0.1", snmpsim), creds)
    with pytest.raises(SourceError, match="is a pdu profile, not a CDU's"):
        SnmpCduSource("cdu", "cdu1", "apc-rpdu2", ("127.0.0.1", snmpsim), creds)


def test_cli_probe_snmp_reads_a_cdu_profile(snmpsim):
    out = subprocess.run([sys.executable, "-m", "agent.cli", "probe", "snmp", "--profile", "apc-inrow-rc",
                          "--target", f"127.0.0.1:{snmpsim}", "--community", "apc-inrow-rc"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'supernode_cdu_temperature_celsius{cdu="probe",loop="secondary",point="supply"} 18.0' in out.stdout
    assert 'supernode_leak_detected{sensor="inrow-leak",zone="probe-ch1"} 0.0' in out.stdout
    assert 'model="ACRC600"' in out.stdout
