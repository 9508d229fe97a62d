"""Every config docs/deployment.md shows is a file under examples/, and every command it shows runs.

The page's install block is executed as written, with `/etc/` pointing at a temporary
root (argument lists, no shell): `install` the files, `promtool check config`,
`amtool check-config`. Each `$ amtool config routes test ...` line runs against the
installed example and must print the receivers the page shows under it.
"""

from __future__ import annotations

import glob
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, require_binary

DOC = REPO / "docs" / "deployment.md"
EXAMPLES = REPO / "examples"
TOOLS = ("install", "promtool", "amtool")


def _blocks(text: str) -> list[str]:
    return text.split("```")[1::2]


def _in_root(argv: list[str], root: Path) -> list[str]:
    """The command with every /etc/ path moved under root."""
    return [re.sub(r"(^|=)/etc/", lambda m: f"{m.group(1)}{root}/etc/", a) for a in argv]


def _tool(name: str) -> str:
    return name if name == "install" else require_binary(name)


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)


def install_block() -> list[list[str]]:
    """The doc's block of commands that install and check the Prometheus and Alertmanager configs."""
    block = next(b for b in _blocks(DOC.read_text()) if "promtool check config" in b)
    return [shlex.split(line) for line in block.strip().splitlines()]


@pytest.fixture
def deployed(tmp_path) -> Path:
    """A root where the doc's install block ran; each of its checks must pass."""
    for argv in install_block():
        assert argv[0] in TOOLS, f"deployment.md runs {argv[0]}, which this test does not know"
        res = _run([_tool(argv[0]), *_in_root(argv[1:], tmp_path)])
        assert res.returncode == 0, f"{shlex.join(argv)}: {res.stdout}{res.stderr}"
        if argv[0] != "install":
            assert "SUCCESS" in res.stdout, res.stdout
    return tmp_path


def test_doc_installs_every_rule_file():
    named = {Path(a).name for argv in install_block() for a in argv if a.startswith("alerts/")}
    assert named == {p.name for p in (REPO / "alerts").glob("*.rules.yml")}


def test_prometheus_example_validates_and_finds_the_rules(deployed):
    promtool = require_binary("promtool")
    config = deployed / "etc" / "prometheus" / "prometheus.yml"
    res = _run([promtool, "check", "config", str(config)])
    assert res.returncode == 0, res.stdout + res.stderr
    rule_files = len(list((REPO / "alerts").glob("*.rules.yml")))
    assert f"SUCCESS: {rule_files} rule files found" in res.stdout, res.stdout


def test_file_sd_glob_reads_only_target_files(deployed):
    base = deployed / "etc" / "prometheus"
    cfg = yaml.safe_load((base / "prometheus.yml").read_text())
    job = next(j for j in cfg["scrape_configs"] if j["job_name"] == "supernode-agent")
    matched = [Path(p) for pattern in job["file_sd_configs"][0]["files"] for p in glob.glob(str(base / pattern))]
    assert matched, "the file_sd glob matches nothing"
    rules = {p.resolve() for pattern in cfg["rule_files"] for p in map(Path, glob.glob(str(base / pattern)))}
    assert rules and not rules & {p.resolve() for p in matched}, "the file_sd glob reads a rule file"
    for path in matched:
        groups = yaml.safe_load(path.read_text())
        assert isinstance(groups, list) and all("targets" in g for g in groups), path


def test_file_sd_nodes_are_the_example_inventory():
    agent = yaml.safe_load((EXAMPLES / "agent.yaml").read_text())
    groups = yaml.safe_load((EXAMPLES / "prometheus" / "supernode" / "targets" / "r01.yml").read_text())
    assert [g["labels"]["node"] for g in groups] == agent["inventory"]["nodes"]
    assert {g["labels"]["rack"] for g in groups} == {agent["agent"]["rack"]}
    for g in groups:
        assert g["targets"] == [f"{g['labels']['node']}.r01.example:{agent['listen']['port']}"]


def _route_promises() -> list[tuple[list[str], str]]:
    """(`amtool config routes test` argv, receivers printed) for each `$` line of the doc."""
    lines = DOC.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith("$ amtool config routes test"):
            out.append((shlex.split(line[2:]), lines[i + 1].strip()))
    return out


def test_routing_promises_of_the_doc_hold(deployed):
    amtool = require_binary("amtool")
    promises = _route_promises()
    receivers = {r for _, printed in promises for r in printed.split(",")}
    # People and the agent: a warning-level remediation alert reaches both.
    assert "supernode-agent,operators" in [p for _, p in promises]
    assert {"supernode-agent", "operators", "operators-critical"} <= receivers
    for argv, printed in promises:
        res = _run([amtool, *_in_root(argv[1:], deployed)])
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.strip() == printed, f"{shlex.join(argv)} printed {res.stdout.strip()!r}"


def test_every_receiver_of_the_example_is_reachable():
    """No receiver is dead configuration: the doc's promises reach each of them."""
    cfg = yaml.safe_load((EXAMPLES / "alertmanager.yml").read_text())
    promised = {r for _, printed in _route_promises() for r in printed.split(",")}
    assert {r["name"] for r in cfg["receivers"]} == promised
