"""A BACnet CDU in the inventory: validated with the field named, built as the cdu and leak sources of one client,
a shared rack device under coordination, and its valve a control point of its BACnet profile."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import yaml

from agent.config import parse_config
from tests.helpers import REPO
from tests.test_config import assert_named, minimal

CDU = {"name": "cdu1", "protocol": "bacnet", "profile": "reference-cdu", "host": "127.0.0.1",
       "channels": {1: "zone-a", 2: "zone-b"}}


def rack(tmp_path, **cdu_over) -> dict:
    return minimal(tmp_path, inventory={
        "nodes": ["node01", "node02"], "cdus": [{**CDU, **cdu_over}],
        "leak_zones": [{"name": "zone-a", "nodes": ["node01"], "valve": "cdu1:zone_valve_1"},
                       {"name": "zone-b", "nodes": ["node02"]}]})


def test_a_bacnet_cdu_loads_on_the_bacnet_port_and_builds_one_client_for_its_two_polls(tmp_path):
    from agent.coordination.shared import shared_devices
    from agent.sources import build_sources
    from exporters.cooling.bacnet.client import _LINKS
    from exporters.cooling.bacnet.source import BacnetSource

    loaded = parse_config(rack(tmp_path, device_instance=1001))
    (cdu,) = loaded.config.inventory.cdus
    assert (cdu.protocol, cdu.port, cdu.device_instance) == ("bacnet", 47808, 1001)
    sources = [s.source for s in build_sources(loaded) if isinstance(s.source, BacnetSource)]
    assert sorted((s.name, s.subset) for s in sources) == [("cdu", "cdu"), ("leak", "leak")]
    assert sources[0].link is sources[1].link and sources[0].link.device_instance == 1001
    assert [s.client_metrics for s in sources if s.name == "leak"] == [False]  # the cdu poll publishes them
    leak = next(s for s in sources if s.name == "leak")
    assert leak.leak_sensors() == [("zone-a", "cdu-leak-1"), ("zone-b", "cdu-leak-2")]
    shared = shared_devices(loaded.config.inventory)
    assert shared.jobs_of("cdu1") == ["cdu/cdu1", "leak/cdu1"] and "leak/cdu1" in shared.safety
    for s in sources:
        asyncio.run(s.close())  # releases the shared client (nothing was opened: no poll ran)
    assert not _LINKS


@pytest.mark.parametrize("mutate, path, expect", [
    (lambda c: c["inventory"]["cdus"][0].update(profile="vertiv-liebert-xdp"), "inventory.cdus.cdu1.profile",
     "no profile 'vertiv-liebert-xdp' (known: reference-cdu, vertiv-liebert-hpc)"),
    (lambda c: c["inventory"]["cdus"][0].update(unit=3), "inventory.cdus.0", "unit: a Modbus unit id"),
    (lambda c: c["inventory"]["cdus"][0].update(protocol="modbus", device_instance=5), "inventory.cdus.0",
     "device_instance: BACnet only"),
    (lambda c: c["inventory"]["cdus"][0].update(device_instance=4194303), "device_instance",
     "less than or equal to 4194302"),
    (lambda c: c["inventory"]["cdus"][0].update(protocol="knx"), "inventory.cdus.0.protocol", "'modbus', 'snmp' or 'bacnet'"),
    (lambda c: c["inventory"]["leak_zones"][0].update(valve="cdu1:secondary_flow"),
     "inventory.leak_zones.zone-a.valve", "'secondary_flow' of profile 'reference-cdu' is not a control point"),
    (lambda c: c.setdefault("sources", {}).update(bacnet={"cov_lifetime_seconds": 5}),
     "sources.bacnet.cov_lifetime_seconds", "greater than or equal to 10"),
])
def test_a_bad_bacnet_cdu_is_refused_naming_the_field(tmp_path, mutate, path, expect):
    assert_named(rack(tmp_path), mutate, path, expect, tmp_path)


def test_the_demo_and_the_simulator_take_the_cdu_protocol():
    from sim.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["demo", "--cdu-protocol", "bacnet"]).cdu_protocol == "bacnet"
    assert parser.parse_args(["run"]).cdu_protocol == "modbus"
    with pytest.raises(SystemExit):
        parser.parse_args(["demo", "--cdu-protocol", "lonworks"])


@pytest.mark.parametrize("profile, pumps, sensors", [("reference-cdu", 2, 2), ("vertiv-liebert-hpc", 2, 0)])
def test_the_reliability_report_counts_a_bacnet_cdus_pumps_and_leak_inputs(tmp_path, profile, pumps, sensors):
    from agent.reliability import component_counts

    cfg = rack(tmp_path, profile=profile)
    cfg["inventory"]["leak_zones"][0].pop("valve")  # the HPC has no zone valve
    counts = component_counts(parse_config(cfg).config.inventory)
    assert (counts["cdu"], counts["pump"], counts["leak_sensor"]) == (1, pumps, sensors)


def test_a_reload_with_other_client_settings_gets_a_client_with_them(tmp_path):
    from agent.sources import build_sources
    from exporters.cooling.bacnet.client import _LINKS

    def links(request_timeout: float) -> list:
        cfg = rack(tmp_path)
        cfg["sources"] = {"bacnet": {"request_timeout": request_timeout}}
        return [s.source for s in build_sources(parse_config(cfg)) if s.source.name in ("cdu", "leak")]
    old = links(1.0)
    new = links(0.3)  # built while the old sources still run, as a reload does
    assert {s.link.timeout for s in old} == {1.0} and {s.link.timeout for s in new} == {0.3}
    for s in old + new:
        asyncio.run(s.close())
    assert not _LINKS


BOTH = ("no secondary (rack) loop flow and no secondary (rack) loop supply temperature: "
        "coolant_flow_low, coolant_supply_hot cannot run for this CDU")


@pytest.mark.parametrize("protocol, profile, says", [
    ("bacnet", "reference-cdu", None),
    ("bacnet", "vertiv-liebert-hpc", BOTH),  # its published multistate objects only
    ("modbus", "vertiv-liebert-xdp", BOTH),  # pumped refrigerant: its water is the primary loop
    ("modbus", "kenmec-lx1400", "no secondary (rack) loop supply temperature: coolant_supply_hot cannot run"),
    ("modbus", "reference-cdu", None),
])
def test_a_cdu_whose_profile_cannot_feed_a_coolant_detector_is_named_at_load(tmp_path, protocol, profile, says):
    cfg = rack(tmp_path, protocol=protocol, profile=profile)
    cfg["inventory"]["leak_zones"][0].pop("valve")  # a vendor profile's valve points differ from the reference's
    warned = [w for w in parse_config(cfg).warnings if w.startswith("inventory.cdus.cdu1:")]
    if says is None:
        assert warned == []
        return
    (warning,) = warned
    assert f"profile {profile!r} publishes {says}" in warning, warning


def test_check_config_prints_what_a_bacnet_cdus_profile_cannot_feed(tmp_path):
    cfg = rack(tmp_path, profile="vertiv-liebert-hpc")
    cfg["inventory"]["leak_zones"][0].pop("valve")
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = subprocess.run([sys.executable, "-m", "agent.cli", "check-config", str(path)], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 0 and ": ok (" in out.stdout, out.stdout + out.stderr
    assert ("warning: inventory.cdus.cdu1: profile 'vertiv-liebert-hpc' publishes no secondary (rack) loop flow"
            in out.stderr), out.stderr
