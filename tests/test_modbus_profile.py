"""Modbus profile format, codec and derived readings, checked without a network."""

from __future__ import annotations

import math

import pytest

from exporters.cooling import coolant
from exporters.cooling.modbus_codec import decode, encode
from exporters.cooling.modbus_profile import ProfileError, list_profiles, load_profile, parse_profile, plan_blocks

BASE = {"name": "t", "kind": "cdu", "vendor": "v", "model": "m", "sources": ["test"]}


def _profile(points, **device):
    return parse_profile({**BASE, "device": device, "points": points}, "t.yaml")


def test_codec_orders_match_hand_encoded_bytes():
    # 123.456 as float32 is 0x42F6E979; CDAB swaps the two words, DCBA reverses every byte.
    assert encode(123.456, "f32", "ABCD") == [0x42F6, 0xE979]
    assert encode(123.456, "f32", "CDAB") == [0xE979, 0x42F6]
    assert encode(123.456, "f32", "BADC") == [0xF642, 0x79E9]
    assert encode(123.456, "f32", "DCBA") == [0x79E9, 0xF642]
    for order in ("ABCD", "CDAB", "BADC", "DCBA"):
        assert decode(encode(123.456, "f32", order), "f32", order) == pytest.approx(123.456, rel=1e-6)
        assert decode(encode(-70000, "i32", order), "i32", order) == -70000
        assert decode(encode(3_000_000_000, "u32", order), "u32", order) == 3_000_000_000
    assert decode([0xFFFF], "i16") == -1
    assert decode([0xFFFF], "u16") == 65535
    assert math.isnan(decode([0x7FC0, 0x0000], "f32"))


def test_every_shipped_profile_loads_and_names_its_sources():
    names = list_profiles()
    assert {"reference-cdu", "vertiv-liebert-dcd", "vertiv-liebert-xdp", "kenmec-lx1400", "rle-ld5000",
            "rle-ld2100", "tracetek-ttdm-128"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.sources and all(s.strip() for s in p.sources)
        assert plan_blocks(p)


def test_reference_cdu_needs_one_request_per_contiguous_block():
    p = load_profile("reference-cdu")
    blocks = plan_blocks(p)
    # input 0..15 contiguous, 2 discrete inputs, 3 holding (2 set points + firmware), 2 coils: four requests
    assert sorted((b.table, b.start, b.count) for b in blocks) == [
        ("coil", 0, 2), ("discrete", 0, 2), ("holding", 0, 3), ("input", 0, 16)]


def test_block_size_limit_splits_and_gap_joins():
    pts = [{"name": f"p{i}", "table": "input", "address": a, "type": "u16", "metric": "supernode_cdu_reservoir_level_ratio"}
           for i, a in enumerate([0, 1, 2, 3, 6])]
    pts[1:] = [{**p, "metric": None, "bits": {0: {"name": "b", "metric": "supernode_cdu_alarm_active",
                                                    "labels": {"alarm": p["name"]}}}} for p in pts[1:]]
    assert [(b.start, b.count) for b in plan_blocks(_profile(pts, max_registers=3))] == [(0, 3), (3, 1), (6, 1)]
    assert [(b.start, b.count) for b in plan_blocks(_profile(pts, max_gap=2))] == [(0, 7)]


@pytest.mark.parametrize("point, needle", [
    ({"table": "input", "address": 0, "type": "bit", "metric": "supernode_cdu_pump_running", "labels": {"pump": "1"}},
     "does not fit table"),
    ({"table": "input", "address": 0, "modicon": 30002, "metric": "supernode_cdu_reservoir_level_ratio"},
     "expected 30001"),
    ({"table": "input", "address": 0, "metric": "supernode_cdu_temperature_celsius", "labels": {"loop": "primary"}},
     "needs labels"),
    ({"table": "input", "address": 0, "metric": "supernode_cdu_flow_liters"}, "unknown metric"),
    ({"table": "input", "address": 0, "unit": "gallons", "metric": "supernode_cdu_reservoir_level_ratio"}, "unknown unit"),
    ({"table": "input", "address": 0, "metric": "supernode_cdu_reservoir_level_ratio", "control": {"min": 0, "max": 1}},
     "control points must be holding"),
    ({"table": "input", "address": 0, "metric": "supernode_cdu_reservoir_level_ratio", "scael": 2}, "unknown field"),
])
def test_bad_profiles_are_refused_naming_point_and_field(point, needle):
    with pytest.raises(ProfileError) as err:
        _profile([{"name": "bad_point", **point}])
    assert needle in str(err.value)
    assert "bad_point" in str(err.value)


def test_unknown_profile_lists_known_ones():
    with pytest.raises(ProfileError, match="reference-cdu"):
        load_profile("no-such-cdu")


def test_repeat_expands_addresses_labels_and_channels():
    p = load_profile("rle-ld2100")
    zones = [q for q in p.expanded() if q.name.startswith("zone_")]
    assert len(zones) == 16
    z5 = p.point("zone_5_status")
    assert (z5.address, z5.channel, z5.labels["sensor"]) == (11 + 3 * 2, 5, "zone-5")


def test_sentinels_match_signed_and_nan():
    p = load_profile("reference-cdu").point("secondary_supply_temp")
    assert p.is_sentinel(32767) and p.is_sentinel(-32768) and not p.is_sentinel(2500)
    f = load_profile("vertiv-liebert-dcd").point("cool_water_supply_temp")
    assert f.is_sentinel(float("nan")) and not f.is_sentinel(13.0)


def test_derived_coolant_formulas():
    # 300 L/min, 10 K rise, PG25 1025 kg/m3 x 3900 J/kgK: 0.005 * 1025 * 3900 * 10 = 199,875 W
    assert coolant.heat_removed_w(0.005, 25.0, 35.0) == pytest.approx(199_875.0)
    water = coolant.CoolantProperties(998.0, 4182.0, "water")
    assert coolant.heat_removed_w(0.001, 20.0, 30.0, water) == pytest.approx(41_736.36)
    # Magnus: 25 C / 60 % RH has a dew point of about 16.7 C; 100 % RH gives the air temperature.
    assert coolant.dew_point_c(25.0, 0.60) == pytest.approx(16.7, abs=0.1)
    assert coolant.dew_point_c(18.0, 1.0) == pytest.approx(18.0, abs=1e-9)
    with pytest.raises(ValueError):
        coolant.dew_point_c(25.0, 0.0)
    assert coolant.dew_point_margin_c(25.0, 16.7) == pytest.approx(8.3)
    assert coolant.approach_c(25.0, 18.0) == pytest.approx(7.0)
    # 1.5 L/min per kW for a 100 kW rack: 150 L/min -> 2.5e-8 m^3/s per W
    assert coolant.flow_per_power(150 / 60000, 100_000) == pytest.approx(2.5e-8)
    assert coolant.flow_per_power(0.005, 0) is None
