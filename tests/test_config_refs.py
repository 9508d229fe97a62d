"""check-config refuses dangling cross-references (naming the field) and warns about readable secret files."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.helpers import REPO
from tests.test_config import assert_named, error_of, minimal

CDU = {"name": "cdu1", "profile": "reference-cdu", "channels": {1: "zone-a"}}


def rack(tmp_path, **inventory_over) -> dict:
    inventory = {"nodes": ["node01", "node02"], "cdus": [dict(CDU)],
                 "leak_zones": [{"name": "zone-a", "nodes": ["node01"], "valve": "cdu1:zone_valve_1"}],
                 "pdus": [{"name": "pdu-a", "profile": "raritan-pdu2", "outlets": {"1": "node01"}}]}
    inventory.update(inventory_over)
    return minimal(tmp_path, inventory=inventory)


def test_consistent_rack_loads(tmp_path):
    from agent.config import parse_config

    assert parse_config(rack(tmp_path)).config.inventory.leak_zones[0].valve == "cdu1:zone_valve_1"


@pytest.mark.parametrize("mutate, field, expect", [
    (lambda c: c["agent"].update(node="node09"), "agent.node", "'node09' not in inventory.nodes"),
    (lambda c: c.update(remediation={"rack_leader": "node07"}), "remediation.rack_leader", "'node07' not in"),
    (lambda c: c["inventory"]["leak_zones"][0].update(valve="cdu9:zone_valve_1"),
     "inventory.leak_zones.zone-a.valve", "CDU 'cdu9' not in inventory.cdus"),
    (lambda c: c["inventory"]["leak_zones"][0].update(valve="cdu1:zone_valve_7"),
     "inventory.leak_zones.zone-a.valve", "has no point 'zone_valve_7'"),
    (lambda c: c["inventory"]["leak_zones"][0].update(valve="cdu1:secondary_supply_temp"),
     "inventory.leak_zones.zone-a.valve", "not a control point"),
    (lambda c: c["inventory"]["leak_zones"][0].update(valve="zone_valve_1"),
     "inventory.leak_zones.zone-a.valve", "expected cdu:point"),
    (lambda c: c["inventory"]["cdus"][0].update(channels={2: "zone-q"}),
     "inventory.cdus.cdu1.channels.2", "zone 'zone-q' not in inventory.leak_zones"),
    (lambda c: c["inventory"].update(leak_controllers=[{"name": "leak1", "profile": "rle-ld2100",
                                                        "channels": {1: "zone-x"}}]),
     "inventory.leak_controllers.leak1.channels.1", "zone 'zone-x'"),
    (lambda c: c["inventory"]["pdus"][0].update(outlets={"3": "node05"}),
     "inventory.pdus.pdu-a.outlets.3", "node 'node05' not in inventory.nodes"),
    (lambda c: c.update(remediation={"guardrails": {"automatic": ["pdu_outlet_off", "resume_after_lek"]}}),
     "remediation.guardrails.automatic.1", "resume_after_leak"),
    (lambda c: c.update(remediation={"guardrails": {"automatic": ["always"]}}),
     "remediation.guardrails.automatic.0", "pdu_outlet_off"),
])
def test_dangling_reference_is_named(tmp_path, mutate, field, expect):
    assert_named(rack(tmp_path), mutate, field, expect, tmp_path)


def test_every_dangling_reference_is_reported_at_once(tmp_path):
    cfg = rack(tmp_path)
    cfg["agent"]["node"] = "nodeX"
    cfg["inventory"]["pdus"][0]["outlets"] = {"1": "nodeY"}
    msg = error_of(cfg, tmp_path)
    assert "agent.node" in msg and "inventory.pdus.pdu-a.outlets.1" in msg, msg


def test_every_approval_key_is_documented():
    """README lists every key `automatic` accepts, and no other."""
    from typing import get_args

    from agent.remediation.settings import AutomaticKey

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Approval keys"):]
    section = section[:section.index("\n## ", 1) if "\n## " in section else len(section)]
    for key in get_args(AutomaticKey):
        assert f"`{key}`" in section, key
    playbook_keys = set()
    for f in (REPO / "agent" / "playbooks").glob("*.yaml"):
        for step in yaml.safe_load(f.read_text())["steps"]:
            playbook_keys.update(step[k] for k in ("approval", "undo_approval") if step.get(k))
    assert playbook_keys <= set(get_args(AutomaticKey)) | {"always"}


def _check_config(path):
    return subprocess.run([sys.executable, "-m", "agent.cli", "check-config", str(path)], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_check_config_refuses_a_dangling_reference_with_exit_1(tmp_path):
    cfg = rack(tmp_path)
    cfg["inventory"]["leak_zones"][0]["valve"] = "cdu1:nope"
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out = _check_config(path)
    assert out.returncode == 1, out
    assert "inventory.leak_zones.zone-a.valve" in out.stderr and "ok" not in out.stdout


def test_secret_readable_by_others_is_a_warning_not_an_error(tmp_path):
    cfg = rack(tmp_path)
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    token = tmp_path / "admin.token"
    os.chmod(token, 0o600)
    quiet = _check_config(path)
    assert quiet.returncode == 0, quiet
    assert "warning" not in quiet.stderr
    os.chmod(token, 0o644)
    loud = _check_config(path)
    assert loud.returncode == 0, loud
    assert ": ok" in loud.stdout
    assert "warning: secrets.admin_token.file" in loud.stderr and "chmod 600" in loud.stderr, loud.stderr
