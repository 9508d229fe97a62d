"""SNMP profile format: every shipped profile loads; bad profiles are refused naming the field; decoding rules."""

from __future__ import annotations

import copy

import pytest
import yaml

from exporters.model import Quality, SourceError
from exporters.power.snmp_autodetect import choose
from exporters.snmp.decode import CounterTracker, decode
from exporters.snmp.profile import PROFILE_DIR, ProfileError, available_profiles, load_profile, parse_profile

SHIPPED = {"raritan-pdu2", "apc-rpdu2", "servertech-sentry4", "vertiv-geist-v5", "entity-sensor", "apc-inrow-rc"}


def test_shipped_profiles_load_and_note_sources():
    assert SHIPPED <= set(available_profiles())
    for name in SHIPPED:
        p = load_profile(name)
        assert p.profile == name and p.sources and p.metrics
        assert all(o.startswith("1.3.6.1.") for _, _, o in p.walked_columns())


def _raritan() -> dict:
    return yaml.safe_load((PROFILE_DIR / "raritan-pdu2.yaml").read_text())


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["metrics"][0].update(metric="supernode_pdu_inlet_power"), "unknown metric"),
    (lambda d: d["metrics"][2].pop("counter_bits"), "counter_bits: required"),
    (lambda d: d["tables"]["inlet"]["columns"]["value"].update(oid="1.3.6.x"), "numeric OID"),
    (lambda d: d["metrics"][0].update(labels={"outlet": "{inlet}"}), "labels: need exactly ['inlet']"),
    (lambda d: d["metrics"][0].update(labels={"inlet": "{nope}"}), "not index parts"),
    (lambda d: d["metrics"][0].update(column="missing"), "has no column 'missing'"),
    (lambda d: d["metrics"][0].update(where={"phase": 1}), "is not an index part"),
    (lambda d: d.update(colour="red"), "colour: unknown field"),
    (lambda d: d["metrics"][0].update(row_scale={}), "either decimal_digits"),
])
def test_bad_profile_is_refused_naming_the_field(mutate, needle):
    data = copy.deepcopy(_raritan())
    mutate(data)
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "raritan-pdu2.yaml")
    assert needle in str(err.value) and "raritan-pdu2.yaml" in str(err.value)


def _inrow() -> dict:
    return yaml.safe_load((PROFILE_DIR / "apc-inrow-rc.yaml").read_text())


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["metrics"][5].pop("channel"), "channel: required for a family labelled by zone"),
    (lambda d: d["metrics"][0].update(channel="1"), "channel: only for a family labelled by zone"),
    (lambda d: d["metrics"][0].update(metric="supernode_pdu_inlet_power_watts"), "unknown metric"),
    (lambda d: d["metrics"][0].update(metric="supernode_cdu_heat_removed_watts"), "unknown metric"),  # derived
    (lambda d: d["metrics"][0].update(labels={"loop": "secondary", "cdu": "x"}), "labels: need exactly ['loop']"),
    (lambda d: d["tables"]["unit"].update(index=["row"]), "a scalar table has no index"),
    (lambda d: d["metrics"][0].update(range=[10, 0]), "range: low 10.0 is above high 0.0"),
    (lambda d: d.update(outlet_control={"table": "unit", "state_column": "leak", "command_oid": "1.3.6.1.1",
                                        "index": "{outlet}", "power_on": {"command": 1, "state": 1},
                                        "power_off": {"command": 2, "state": 2}}), "only a PDU switches outlets"),
])
def test_bad_cdu_profile_is_refused_naming_the_field(mutate, needle):
    data = copy.deepcopy(_inrow())
    mutate(data)
    with pytest.raises(ProfileError) as err:
        parse_profile(data, "apc-inrow-rc.yaml")
    assert needle in str(err.value)


def test_cdu_profiles_are_listed_apart_and_auto_never_picks_one():
    assert available_profiles(kind="cdu") == ["apc-inrow-rc"]
    assert "apc-inrow-rc" not in available_profiles(kind="pdu")
    with pytest.raises(SourceError):  # an APC InRow RC's sysObjectID (networkAir) is no PDU
        choose("1.3.6.1.4.1.318.1.3.14.15", "APC Web/SNMP Management Card (MN:ACRC600)")


def test_cdu_decode_rules_fault_value_range_and_missing_object():
    profile = load_profile("apc-inrow-rc")
    unit = {c: o.oid for c, o in profile.tables["unit"].columns.items()}
    columns = {unit["flow"]: {(): None}, unit["entering"]: {(): 180}, unit["leaving"]: {(): 1001},
               unit["valve"]: {(): -1}, unit["rack_inlet"]: {(): "22.1"}, unit["leak"]: {(): 2}}
    out = {(r.name, r.labels.get("point", r.labels.get("zone", ""))): r
           for r in decode(profile, columns, "cdu1", CounterTracker(), zone_of={"1": "zone-a"}.get)}
    assert out[("supernode_cdu_flow_cubic_meters_per_second", "")].quality is Quality.UNSUPPORTED  # noSuchObject
    assert out[("supernode_cdu_temperature_celsius", "supply")].value == pytest.approx(18.0)
    assert out[("supernode_cdu_temperature_celsius", "return")].quality is Quality.SENSOR_FAULT   # above 1000
    assert out[("supernode_cdu_valve_position_ratio", "")].quality is Quality.SENSOR_FAULT        # below 0
    assert out[("supernode_cdu_ambient_temperature_celsius", "")].quality is Quality.SENSOR_FAULT  # not a number
    leak = out[("supernode_leak_detected", "zone-a")]
    assert (leak.value, leak.quality, leak.labels) == (1.0, Quality.OK, {"zone": "zone-a", "sensor": "inrow-leak"})
    # a channel the inventory leaves out is not wired: no reading at all
    assert not [r for r in decode(profile, columns, "cdu1", CounterTracker(), zone_of={"2": "zone-b"}.get)
                if r.name == "supernode_leak_detected"]


