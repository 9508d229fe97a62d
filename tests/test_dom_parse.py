"""DOM parsing of `ethtool -m` text: the real QSFP+ capture and our SFP/QSFP28/CMIS fixtures."""

from __future__ import annotations

import math
from pathlib import Path

from exporters.links.dom import OPTIC_ALARM, OPTIC_DOM, OPTIC_RX, OPTIC_THRESHOLD_DBM, module_readings, parse_module
from exporters.render import render_readings
from tests.helpers import recording

FIX = Path(__file__).parent / "fixtures" / "links" / "ethtool"


def _fix(name: str) -> str:
    return (FIX / name).read_text()


def _values(readings, spec):
    return {tuple(sorted((k, v) for k, v in r.labels.items() if k != "port")): r.value
            for r in readings if r.spec is spec}


def test_real_qsfp_plus_dark_lanes_are_minus_inf():
    dom = parse_module(recording("ethtool/qsfp-plus-40g-sr4.txt").read_text())
    assert dom.has_dom and not dom.bad_fields
    assert dom.info["identifier"].startswith("0x0d") and dom.info["vendor"] == "AVAGO"
    assert dom.temperature == 42.17 and dom.voltage == 3.2917
    assert dom.lanes["rx_power"]["1"] == -1.15 and dom.lanes["tx_power"]["1"] == -1.48
    assert dom.lanes["tx_bias"]["1"] == 0.006662
    for lane in ("2", "3", "4"):
        assert dom.lanes["rx_power"][lane] == -math.inf
        assert dom.lanes["tx_power"][lane] == -math.inf
    assert len(dom.flags) == 4 * 4 * 3 + 8 and not any(f.on for f in dom.flags)
    assert dom.thresholds[("rx_power", "low", "warning")] == -9.50
    assert dom.thresholds[("rx_power", "low", "alarm")] == -13.51
    # The module leaves its tx power thresholds unset (0 mW / -inf dBm): they are not thresholds.
    assert not any(q == "tx_power" for q, _, _ in dom.thresholds)
    text = render_readings(module_readings("eth4", dom)).decode()
    assert 'supernode_optic_rx_power_dbm{lane="2",port="eth4"} -Inf' in text
    assert 'supernode_optic_rx_power_dbm{lane="1",port="eth4"} -1.15' in text
    assert 'supernode_optic_threshold_dbm{kind="rx_low_warning",port="eth4"} -9.5' in text
    assert 'supernode_optic_temperature_celsius{port="eth4"} 42.17' in text


def test_sfp_single_lane():
    dom = parse_module(_fix("sfp-10g-lr.txt"))
    assert dom.has_dom and not dom.bad_fields
    assert dom.lanes["rx_power"] == {"1": -4.0}
    assert dom.lanes["tx_power"] == {"1": -3.0}
    assert math.isclose(dom.lanes["tx_bias"]["1"], 0.035212)
    assert dom.temperature == 38.5 and dom.voltage == 3.312
    assert {f.lane for f in dom.flags} == {""} and len(dom.flags) == 20
    assert dom.thresholds[("tx_power", "low", "alarm")] == -11.0
    assert dom.thresholds[("temperature", "high", "alarm")] == 78.0
    readings = module_readings("eth0", dom)
    kinds = _values(readings, OPTIC_THRESHOLD_DBM)
    assert kinds[(("kind", "tx_low_alarm"),)] == -11.0 and kinds[(("kind", "rx_low_warning"),)] == -12.0


def test_qsfp28_alarms_and_warnings_raised():
    dom = parse_module(_fix("qsfp28-100g-sr4-alarms.txt"))
    raised = {(f.alarm, f.lane) for f in dom.flags if f.on}
    assert raised == {("rx_power_low_alarm", "3"), ("rx_power_low_warning", "3"), ("temperature_high_warning", "")}
    assert dom.lanes["rx_power"]["3"] == -15.2
    alarms = _values(module_readings("eth2", dom), OPTIC_ALARM)
    assert alarms[(("alarm", "rx_power_low_alarm"), ("lane", "3"))] == 1.0
    assert alarms[(("alarm", "rx_power_low_alarm"), ("lane", "2"))] == 0.0
    assert alarms[(("alarm", "temperature_high_warning"), ("lane", ""))] == 1.0


def test_osfp_cmis_eight_lanes():
    dom = parse_module(_fix("osfp-400g-cmis.txt"))
    assert not dom.bad_fields
    assert sorted(dom.lanes["rx_power"], key=int) == [str(i) for i in range(1, 9)]
    assert dom.lanes["rx_power"]["7"] == -10.0 and dom.lanes["rx_power"]["1"] == -1.5
    assert math.isclose(dom.lanes["tx_bias"]["8"], 0.00845)
    assert dom.temperature == 52.31
    assert [(f.alarm, f.lane) for f in dom.flags if f.on] == [("rx_power_low_warning", "7")]
    assert len(dom.flags) == 8 + 8 * 4 * 3
    rx = _values(module_readings("mlx5_0/1", dom), OPTIC_RX)
    assert len(rx) == 8 and rx[(("lane", "7"),)] == -10.0


def test_modules_without_dom():
    for name in ("sfp-dac-no-dom.txt", "qsfp28-dac-no-dom.txt"):
        dom = parse_module(_fix(name))
        assert not dom.has_dom, name
        readings = module_readings("eth9", dom)
        assert _values(readings, OPTIC_DOM) == {(): 0.0}, name
        assert {r.spec.name for r in readings} == {"supernode_optic_dom_supported", "supernode_optic_info"}, name
    assert parse_module(_fix("sfp-dac-no-dom.txt")).no_dom_declared


def test_partial_page_keeps_what_it_read():
    dom = parse_module(_fix("qsfp28-partial.txt"))
    assert dom.temperature == 71.25
    assert dom.voltage is None
    assert sorted(dom.bad_fields) == ["Module voltage", "Transmit avg optical power (Channel 1)"]
    assert dom.lanes["tx_bias"] == {"1": 0.007512, "2": 0.007498, "3": 0.007601}
    assert "rx_power" not in dom.lanes


def test_garbage_never_raises():
    for text in ("", "\x00\xff garbage", "no colon here\n:\n : \n", "Module temperature : hot\n" * 3,
                 "Rcvr signal avg optical power(Channel x) : 1 mW / nan dBm\n"):
        dom = parse_module(text)
        assert dom.temperature is None
    dom = parse_module("Module temperature : hot\n")
    assert dom.bad_fields == ["Module temperature"] and not dom.has_dom
