"""Profiles against real PDU recordings served by snmpsim over real UDP (v2c and v3 authPriv)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from exporters.model import SourceError
from exporters.power.pdu import PduSource, probe_snmp
from exporters.snmp.client import SnmpCredentials
from exporters.snmp.decode import CounterTracker, decode
from tests.helpers import REPO
from tests.snmpsim_peer import V3_AUTH, V3_PRIV, V3_USER, recordings, run_snmpsim


@pytest.fixture(scope="module")
def snmpsim(tmp_path_factory):
    work = tmp_path_factory.mktemp("snmpsim")
    yield from run_snmpsim(work, recordings(), "apc-8641")


def poll(port: int, profile: str, creds: SnmpCredentials):
    async def run():
        s = PduSource("pdu-a", profile, ("127.0.0.1", port), creds, timeout=1.0, retries=1)
        try:
            return await s.poll(), s.requests
        finally:
            await s.close()
    return asyncio.run(run())


def values(result) -> dict[tuple, float]:
    return {(r.name, tuple(sorted((k, v) for k, v in r.labels.items() if k != "pdu"))): r.value
            for r in result.readings if r.ok}


def test_apc_ap8641_decodes_as_powernet_mib_says(snmpsim):
    result, requests = poll(snmpsim, "apc-rpdu2", SnmpCredentials(community="apc-8641"))
    v = values(result)
    # DEVICES.md worked example: Power 121 -> 1.21 kW, Energy 19516 -> 1951.6 kWh, 131 -> 1.31 kVA, phase 6.5 A 201 V 1.22 kW
    assert v[("supernode_pdu_inlet_power_watts", (("inlet", "1"),))] == pytest.approx(1210.0)
    assert v[("supernode_pdu_inlet_energy_joules_total", (("inlet", "1"),))] == pytest.approx(1951.6 * 3.6e6)
    assert v[("supernode_pdu_inlet_apparent_power_volt_amperes", (("inlet", "1"),))] == pytest.approx(1310.0)
    ph = (("inlet", "1"), ("phase", "1"))
    assert v[("supernode_pdu_phase_current_amperes", ph)] == pytest.approx(6.5)
    assert v[("supernode_pdu_phase_voltage_volts", ph)] == pytest.approx(201.0)
    assert v[("supernode_pdu_phase_power_watts", ph)] == pytest.approx(1220.0)
    # outlet = rPDU2 module.number (row indexes are not outlet ids; linked PDUs never collide)
    outlets = {lab[0][1] for (name, lab) in v if name == "supernode_pdu_outlet_power_watts"}
    assert outlets == {f"1.{i}" for i in range(1, 25)}
    assert v[("supernode_pdu_outlet_power_watts", (("outlet", "1.1"),))] == pytest.approx(163.0)
    assert v[("supernode_pdu_outlet_current_amperes", (("outlet", "1.1"),))] == pytest.approx(0.9)
    assert {v[("supernode_pdu_outlet_on", (("outlet", f"1.{i}"),))] for i in range(1, 25)} <= {0.0, 1.0}
    info = next(r for r in result.readings if r.name == "supernode_pdu_info")
    assert (info.labels["model"], info.labels["firmware"], info.labels["vendor"]) == ("AP8641", "6.7.2", "APC")
    assert requests < 20


def test_apc_ap7902b_not_supported_values_are_never_exported(snmpsim):
    result, _ = poll(snmpsim, "apc-rpdu2", SnmpCredentials(community="apc-7902b"))
    v = values(result)
    assert v[("supernode_pdu_phase_current_amperes", (("inlet", "1"), ("phase", "1")))] == pytest.approx(1.6)
    # rPDU2DeviceStatusPower is -1 (not supported, never a value): the legacy rPDUIdentDevicePowerWatts says 192 W
    assert v[("supernode_pdu_inlet_power_watts", (("inlet", "1"),))] == 192.0
    assert sum(1 for r in result.readings if r.name == "supernode_pdu_inlet_power_watts") == 1   # one series
    unsupported = {r.name for r in result.readings if r.quality.value == "unsupported"}
    assert "supernode_pdu_phase_voltage_volts" in unsupported and "supernode_pdu_inlet_power_watts" not in unsupported
    assert -1.0 not in v.values()
    assert sum(1 for (n, _) in v if n == "supernode_pdu_outlet_on") == 16


def test_raritan_pdu2_walk_decodes_with_decimal_digits(snmpsim):
    result, _ = poll(snmpsim, "raritan-pdu2", SnmpCredentials(community="raritan-pdu2"))
    v = values(result)
    i1 = (("inlet", "1"),)
    assert v[("supernode_pdu_inlet_power_watts", i1)] == pytest.approx(242.0)
    assert v[("supernode_pdu_inlet_apparent_power_volt_amperes", i1)] == pytest.approx(379.0)
    assert v[("supernode_pdu_inlet_energy_joules_total", i1)] == pytest.approx(1444088 * 3600.0)
    o1 = (("outlet", "1"),)
    assert v[("supernode_pdu_outlet_current_amperes", o1)] == pytest.approx(0.074)   # 74 with 3 digits
    assert v[("supernode_pdu_outlet_power_watts", o1)] == pytest.approx(7.0)
    assert v[("supernode_pdu_outlet_voltage_volts", o1)] == pytest.approx(233.0)     # outlet sensor 4 rmsVoltage
    assert v[("supernode_pdu_outlet_energy_joules_total", o1)] == pytest.approx(107881 * 3600.0)
    assert v[("supernode_pdu_outlet_on", o1)] == 1.0                                 # onOff state 7 = on
    assert {lab[0][1] for (n, lab) in v if n == "supernode_pdu_outlet_power_watts"} == {str(i) for i in range(1, 13)}


def test_v3_authpriv_and_a_wrong_key(snmpsim):
    good = SnmpCredentials("3", v3_user=V3_USER, auth_key=V3_AUTH, priv_key=V3_PRIV, context="apc-8641")
    result, _ = poll(snmpsim, "apc-rpdu2", good)
    assert values(result)[("supernode_pdu_inlet_power_watts", (("inlet", "1"),))] == pytest.approx(1210.0)
    bad = SnmpCredentials("3", v3_user=V3_USER, auth_key="not-the-key", priv_key=V3_PRIV, context="apc-8641")
    with pytest.raises(SourceError) as err:
        poll(snmpsim, "apc-rpdu2", bad)
    assert err.value.kind == "auth" and "authentication" in str(err.value)


def test_probe_prints_exposition_and_names_a_profile_mismatch(snmpsim):
    text = asyncio.run(probe_snmp("raritan-pdu2", "127.0.0.1", snmpsim, community="raritan-pdu2"))
    assert 'supernode_pdu_inlet_power_watts{inlet="1",pdu="probe"} 242.0' in text
    assert "supernode_rack_power_watts 242.0" in text and "# TYPE supernode_pdu_inlet_energy_joules_total counter" in text
    assert "NaN" not in text
    with pytest.raises(SourceError) as err:
        asyncio.run(probe_snmp("raritan-pdu2", "127.0.0.1", snmpsim, community="apc-8641"))
    assert err.value.kind == "decode" and "matched no rows" in str(err.value)
    with pytest.raises(SourceError) as err:   # unknown community: the agent stays silent
        asyncio.run(probe_snmp("apc-rpdu2", "127.0.0.1", snmpsim, community="nope", timeout=0.3, retries=0))
    assert err.value.kind == "timeout"


@pytest.mark.parametrize("creds", [SnmpCredentials(community="apc-8641"),
                                   SnmpCredentials("3", v3_user=V3_USER, auth_key=V3_AUTH, priv_key=V3_PRIV,
                                                   context="apc-8641")], ids=["v2c", "v3"])
def test_later_polls_walk_in_segments_and_read_the_same_rows(snmpsim, creds):
    async def run():
        s = PduSource("pdu-a", "apc-rpdu2", ("127.0.0.1", snmpsim), creds, timeout=1.0, retries=1,
                      scale_refresh=0.0)  # every poll walks the same columns: request counts compare
        try:
            first = await s.poll()
            r1 = s.requests
            second = await s.poll()
            return first, r1, second, s.requests - r1
        finally:
            await s.close()
    first, r1, second, r2 = asyncio.run(run())
    a, b = values(first), values(second)
    assert a.keys() == b.keys() and len(a) > 100
    # The recording's outlet state column is an snmpsim `numeric` variation (its value moves with time) and
    # energy counters grow: every other value must read the same in both polls.
    moving = ("supernode_pdu_outlet_on",)
    assert {k: v for k, v in a.items() if not k[0].endswith("_total") and k[0] not in moving} == \
        {k: v for k, v in b.items() if not k[0].endswith("_total") and k[0] not in moving}
    assert {k for k in a if k[0] in moving} == {k for k in b if k[0] in moving}  # same rows in both polls
    # snmpsim caps a GETBULK answer near 60 varbinds: segments cannot save requests here, and must not cost any
    assert r2 <= r1


def test_vertiv_geist_v5_phase_rows_have_one_index_component(snmpsim):
    # crafted/vertiv-geist-v5.snmprec: pduPhaseEntry INDEX { pduPhaseIndex } (one component), LibreNMS example values
    result, _ = poll(snmpsim, "vertiv-geist-v5", SnmpCredentials(community="vertiv-geist-v5"))
    v = values(result)
    assert result.partial_errors == {}
    assert v[("supernode_pdu_inlet_power_watts", (("inlet", "1"),))] == pytest.approx(4392.0)
    ph1 = (("inlet", "1"), ("phase", "1"))
    assert v[("supernode_pdu_phase_voltage_volts", ph1)] == pytest.approx(206.8)
    assert v[("supernode_pdu_phase_current_amperes", ph1)] == pytest.approx(7.25)
    assert v[("supernode_pdu_phase_power_watts", ph1)] == pytest.approx(1464.0)
    phases = {dict(lab)["phase"] for (n, lab) in v if n == "supernode_pdu_phase_voltage_volts"}
    assert phases == {"1", "2", "3"}


def test_entity_sensor_negative_precision_is_accurate_digits_not_a_shift(snmpsim):
    # crafted/entity-sensor.snmprec, RFC 3433: only a positive precision scales by 10^-p
    result, _ = poll(snmpsim, "entity-sensor", SnmpCredentials(community="entity-sensor"))
    v = values(result)
    assert v[("supernode_pdu_outlet_power_watts", (("outlet", "11"),))] == pytest.approx(1234.0)    # precision -2
    assert v[("supernode_pdu_outlet_current_amperes", (("outlet", "12"),))] == pytest.approx(2.5)   # milli, 0
    assert v[("supernode_pdu_outlet_current_amperes", (("outlet", "13"),))] == pytest.approx(7.5)   # precision 1
    assert v[("supernode_pdu_outlet_power_watts", (("outlet", "14"),))] == pytest.approx(2000.0)    # kilo, -8


def test_raritan_pdu2_inlet_current_voltage_power_factor_and_thresholds(snmpsim):
    # the real walk: inlet sensor 1 = 1626 (3 digits), 4 = 233 (0), 7 = 64 (2); thresholds 12800 / 10400 (3 digits)
    result, _ = poll(snmpsim, "raritan-pdu2", SnmpCredentials(community="raritan-pdu2"))
    v = values(result)
    i1 = (("inlet", "1"),)
    assert v[("supernode_pdu_inlet_current_amperes", i1)] == pytest.approx(1.626)
    assert v[("supernode_pdu_inlet_voltage_volts", i1)] == pytest.approx(233.0)
    assert v[("supernode_pdu_inlet_power_factor_ratio", i1)] == pytest.approx(0.64)
    limit = "supernode_pdu_inlet_current_limit_amperes"
    assert v[(limit, (("inlet", "1"), ("threshold", "upper_critical")))] == pytest.approx(12.8)
    assert v[(limit, (("inlet", "1"), ("threshold", "upper_warning")))] == pytest.approx(10.4)


def test_apc_outlet_control_finds_the_row_by_module_and_number(snmpsim):
    async def run():
        s = PduSource("pdu-a", "apc-rpdu2", ("127.0.0.1", snmpsim), SnmpCredentials(community="apc-7902b"),
                      timeout=1.0, retries=1)
        try:
            on = await s.outlet_on("1.16")     # module 1, outlet 16: row 16 of rPDU2OutletSwitchedStatusTable
            with pytest.raises(SourceError) as err:
                await s.outlet_on("2.1")       # no linked PDU on this unit: refused, never another PDU's outlet
            return on, err.value
        finally:
            await s.close()
    on, err = asyncio.run(run())
    assert on in (True, False)
    assert err.kind == "config" and "'2.1'" in str(err)


def test_sentry4_linked_units_cords_and_outlet_table(snmpsim):
    # crafted/servertech-sentry4.snmprec: units 1 and 2 (linked), one cord each; Sentry4-MIB UNITS clauses
    result, _ = poll(snmpsim, "servertech-sentry4", SnmpCredentials(community="servertech-sentry4"))
    v = values(result)
    assert v[("supernode_pdu_inlet_power_watts", (("inlet", "1.1"),))] == pytest.approx(2300.0)
    assert v[("supernode_pdu_inlet_power_watts", (("inlet", "2.1"),))] == pytest.approx(1150.0)
    assert v[("supernode_pdu_inlet_energy_joules_total", (("inlet", "2.1"),))] == pytest.approx(2147483000 * 360000.0)
    ph = (("inlet", "1.1"), ("phase", "1"))
    assert v[("supernode_pdu_phase_voltage_volts", ph)] == pytest.approx(230.1)
    assert v[("supernode_pdu_phase_current_amperes", ph)] == pytest.approx(10.5)
    outlets = {dict(lab)["outlet"] for (n, lab) in v if n == "supernode_pdu_outlet_power_watts"}
    assert outlets == {"1.1.1", "1.1.2", "2.1.1", "2.1.2"}                     # linked units never collide
    assert v[("supernode_pdu_outlet_current_amperes", (("outlet", "1.1.1"),))] == pytest.approx(5.2)
    assert v[("supernode_pdu_outlet_power_watts", (("outlet", "2.1.2"),))] == pytest.approx(460.0)
    assert v[("supernode_pdu_outlet_energy_joules_total", (("outlet", "1.1.2"),))] == pytest.approx(2147483000 * 3600.0)


def test_raritan_px4_single_phase_inlet_and_onoff_read_by_state(snmpsim):
    # crafted/raritan-px4.snmprec: DEVICES.md PX3 worked example values on a single-phase inlet (no pole rows);
    # onOff sensors report value 0 whatever the state (PX4): only the state (7 on, 8 off) says on or off
    result, _ = poll(snmpsim, "raritan-pdu2", SnmpCredentials(community="raritan-px4"))
    v = values(result)
    i1 = (("inlet", "1"),)
    assert v[("supernode_pdu_inlet_current_amperes", i1)] == pytest.approx(7.467)
    assert v[("supernode_pdu_inlet_voltage_volts", i1)] == pytest.approx(229.0)
    assert v[("supernode_pdu_inlet_power_factor_ratio", i1)] == pytest.approx(0.98)
    assert v[("supernode_pdu_inlet_current_limit_amperes", i1 + (("threshold", "upper_critical"),))] == 16.0
    assert not any(n.startswith("supernode_pdu_phase_") for (n, _) in v)
    assert v[("supernode_pdu_outlet_on", (("outlet", "1"),))] == 1.0
    assert v[("supernode_pdu_outlet_on", (("outlet", "2"),))] == 0.0


@pytest.mark.parametrize("community,profile,why,series", [
    ("apc-8641", "apc-rpdu2", "sysObjectID 1.3.6.1.4.1.318.1.3.4.6 is under 1.3.6.1.4.1.318.1.3.4",
     'supernode_pdu_inlet_power_watts{inlet="1",pdu="probe"} 1210.0'),
    ("apc-7902b", "apc-rpdu2", "APC/Schneider rack PDU",
     'supernode_pdu_phase_current_amperes{inlet="1",pdu="probe",phase="1"} 1.6'),
    ("raritan-px4", "raritan-pdu2", "Raritan PX2/PX3/PX4", 'supernode_pdu_inlet_power_watts{inlet="1",pdu="probe"} 1665.0'),
    ("servertech-pro4x", "raritan-pdu2", "ServerTech PRO3X/PRO4X (PDU2-MIB, shared with Raritan): sysObjectID "
     "1.3.6.1.4.1.13742.6 is under 1.3.6.1.4.1.13742.6 and sysDescr matches", 'inlet="1",pdu="probe"} 229.0'),
    ("servertech-sentry4", "servertech-sentry4", "Sentry4-MIB",
     'supernode_pdu_inlet_power_watts{inlet="2.1",pdu="probe"} 1150.0'),
    ("vertiv-geist-v5", "vertiv-geist-v5", "VERTIV-V5-MIB", 'phase="1"} 206.8'),
])
def test_probe_profile_auto_says_which_profile_and_why(snmpsim, community, profile, why, series):
    text = asyncio.run(probe_snmp("auto", "127.0.0.1", snmpsim, community=community))
    first = text.splitlines()[0]
    assert first.startswith(f"# profile auto chose {profile}: ") and why in first
    assert series in text and f'profile="{profile}"' in text


def test_profile_auto_refuses_a_device_no_rule_knows(snmpsim):
    with pytest.raises(SourceError) as err:     # net-snmp's generic Linux sysObjectID: no PDU family
        asyncio.run(probe_snmp("auto", "127.0.0.1", snmpsim, community="entity-sensor"))
    assert err.value.kind == "decode" and "1.3.6.1.4.1.8072.3.2.10" in str(err.value) and "no rule" in str(err.value)
    with pytest.raises(SourceError) as err:     # the Raritan walk has no system group at all
        asyncio.run(probe_snmp("auto", "127.0.0.1", snmpsim, community="raritan-pdu2"))
    assert err.value.kind == "decode" and "sysObjectID" in str(err.value)


def test_cli_probe_snmp_profile_auto(snmpsim):
    out = subprocess.run([sys.executable, "-m", "agent.cli", "probe", "snmp", "--profile", "auto", "--target",
                          f"127.0.0.1:{snmpsim}", "--community", "apc-8641"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# profile auto chose apc-rpdu2: APC/Schneider rack PDU (PowerNet-MIB rPDU2)")


def test_apc_bank_breakers_current_and_limits(snmpsim):
    # the real AP7902B: two banks, rPDU2BankStatusCurrent 0 and 11 (tenths of A), thresholds 16 A near / 20 A overload
    result, _ = poll(snmpsim, "apc-rpdu2", SnmpCredentials(community="apc-7902b"))
    v = values(result)
    cur, lim = "supernode_pdu_breaker_current_amperes", "supernode_pdu_breaker_current_limit_amperes"
    assert {k: x for k, x in v.items() if k[0] == cur} == {(cur, (("breaker", "1.1"),)): 0.0,
                                                           (cur, (("breaker", "1.2"),)): pytest.approx(1.1)}
    assert v[(lim, (("breaker", "1.2"), ("threshold", "upper_critical")))] == 20.0
    assert v[(lim, (("breaker", "1.2"), ("threshold", "upper_warning")))] == 16.0


def test_apc_unit_with_only_the_legacy_rpdu_group(snmpsim):
    # crafted/apc-7900b.snmprec: rPDUIdentDevicePowerWatts 460 W, rPDULoadStatusLoad phase 1 = 38 tenths of A
    text = asyncio.run(probe_snmp("auto", "127.0.0.1", snmpsim, community="apc-7900b"))
    assert text.startswith("# profile auto chose apc-rpdu2: ")
    assert 'supernode_pdu_inlet_power_watts{inlet="1",pdu="probe"} 460.0' in text
    assert 'supernode_pdu_phase_current_amperes{inlet="1",pdu="probe",phase="1"} 3.8' in text
    assert "NaN" not in text and " -1.0" not in text


def test_sentry4_lines_and_branches_are_breakers_and_outlets_have_voltage(snmpsim):
    # crafted/servertech-sentry4.snmprec, Sentry4-MIB: st4LineCurrent / st4BranchCurrent hundredth Amps, their
    # CurrentHighAlarm / HighWarning tenth Amps, CurrentCapacity Amps; st4OutletVoltage tenth Volts; -1 = no reading
    result, _ = poll(snmpsim, "servertech-sentry4", SnmpCredentials(community="servertech-sentry4"))
    v = values(result)
    cur, lim = "supernode_pdu_breaker_current_amperes", "supernode_pdu_breaker_current_limit_amperes"
    assert {dict(lab)["breaker"]: x for (n, lab), x in v.items() if n == cur} == {
        "1.1.line1": pytest.approx(10.5), "1.1.line4": pytest.approx(10.48), "2.1.line1": pytest.approx(5.25),
        "1.1.branch1": pytest.approx(5.2), "1.1.branch2": pytest.approx(4.8), "2.1.branch1": pytest.approx(5.25)}
    # unit 2's neutral answers -1: no reading, flagged unsupported and never exported as a value
    assert [r.quality.value for r in result.readings if r.name == cur and r.labels["breaker"] == "2.1.line4"] == \
        ["unsupported"]
    line = (("breaker", "1.1.line1"),)
    assert v[(lim, line + (("threshold", "rated"),))] == 32.0
    assert v[(lim, line + (("threshold", "upper_critical"),))] == pytest.approx(25.6)
    assert v[(lim, line + (("threshold", "upper_warning"),))] == pytest.approx(20.8)
    branch = (("breaker", "2.1.branch1"),)
    assert v[(lim, branch + (("threshold", "rated"),))] == 10.0
    assert v[(lim, branch + (("threshold", "upper_critical"),))] == pytest.approx(8.0)
    assert v[(lim, branch + (("threshold", "upper_warning"),))] == pytest.approx(6.4)
    volts = "supernode_pdu_outlet_voltage_volts"
    assert {dict(lab)["outlet"]: x for (n, lab), x in v.items() if n == volts} == {
        "1.1.1": pytest.approx(230.1), "1.1.2": pytest.approx(230.0), "2.1.1": pytest.approx(229.9)}
    assert -1.0 not in v.values() and -0.01 not in v.values() and -0.1 not in v.values()


def test_vertiv_geist_v5_breaker_circuits_and_metered_outlets(snmpsim):
    # crafted/vertiv-geist-v5.snmprec, VERTIV-V5-MIB: pduBreakerCurrent (.3.1.4) centiamps, one index component,
    # currents of the real MN03EDR1 walk; pduOutletMeterVoltage (.6.1.4) decivolts, Current (.6.1.8) centiamps,
    # RealPower (.6.1.12) W. The MIB has no breaker rating or threshold: no limit series is made up.
    result, _ = poll(snmpsim, "vertiv-geist-v5", SnmpCredentials(community="vertiv-geist-v5"))
    v = values(result)
    assert result.partial_errors == {}
    cur = "supernode_pdu_breaker_current_amperes"
    assert {dict(lab)["breaker"]: x for (n, lab), x in v.items() if n == cur} == {
        "1": pytest.approx(4.55), "2": pytest.approx(4.58), "3": pytest.approx(4.54),
        "4": pytest.approx(2.56), "5": pytest.approx(2.52), "6": pytest.approx(2.52)}
    assert not any(n == "supernode_pdu_breaker_current_limit_amperes" for (n, _) in v)
    o1, o2 = (("outlet", "1"),), (("outlet", "2"),)
    assert v[("supernode_pdu_outlet_voltage_volts", o1)] == pytest.approx(206.8)
    assert v[("supernode_pdu_outlet_voltage_volts", o2)] == pytest.approx(207.1)
    assert v[("supernode_pdu_outlet_current_amperes", o1)] == pytest.approx(1.31)
    assert v[("supernode_pdu_outlet_power_watts", o1)] == 262.0
    assert v[("supernode_pdu_outlet_power_watts", o2)] == 0.0


@pytest.mark.parametrize("community", ["raritan-px4", "servertech-pro4x"])
def test_pdu2_overcurrent_protectors_are_breakers(snmpsim, community):
    # crafted/raritan-px4.snmprec (and the PRO4X copy), PDU2-MIB: overCurrentProtectorSensorMeasurementsTable
    # .6.5.3.3 value (col 4) and state (col 3), index pduId.ocp.sensorType, rmsCurrent(1) scaled by the sensor's own
    # DecimalDigits (.6.3.4.4.1.7 = 3); thresholds .6.3.4.4.1.23 / .24 with the same digits
    result, _ = poll(snmpsim, "raritan-pdu2", SnmpCredentials(community=community))
    v = values(result)
    cur, lim = "supernode_pdu_breaker_current_amperes", "supernode_pdu_breaker_current_limit_amperes"
    # protector 3's sensor is unavailable(-1): its value 0 "does not apply", so no reading is exported for it,
    # and the trip(15) sensor rows are not currents
    assert {dict(lab)["breaker"]: x for (n, lab), x in v.items() if n == cur} == {
        "1": pytest.approx(4.212), "2": pytest.approx(3.255)}
    assert v[(lim, (("breaker", "1"), ("threshold", "upper_critical")))] == pytest.approx(13.0)
    assert v[(lim, (("breaker", "2"), ("threshold", "upper_warning")))] == pytest.approx(10.4)
    # the protectors share the inlet's load: 4.212 + 3.255 A = the inlet's 7.467 A
    assert v[("supernode_pdu_inlet_current_amperes", (("inlet", "1"),))] == pytest.approx(4.212 + 3.255)


def test_legacy_apc_identity_fills_what_rpdu2_does_not_support(snmpsim):
    # the real AP7902B answers -1 (not supported) for rPDU2 apparent power and power factor; PowerNet-MIB's legacy
    # rPDUIdent has them: rPDUIdentDevicePowerVA 192 VA, rPDUIdentDevicePowerFactor 1000 thousandths; its
    # rPDUIdentDeviceLinetoLineVoltage 120 V is the voltage it is configured with (AP7xxx measure current only)
    text = asyncio.run(probe_snmp("auto", "127.0.0.1", snmpsim, community="apc-7902b"))
    assert 'supernode_pdu_inlet_apparent_power_volt_amperes{inlet="1",pdu="probe"} 192.0' in text
    assert 'supernode_pdu_inlet_power_factor_ratio{inlet="1",pdu="probe"} 1.0' in text
    assert 'supernode_pdu_inlet_nominal_voltage_volts{inlet="1",pdu="probe"} 120.0' in text
    assert "supernode_pdu_inlet_voltage_volts" not in text  # a setting is never a measured voltage
    # the AP8641 measures its power factor (rPDU2 94 hundredths; the legacy 940 thousandths agrees, one series) and
    # is no AP7xxx: its line-to-line voltage answers -1, no series
    result, _ = poll(snmpsim, "apc-rpdu2", SnmpCredentials(community="apc-8641"))
    pf = [r for r in result.readings if r.name == "supernode_pdu_inlet_power_factor_ratio"]
    assert [(r.value, r.quality.value) for r in pf] == [(pytest.approx(0.94), "ok")]
    assert [r.quality.value for r in result.readings if r.name == "supernode_pdu_inlet_nominal_voltage_volts"] == \
        ["unsupported"]


def test_vertiv_real_walks_decode_inlet_lines_and_totals_through_auto(snmpsim):
    # librenms/vertiv-pdu_mn03edr1.snmprec: a delta unit, pduLineCurrent Line A/B/C 1226/1234/1231 centiamps beside
    # its line-to-line phases AB/BC/CA (712/711/708 centiamps)
    text = asyncio.run(probe_snmp("auto", "127.0.0.1", snmpsim, community="vertiv-pdu_mn03edr1"))
    assert text.startswith("# profile auto chose vertiv-geist-v5: Vertiv/Geist V5 rPDU, IMD3")
    for line, amps in (("1", "12.26"), ("2", "12.34"), ("3", "12.31")):
        assert f'supernode_pdu_breaker_current_amperes{{breaker="line{line}",pdu="probe"}} {amps}' in text
    assert 'supernode_pdu_phase_current_amperes{inlet="1",pdu="probe",phase="1"} 7.12' in text
    assert "supernode_pdu_inlet_power_watts" not in text  # the real unit answers no pduMainTable
    # librenms/vertiv-pdu_mg02e4w1.snmprec: a wye unit with a pduTotal row; its lines read 0 centiamps
    text = asyncio.run(probe_snmp("auto", "127.0.0.1", snmpsim, community="vertiv-pdu_mg02e4w1"))
    assert text.startswith("# profile auto chose vertiv-geist-v5: Vertiv/Geist V5 rPDU, GU1")
    assert 'supernode_pdu_inlet_power_watts{inlet="1",pdu="probe"} 1017.0' in text
    assert 'supernode_pdu_inlet_apparent_power_volt_amperes{inlet="1",pdu="probe"} 1067.0' in text
    assert 'supernode_pdu_inlet_power_factor_ratio{inlet="1",pdu="probe"} 0.95' in text
    assert 'supernode_pdu_breaker_current_amperes{breaker="line2",pdu="probe"} 0.0' in text
    assert 'supernode_pdu_phase_voltage_volts{inlet="1",pdu="probe",phase="3"} 236.5' in text


# Every sensor value of the MIBs' status tables that the catalogue has a family for (power, apparent power, power
# factor, energy, current, voltage, outlet state): column -> (MIB object, position of the sensor type in the row
# index or None, the sensor types a family exists for). Settings and thresholds are not sensor values; neither are
# columns no family describes (a phase's apparent power or power factor, peaks, Raritan frequency).
PDU2, APC, VERTIV = "1.3.6.1.4.1.13742.6", "1.3.6.1.4.1.318.1.1", "1.3.6.1.4.1.21239.5.2.3"
SENSOR_COLUMNS: dict[str, tuple[str, int | None, frozenset[int]]] = {
    f"{APC}.26.4.3.1.{c}": (n, None, frozenset()) for c, n in (
        (5, "rPDU2DeviceStatusPower"), (9, "rPDU2DeviceStatusEnergy"), (16, "rPDU2DeviceStatusApparentPower"),
        (17, "rPDU2DeviceStatusPowerFactor"))} | {
    f"{APC}.26.6.3.1.{c}": (n, None, frozenset()) for c, n in (
        (5, "rPDU2PhaseStatusCurrent"), (6, "rPDU2PhaseStatusVoltage"), (7, "rPDU2PhaseStatusPower"))} | {
    f"{APC}.26.8.3.1.5": ("rPDU2BankStatusCurrent", None, frozenset()),
    f"{APC}.26.9.2.3.1.5": ("rPDU2OutletSwitchedStatusState", None, frozenset())} | {
    f"{APC}.26.9.4.3.1.{c}": (n, None, frozenset()) for c, n in (
        (6, "rPDU2OutletMeteredStatusCurrent"), (7, "rPDU2OutletMeteredStatusPower"),
        (11, "rPDU2OutletMeteredStatusEnergy"))} | {
    f"{APC}.12.1.{c}": (n, None, frozenset()) for c, n in (
        (16, "rPDUIdentDevicePowerWatts"), (17, "rPDUIdentDevicePowerFactor"), (18, "rPDUIdentDevicePowerVA"))} | {
    f"{APC}.12.2.3.1.1.2": ("rPDULoadStatusLoad", None, frozenset()),
    f"{APC}.12.3.5.1.1.4": ("rPDUOutletStatusOutletState", None, frozenset()),
    # PDU2-MIB: one value column per table, the row's sensor type last in its index
    f"{PDU2}.5.2.3.1.4": ("measurementsInletSensorValue", 2, frozenset({1, 4, 5, 6, 7, 8})),
    f"{PDU2}.5.2.4.1.4": ("measurementsInletPoleSensorValue", 3, frozenset({1, 4, 5})),
    f"{PDU2}.5.4.3.1.4": ("measurementsOutletSensorValue", 2, frozenset({1, 4, 5, 8})),
    f"{PDU2}.5.4.3.1.3": ("measurementsOutletSensorState (onOff)", 2, frozenset({14})),
    f"{PDU2}.5.3.3.1.4": ("measurementsOverCurrentProtectorSensorValue", 2, frozenset({1})),
    # VERTIV-V5-MIB (and VERTIV-IMD-MIB, the same columns)
} | {f"{VERTIV}.{col}": (n, None, frozenset()) for col, n in (
    ("1.1.9", "pduTotalRealPower"), ("1.1.10", "pduTotalApparentPower"), ("1.1.11", "pduTotalPowerFactor"),
    ("2.1.4", "pduPhaseVoltage"), ("2.1.8", "pduPhaseCurrent"), ("2.1.12", "pduPhaseRealPower"),
    ("3.1.4", "pduBreakerCurrent"), ("4.1.4", "pduLineCurrent"), ("6.1.4", "pduOutletMeterVoltage"),
    ("6.1.8", "pduOutletMeterCurrent"), ("6.1.12", "pduOutletMeterRealPower"))}
# Real recordings (not crafted), by community, with the profile that reads them: auto wherever the recording has a
# sysObjectID (the Raritan walk has no system group), and how many sensor values each holds.
REAL = {"apc-8641": ("auto", 135), "apc-7902b": ("auto", 47), "raritan-pdu2": ("raritan-pdu2", 66),
        "vertiv-pdu_mn03edr1": ("auto", 18), "vertiv-pdu_mg02e4w1": ("auto", 21)}


def test_auto_decodes_every_sensor_value_of_the_real_recordings(snmpsim):
    """Each real recording's sensor values (SENSOR_COLUMNS, walked from snmpsim) against the values the chosen
    profile decoded a reading from (ok, or unsupported where the MIB's own 'not supported' value says so; a legacy
    APC value superseded by the same series from rPDU2 counts as decoded)."""
    async def count(community: str, profile: str) -> tuple[int, set]:
        s = PduSource("pdu-a", profile, ("127.0.0.1", snmpsim), SnmpCredentials(community=community), timeout=1.0)
        try:
            await s.poll()  # with auto: the device says what it is first
            walked = await s.client.walk_columns(list(SENSOR_COLUMNS))
            values = {(c, i) for c, rows in walked.items() for i in rows
                      if SENSOR_COLUMNS[c][1] is None or i[SENSOR_COLUMNS[c][1]] in SENSOR_COLUMNS[c][2]}
            columns, _ = await s.reader.read()
            trace: set = set()
            decode(s.profile, columns, "pdu-a", CounterTracker(), trace=trace)
            return len(values), {(SENSOR_COLUMNS[c][0], i) for c, i in values - trace}
        finally:
            await s.close()
    got = {community: asyncio.run(count(community, profile)) for community, (profile, _) in REAL.items()}
    assert {c: n for c, (n, _) in got.items()} == {c: n for c, (_, n) in REAL.items()}
    assert {c: sorted(missed) for c, (_, missed) in got.items() if missed} == {}
    assert sum(n for _, n in REAL.values()) == 287