def test_profile_name_must_match_file(tmp_path):
    (tmp_path / "other.yaml").write_text((PROFILE_DIR / "raritan-pdu2.yaml").read_text())
    with pytest.raises(ProfileError, match="differs from the file name"):
        load_profile(tmp_path / "other.yaml")
    with pytest.raises(ProfileError, match="known profiles"):
        load_profile("no-such-profile")


INLET = "1.3.6.1.4.1.13742.6.5.2.3.1.4"
DIGITS = "1.3.6.1.4.1.13742.6.3.3.4.1.7"


def test_decimal_digits_scale_per_row_and_energy_to_joules():
    p = load_profile("raritan-pdu2")
    cols = {INLET: {(1, 1, 5): 1665, (1, 1, 6): 1751, (1, 1, 8): 74057676},
            DIGITS: {(1, 1, 5): 1, (1, 1, 6): 0, (1, 1, 8): 0}}
    got = {r.name: r for r in decode(p, cols, "pdu-a", CounterTracker())}
    assert got["supernode_pdu_inlet_power_watts"].value == pytest.approx(166.5)
    assert got["supernode_pdu_inlet_apparent_power_volt_amperes"].value == 1751
    assert got["supernode_pdu_inlet_energy_joules_total"].value == 74057676 * 3600
    assert dict(got["supernode_pdu_inlet_power_watts"].labels) == {"pdu": "pdu-a", "inlet": "1"}


def test_missing_digits_is_a_sensor_fault_not_a_guess():
    p = load_profile("raritan-pdu2")
    r = decode(p, {INLET: {(1, 1, 5): 1665}}, "pdu-a", CounterTracker())
    assert [x.quality for x in r] == [Quality.SENSOR_FAULT]


def test_entity_sensor_scale_and_precision():
    p = load_profile("entity-sensor")
    base = "1.3.6.1.2.1.99.1.1.1."
    cols = {base + "1": {(7,): 6, (8,): 5, (9,): 8}, base + "2": {(7,): 10, (8,): 8, (9,): 9},
            base + "3": {(7,): 1, (8,): 0, (9,): 0}, base + "4": {(7,): 15, (8,): 2500, (9,): 30},
            base + "5": {(7,): 1, (8,): 1, (9,): 1}}
    got = {(r.name, r.labels["outlet"]): r.value for r in decode(p, cols, "x", CounterTracker())}
    assert got == {("supernode_pdu_outlet_power_watts", "7"): pytest.approx(1500.0),
                   ("supernode_pdu_outlet_current_amperes", "8"): pytest.approx(2.5)}


def test_unsupported_and_unknown_enum_values_are_flagged():
    p = load_profile("apc-rpdu2")
    apc = "1.3.6.1.4.1.318.1.1.26."
    cols = {apc + "4.3.1.5": {(1,): -1}, apc + "4.3.1.2": {(1,): 1},
            apc + "9.2.3.1.5": {(1,): 2, (2,): 9}, apc + "9.2.3.1.2": {(1,): 1, (2,): 1},
            apc + "9.2.3.1.4": {(1,): 1, (2,): 2}}
    got = {(r.name, r.labels.get("outlet", "")): r for r in decode(p, cols, "x", CounterTracker())}
    assert got[("supernode_pdu_inlet_power_watts", "")].quality is Quality.UNSUPPORTED
    assert got[("supernode_pdu_outlet_on", "1.1")].value == 1.0 and got[("supernode_pdu_outlet_on", "1.1")].ok
    assert got[("supernode_pdu_outlet_on", "1.2")].quality is Quality.SENSOR_FAULT


def test_apc_row_indexes_label_by_module_and_number_so_linked_pdus_never_collide():
    # rPDU2OutletMeteredStatusTable of a host PDU (module 1) and a linked one (module 2), 2 outlets each; the
    # linked PDU's rows come after the host's (rows 3, 4) but its outlets are numbered 1, 2 again
    p = load_profile("apc-rpdu2")
    t = "1.3.6.1.4.1.318.1.1.26.9.4.3.1."
    rows = {(1,): (1, 1, 100), (2,): (1, 2, 200), (3,): (2, 1, 300), (4,): (2, 2, 400)}
    cols = {t + "2": {r: v[0] for r, v in rows.items()}, t + "4": {r: v[1] for r, v in rows.items()},
            t + "7": {r: v[2] for r, v in rows.items()}, t + "6": {(5,): 10}}   # row 5: no module/number
    errors: dict[str, int] = {}
    got = {r.labels["outlet"]: r.value for r in decode(p, cols, "x", CounterTracker(), errors)
           if r.name == "supernode_pdu_outlet_power_watts"}
    assert got == {"1.1": 100.0, "1.2": 200.0, "2.1": 300.0, "2.2": 400.0}
    assert errors == {"outlet_metered.labels": 1}          # an id column missing: counted, never guessed


