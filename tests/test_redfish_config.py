"""The Redfish inventory and source settings: bad values refused with the field's path, cross-references checked."""

from __future__ import annotations

import pytest

from agent.config import parse_config
from tests.test_config import assert_named, minimal

PIN = "ab" * 32


def rack(tmp_path, **inventory_over) -> dict:
    (tmp_path / "bmc.pw").write_text("secret-password\n")
    inventory = {"nodes": ["node01", "node02"],
                 "leak_zones": [{"name": "zone-a", "nodes": ["node01"]}, {"name": "zone-b", "nodes": ["node02"]}],
                 "redfish": [{"name": "node01-bmc", "kind": "tray", "node": "node01", "url": "https://10.0.0.11",
                              "user": "agent", "password_secret": "bmc", "pinned_sha256": PIN},
                             {"name": "cdu-r", "kind": "cdu", "url": "https://10.0.0.20:8443"}]}
    inventory.update(inventory_over)
    cfg = minimal(tmp_path, inventory=inventory)
    cfg["secrets"]["bmc"] = {"file": str(tmp_path / "bmc.pw")}
    return cfg


def test_a_rack_with_trays_and_a_cdu_loads_and_infers_the_tray_zone(tmp_path):
    cfg = parse_config(rack(tmp_path)).config
    tray, cdu = cfg.inventory.redfish
    assert cfg.inventory.redfish_zone(tray) == "zone-a"  # the one zone listing node01: its own
    assert cfg.inventory.redfish_zone(cdu) == "cdu-r"
    assert cfg.sources.redfish.interval == 2.0 and cfg.sources.redfish.max_connections == 2


def _tray(c: dict) -> dict:
    return c["inventory"]["redfish"][0]


@pytest.mark.parametrize("mutate, field, expect", [
    (lambda c: _tray(c).update(url="http://10.0.0.11"), "inventory.redfish.0.url", "https://"),
    (lambda c: _tray(c).update(url="https://10.0.0.11/redfish/v1/Chassis"), "inventory.redfish.0.url", "origin"),
    (lambda c: _tray(c).pop("node"), "inventory.redfish.0", "node: required for kind tray"),
    (lambda c: c["inventory"]["redfish"][1].update(node="node01"), "inventory.redfish.1", "only for kind tray"),
    (lambda c: _tray(c).update(pinned_sha256="abc"), "inventory.redfish.0.pinned_sha256", "64 hex digits"),
    (lambda c: _tray(c).update(ca_file="/etc/ssl/ca.pem"), "inventory.redfish.0", "not both"),
    (lambda c: _tray(c).pop("password_secret"), "inventory.redfish.0", "user and password_secret go together"),
    (lambda c: _tray(c).update(kind="router"), "inventory.redfish.0.kind", "'tray', 'cdu' or 'switch'"),
    (lambda c: _tray(c).update(profile="../etc"), "inventory.redfish.0.profile", "bare name"),
    (lambda c: c["inventory"]["redfish"].append(dict(_tray(c))), "inventory", "redfish: name 'node01-bmc' appears twice"),
    (lambda c: c.update(sources={"redfish": {"max_connections": 9}}), "sources.redfish.max_connections", "4"),
    (lambda c: c.update(sources={"redfish": {"max_connections": 1}}), "sources.redfish", "at least 2 with events"),
    (lambda c: c.update(sources={"redfish": {"request_timeout": 3}}), "sources.redfish", "exceeds the poll timeout"),
    (lambda c: c.update(sources={"redfish": {"event_destination": "ftp://x/y"}}), "sources.redfish",
     "event_destination: expected this agent's base URL"),
    (lambda c: c.update(sources={"redfish": {"events": "push"}}), "sources.redfish",
     "events push needs event_destination"),
])
def test_bad_values_are_named(tmp_path, mutate, field, expect):
    assert_named(rack(tmp_path), mutate, field, expect, tmp_path)


@pytest.mark.parametrize("mutate, field, expect", [
    (lambda c: _tray(c).update(node="node07"), "inventory.redfish.node01-bmc.node", "'node07' not in inventory.nodes"),
    (lambda c: _tray(c).update(zone="zone-q"), "inventory.redfish.node01-bmc.zone", "'zone-q' not in inventory.leak"),
    (lambda c: _tray(c).update(zone="zone-b"), "inventory.redfish.node01-bmc.zone", "never drain it"),
    (lambda c: c["inventory"]["leak_zones"][0].update(nodes=["node02"]), "inventory.redfish.node01-bmc.zone",
     "no leak zone lists node 'node01'"),
    (lambda c: c["inventory"]["leak_zones"][1].update(nodes=["node01", "node02"]),
     "inventory.redfish.node01-bmc.zone", "several leak zones list node 'node01' (zone-a, zone-b)"),
    (lambda c: c["inventory"]["redfish"][1].update(zone="zone-z"), "inventory.redfish.cdu-r.zone", "'zone-z'"),
    (lambda c: _tray(c).update(password_secret="nope"), "inventory.redfish.node01-bmc.password_secret",
     "secret 'nope' not in secrets"),
    (lambda c: c.update(sources={"redfish": {"event_token_secret": "nope"}}), "sources.redfish.event_token_secret",
     "secret 'nope'"),
    (lambda c: _tray(c).update(event_token_secret="nope"), "inventory.redfish.node01-bmc.event_token_secret",
     "secret 'nope' not in secrets"),
    (lambda c: c["inventory"].update(rack_valve="cdu9:valve"), "inventory.rack_valve", "CDU 'cdu9' not in"),
    (lambda c: _tray(c).update(profile="hpe-ilo"), "inventory.redfish.node01-bmc.profile", "no profile 'hpe-ilo'"),
])
def test_dangling_references_are_named(tmp_path, mutate, field, expect):
    assert_named(rack(tmp_path), mutate, field, expect, tmp_path)


def test_a_ca_file_that_is_not_a_ca_is_named(tmp_path):
    cfg = rack(tmp_path)
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    _tray(cfg).pop("pinned_sha256")
    _tray(cfg)["ca_file"] = str(bad)
    assert_named(cfg, lambda c: None, "inventory.redfish.node01-bmc.ca_file", str(bad), tmp_path)


def test_one_push_token_for_several_services_loads_with_a_warning_and_own_tokens_are_quiet(tmp_path):
    """A shared sources.redfish.event_token_secret lets any BMC push in another's name: still accepted (older
    configs), but check-config and the start log say so; a token per service is quiet."""
    cfg = rack(tmp_path)
    for name in ("push_all", "push_tray", "push_cdu"):
        (tmp_path / name).write_text(f"{name}-token\n")
        cfg["secrets"][name] = {"file": str(tmp_path / name)}
    cfg["sources"] = {"redfish": {"event_token_secret": "push_all"}}
    warnings = parse_config(cfg).warnings
    assert any("sources.redfish.event_token_secret is the push token of 2 Redfish services (node01-bmc, cdu-r)" in w
               for w in warnings), warnings
    _tray(cfg)["event_token_secret"] = "push_tray"
    cfg["inventory"]["redfish"][1]["event_token_secret"] = "push_cdu"
    assert not [w for w in parse_config(cfg).warnings if "event_token_secret" in w]
