"""One rack file shared by every node: merged into each node's config, agent.node from the host name,
the 18-node example checked for every node, and re-read by a reload of the real daemon."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent.config import ConfigError, load_config, parse_config
from tests.agentproc import base_config, running_agent
from tests.helpers import REPO

EXAMPLE = REPO / "examples" / "rack18"
TOKEN = "admin-token-for-tests"


def deployed_example(tmp_path: Path) -> Path:
    """examples/rack18 copied as /etc/supernode-agent would hold it, secrets in 0600 files of their own."""
    etc = tmp_path / "etc"
    shutil.copytree(EXAMPLE, etc)
    cfg = yaml.safe_load((etc / "agent.yaml").read_text())
    for name, ref in cfg["secrets"].items():
        f = etc / name
        f.write_text(f"{name}-value\n")
        os.chmod(f, 0o600)
        ref["file"] = str(f)
    (etc / "agent.yaml").write_text(yaml.safe_dump(cfg))
    return etc / "agent.yaml"


def test_the_node_config_of_the_example_is_a_few_lines():
    lines = [ln for ln in (EXAMPLE / "agent.yaml").read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    assert len(lines) <= 10, lines
    assert "inventory:" not in (EXAMPLE / "agent.yaml").read_text()


def test_the_18_node_example_loads_as_every_node(tmp_path):
    path = deployed_example(tmp_path)
    nodes = yaml.safe_load((EXAMPLE / "rack.yaml").read_text())["inventory"]["nodes"]
    assert len(nodes) == 18
    for node in nodes:
        cfg = load_config(path, node).config
        assert (cfg.agent.node, cfg.agent.rack) == (node, "r01")
        assert cfg.inventory.nodes == nodes and len(cfg.inventory.pdus) == 2
        assert cfg.inventory_file == path.parent / "rack.yaml"
        # the GB200 NVL72 elevation: compute trays 1-10 above the switch trays, 11-18 below them
        assert (cfg.inventory.rack_units["node10"], cfg.inventory.rack_units["node11"]) == (26, 16)


def test_check_config_on_the_example_as_a_node_and_as_this_host(tmp_path):
    path = deployed_example(tmp_path)
    cli = [sys.executable, "-m", "agent.cli", "check-config", str(path)]
    ok = subprocess.run(cli + ["--node", "node18"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "node node18" in ok.stdout and "rack r01" in ok.stdout and "warning" not in ok.stderr
    # Without --node the host name is the node: this machine is not in the example rack.
    host = socket.gethostname().split(".", 1)[0]
    assert not host.startswith("node"), "this test needs a host that is not in the example rack"
    refused = subprocess.run(cli, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert refused.returncode == 1
    assert "agent.node" in refused.stderr and repr(host) in refused.stderr


def test_agent_node_defaults_to_the_short_host_name(tmp_path, monkeypatch):
    monkeypatch.setattr(socket, "gethostname", lambda: "node07.r01.example.org")
    tok = tmp_path / "t"
    tok.write_text("x")
    cfg = parse_config({"agent": {"rack": "r01"}, "inventory": {"nodes": ["node06", "node07"]}})
    assert cfg.config.agent.node == "node07"
    assert parse_config({"agent": {"rack": "r01", "node": "node06"}}).config.agent.node == "node06"


def _node_config(tmp_path: Path, rack: dict, **over) -> Path:
    (tmp_path / "rack.yaml").write_text(yaml.safe_dump(rack))
    cfg = {"agent": {"node": "node01"}, "inventory_file": "rack.yaml", **over}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


RACK = {"rack": "r01", "inventory": {"nodes": ["node01", "node02"]}}


@pytest.mark.parametrize("rack, over, expect", [
    (RACK, {"inventory": {"nodes": ["node01"]}}, "inventory_file: "),
    ({**RACK, "pdus": []}, {}, "unknown field 'pdus'"),
    (RACK, {"agent": {"node": "node01", "rack": "r02"}}, "agent.rack: 'r02' but the rack file"),
    ({"rack": "r01", "inventory": {"nodes": ["node01"], "gpus": {"count": -1}}}, {}, "inventory.gpus.count"),
    (["node01"], {}, "expected a mapping"),
    # issue 35: each tray's rack unit (the trays below a leak), every field named
    ({"rack": "r01", "inventory": {"nodes": ["node01", "node02"], "rack_units": {"node01": 40, "node02": 40}}}, {},
     "rack_units.node02: rack unit 40 is already node01's"),
    ({"rack": "r01", "inventory": {"nodes": ["node01", "node02"], "rack_units": {"node01": 40}}}, {},
     "rack_units: no rack unit for node02"),
    ({"rack": "r01", "inventory": {"nodes": ["node01"], "rack_units": {"node01": 40, "node09": 39}}}, {},
     "rack_units.node09: not a tray of the inventory"),
    ({"rack": "r01", "inventory": {"nodes": ["node01"], "rack_units": {"node01": 0}}}, {}, "inventory.rack_units.node01"),
])
def test_a_bad_rack_file_is_named(tmp_path, rack, over, expect):
    path = _node_config(tmp_path, rack, **over)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert expect in str(exc.value) and "rack.yaml" in str(exc.value), str(exc.value)


def test_a_missing_rack_file_is_named(tmp_path):
    path = _node_config(tmp_path, RACK)
    (tmp_path / "rack.yaml").unlink()
    with pytest.raises(ConfigError, match=r"inventory_file: .*rack\.yaml"):
        load_config(path)


def test_reload_re_reads_the_rack_file(tmp_path):
    """The real daemon: a changed rack file is applied by a reload, a bad one refused with the running one kept."""
    cfg = base_config(tmp_path, TOKEN, inventory_file=str(tmp_path / "rack.yaml"))
    del cfg["agent"]["rack"]
    rack = {"rack": "r01", "inventory": {"nodes": ["node01", "node02"],
                                         "leak_zones": [{"name": "zone-a", "nodes": ["node01"]}]}}
    (tmp_path / "rack.yaml").write_text(yaml.safe_dump(rack))
    with running_agent(cfg, tmp_path) as agent:
        assert 'supernode_leak_zone_info{nodes="node01",zone="zone-a"} 1.0' in agent.metrics()
        assert "zone-b" not in agent.metrics()
        rack["inventory"]["leak_zones"].append({"name": "zone-b", "nodes": ["node02"]})
        (tmp_path / "rack.yaml").write_text(yaml.safe_dump(rack))
        status, body = agent.request("POST", "/-/reload", token=TOKEN)
        assert status == 200, body
        assert 'supernode_leak_zone_info{nodes="node02",zone="zone-b"} 1.0' in agent.metrics()
        # This node leaves the rack file: refused, naming agent.node; the running inventory stays.
        (tmp_path / "rack.yaml").write_text(yaml.safe_dump({"rack": "r01", "inventory": {"nodes": ["node02"]}}))
        status, body = agent.request("POST", "/-/reload", token=TOKEN)
        assert status == 400 and b"agent.node" in body, body
        assert 'zone="zone-b"' in agent.metrics()
        assert agent.state()["config"]["agent"]["rack"] == "r01"