def test_counter_wrap_and_reset_keep_the_total_growing():
    c = CounterTracker()
    key = ("e",)
    top = (1 << 32) - 10
    assert c.update(key, top, 32, 1.0) == top
    assert c.update(key, 5, 32, 1.0) == top + 15           # wrapped: +15, not -4294967281
    assert c.update(key, 7, 32, 1.0) == top + 17
    assert c.update(key, 0, 32, 1.0) == top + 17           # user reset to 0 (APC): no negative step
    assert c.update(key, 3, 32, 1.0) == top + 20
    assert (c.wraps, c.resets) == (1, 1)
    # a reset from a low value is not mistaken for a wrap
    c2 = CounterTracker()
    c2.update(key, 19516, 32, 360000.0)
    assert c2.update(key, 2, 32, 360000.0) == pytest.approx((19516 + 2) * 360000.0)


@pytest.mark.parametrize("profile,oid,index", [
    ("apc-rpdu2", "1.3.6.1.4.1.318.1.1.26.4.3.1.9", (1,)),                 # rPDU2DeviceStatusEnergy: INTEGER
    ("servertech-sentry4", "1.3.6.1.4.1.1718.4.1.3.3.1.10", (1, 1)),       # st4InputCordEnergy: Integer32
])
def test_signed_integer_energy_rolls_over_at_2_31(profile, oid, index):
    p = load_profile(profile)
    c = CounterTracker()
    top = (1 << 31) - 3
    ids = {"1.3.6.1.4.1.318.1.1.26.4.3.1.2": {index: 1}}   # APC: the module column labels the inlet
    first = next(r for r in decode(p, {oid: {index: top}, **ids}, "x", c) if r.name.endswith("energy_joules_total"))
    after = next(r for r in decode(p, {oid: {index: 4}, **ids}, "x", c) if r.name.endswith("energy_joules_total"))
    assert after.value == pytest.approx(first.value + 7 * 360000.0)   # 2^31-3 -> 4: seven tenths of kWh, not a reset
    assert (c.wraps, c.resets) == (1, 0)
    beyond = next(r for r in decode(p, {oid: {index: 1 << 31}, **ids}, "x", CounterTracker())
                  if r.name.endswith("energy_joules_total"))
    assert beyond.quality is Quality.SENSOR_FAULT                        # not a value an INTEGER can hold


@pytest.mark.parametrize("sys_object_id,sys_descr,profile,family", [
    # real walks (facts of librenms tests/snmpsim/*.snmprec) and the MIBs' own OBJECT-IDENTITY values
    ("1.3.6.1.4.1.21239.42.1.53", "", "vertiv-geist-v5", "IMD3"),          # VERTIV-V5-MIB i03, MN03EDR1 walk
    ("1.3.6.1.4.1.21239.42.1.52", "A-U32.024_PDU-B", "vertiv-geist-v5", "GU1"),  # i02, MG02E4W1 walk
    ("1.3.6.1.4.1.13742.6", "Raritan PDU, MD:PX3-5493U-K2 HW:0x10 FW:4.2.0.5-50274", "raritan-pdu2", "Raritan"),
    ("1.3.6.1.4.1.13742.6", "Server Technology PDU", "raritan-pdu2", "ServerTech PRO3X/PRO4X"),
    ("1.3.6.1.4.1.13742.6", "ServerTech PRO3X", "raritan-pdu2", "ServerTech PRO3X/PRO4X"),
    ("1.3.6.1.4.1.1718.4", "Sentry Switched PDU", "servertech-sentry4", "Sentry4-MIB"),
    (".1.3.6.1.4.1.318.1.3.4.8", "APC Web/SNMP Management Card", "apc-rpdu2", "APC"),
])
def test_auto_rules_pick_the_profile_of_each_verified_sysobjectid(sys_object_id, sys_descr, profile, family):
    chosen = choose(sys_object_id, sys_descr)
    assert chosen.profile == profile and family in chosen.reason


@pytest.mark.parametrize("sys_object_id", [
    "1.3.6.1.4.1.21239.5.2",        # the V5 pdu branch: where the tables live, not what a unit answers
    "1.3.6.1.4.1.21239.42.1.31",    # Vertiv WD-15 Watchdog: an environmental monitor, not a PDU
    "1.3.6.1.4.1.21239.42.1.530",   # a prefix matches whole arcs only
])
def test_auto_rules_refuse_what_is_not_a_known_pdu(sys_object_id):
    with pytest.raises(SourceError) as err:
        choose(sys_object_id, "")
    assert err.value.kind == "decode" and sys_object_id in str(err.value)

