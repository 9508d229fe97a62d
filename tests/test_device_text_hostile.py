"""Issue 18: hostile `ethtool -m` text and sysfs attributes fault one value, in linear time, never the source.

The `ethtool -m` line regex backtracked for 39 s on a 5,000-space line, on
the event loop; `+inf dBm` read as a good value; a `speed` of `--1` or a
counter above 1e308 raised out of the whole links poll. Each pathological
input here is large enough that the old parser never finished within the
test's deadline (pytest-timeout); the new one is linear, so no timing is
asserted, only outcomes.
"""

from __future__ import annotations

import asyncio
import math
import shutil
from pathlib import Path

import pytest

from exporters.links.dom import (OPTIC_RX, OPTIC_TEMP, OPTIC_TX, DirReader, DomSource, module_readings, parse_module)
from exporters.links.links import LINK_CARRIER_CHANGES, LINK_ERRORS, LINK_RX_BYTES, LINK_SPEED, LINK_UP, LinkSource
from exporters.model import Quality
from exporters.links.ports import PortSpec

FIX = Path(__file__).parent / "fixtures" / "links"
SFP = (FIX / "ethtool" / "sfp-10g-lr.txt").read_text()
# Lines that made the old regexes backtrack: whitespace without a colon, and long digit runs before a unit.
HOSTILE_LINES = [" " * 20_000, "\t" * 20_000 + "x", "Module voltage :" + " " * 20_000 + "V" * 3,
                 "Laser output power : " + "1" * 20_000 + " mW / " + "9" * 20_000 + "x dBm",
                 "Laser bias current : " + "1." * 10_000 + " mA"]


def quality(readings, spec, **labels):
    return {r.quality for r in readings if r.spec is spec and all(r.labels.get(k) == v for k, v in labels.items())}


@pytest.mark.timeout(60)
def test_pathological_lines_parse_in_linear_time_and_keep_the_good_values():
    dom = parse_module(SFP + "\n".join(HOSTILE_LINES) + "\n")
    assert dom.temperature == 38.5 and dom.lanes["rx_power"] == {"1": -4.0}
    assert "Module voltage" in dom.bad_fields  # the hostile voltage line came last and is a fault, not a value


@pytest.mark.parametrize("bad,field,spec,labels", [
    ("Receiver signal average optical power     : 0.3981 mW / +inf dBm", "Receiver signal average optical power",
     OPTIC_RX, {"lane": "1"}),
    ("Laser output power                        : nan mW / nan dBm", "Laser output power", OPTIC_TX, {"lane": "1"}),
    ("Module temperature                        : " + "9" * 400 + " degrees C", "Module temperature", OPTIC_TEMP, {}),
])
def test_non_finite_values_are_faults_of_that_value_only(bad, field, spec, labels):
    lines = [line for line in SFP.splitlines() if not line.strip().startswith(field + " ")]
    dom = parse_module("\n".join(lines + [bad]) + "\n")
    assert field in dom.bad_fields
    readings = module_readings("eth0", dom)
    assert quality(readings, spec, **labels) == {Quality.SENSOR_FAULT}
    good = [r for r in readings if r.spec is not spec and r.spec in (OPTIC_RX, OPTIC_TX, OPTIC_TEMP)]
    assert good and all(r.ok and math.isfinite(r.value) for r in good)


def test_dark_lanes_stay_minus_infinity():
    dom = parse_module("Rcvr signal avg optical power(Channel 2) : 0.0000 mW / -inf dBm\n")
    assert dom.lanes["rx_power"] == {"2": -math.inf} and not dom.bad_fields


@pytest.mark.timeout(60)
def test_a_hostile_module_fails_alone_inside_the_dom_source(tmp_path: Path):
    (tmp_path / "eth0.txt").write_text(SFP)
    (tmp_path / "eth1.txt").write_text(SFP + "\n".join(HOSTILE_LINES) + "\n")
    source = DomSource([PortSpec("eth0"), PortSpec("eth1")], DirReader(tmp_path), module_timeout=30)
    result = asyncio.run(source.poll())
    assert result.partial_errors == {"decode": 1}
    assert quality(result.readings, OPTIC_RX, port="eth0") == {Quality.OK}
    assert quality(result.readings, OPTIC_RX, port="eth1") == {Quality.OK}  # its good lines still count


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIX / "sysfs", root)
    return root


@pytest.mark.parametrize("rel,text,spec,labels", [
    ("class/net/eth0/speed", "--1", LINK_SPEED, {}),
    ("class/net/eth0/statistics/rx_errors", "9" * 400, LINK_ERRORS, {"counter": "rx_errors"}),  # > 1e308
    ("class/net/eth0/statistics/rx_bytes", str(1 << 64), LINK_RX_BYTES, {}),
    ("class/net/eth0/carrier_changes", "\u0661\u0662", LINK_CARRIER_CHANGES, {}),  # Arabic-Indic "12"
    ("class/net/eth0/statistics/rx_errors", "\u00b2", LINK_ERRORS, {"counter": "rx_errors"}),  # "²".isdigit()
    ("class/net/eth0/statistics/tx_errors", "1" * 100_000, LINK_ERRORS, {"counter": "tx_errors"}),  # > a page
])
def test_a_bad_sysfs_value_faults_that_value_only(tree: Path, rel, text, spec, labels):
    (tree / rel).write_text(text + "\n")
    source = LinkSource([PortSpec("eth0"), PortSpec("eth1")], tree)
    try:
        result = asyncio.run(source.poll())
    finally:
        asyncio.run(source.close())
    assert quality(result.readings, spec, port="eth0", **labels) == {Quality.SENSOR_FAULT}
    assert result.partial_errors == {"decode": 1}
    assert quality(result.readings, LINK_UP, port="eth0") == {Quality.OK}
    assert quality(result.readings, LINK_UP, port="eth1") == {Quality.OK}
    others = [r for r in result.readings if r.labels.get("port") == "eth0" and r.spec is LINK_ERRORS
              and r.labels.get("counter") != labels.get("counter")]
    assert others and all(r.ok for r in others)


def test_an_unknown_speed_is_no_reading_not_a_fault(tree: Path):
    (tree / "class/net/eth0/speed").write_text("-1\n")
    source = LinkSource([PortSpec("eth0")], tree)
    try:
        result = asyncio.run(source.poll())
    finally:
        asyncio.run(source.close())
    assert not [r for r in result.readings if r.spec is LINK_SPEED] and result.partial_errors == {}
