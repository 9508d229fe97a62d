"""DomSource: concurrent module reads, per-module timeouts and errors, real ethtool and file readers."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from exporters.links.dom import OPTIC_DOM, OPTIC_RX, DirReader, DomSource, EthtoolReader
from exporters.model import SourceError
from exporters.links.ports import PortSpec
from tests.helpers import require_binary, wait_for

FIX = Path(__file__).parent / "fixtures" / "links" / "ethtool"

# A stand-in ethtool with the real one's interface (`-m IF`), so timeouts and exit codes are real processes'.
FAKE_ETHTOOL = """#!/bin/sh
log={log}
echo "start $(date +%s.%N) $2" >> "$log"
case "$2" in
  hang) echo $$ > {pidfile}; exec sleep 30 ;;
  broken) echo "end $(date +%s.%N) $2" >> "$log"; echo "netlink error: Input/output error" >&2; exit 1 ;;
  virt) echo "end $(date +%s.%N) $2" >> "$log"; echo "netlink error: Operation not supported" >&2; exit 1 ;;
esac
sleep 0.2
cat {fixtures}/"$2".txt
echo "end $(date +%s.%N) $2" >> "$log"
"""


@pytest.fixture
def fake_ethtool(tmp_path: Path) -> Path:
    fixtures = tmp_path / "mods"
    fixtures.mkdir()
    for i, name in enumerate(["qsfp28-100g-sr4-alarms", "osfp-400g-cmis", "sfp-10g-lr", "qsfp28-100g-sr4-alarms"]):
        shutil.copy(FIX / f"{name}.txt", fixtures / f"mod{i}.txt")
    script = tmp_path / "ethtool"
    script.write_text(FAKE_ETHTOOL.format(log=tmp_path / "log", pidfile=tmp_path / "pid", fixtures=fixtures))
    script.chmod(0o755)
    return script


def _max_overlap(log: Path) -> int:
    """Most reads running at once; the hung one (killed, so no end line) is left out."""
    lines = [line.split() for line in log.read_text().splitlines()]
    ended = {name for kind, _, name in lines if kind == "end"}
    events = [(float(t), 1 if kind == "start" else -1) for kind, t, name in lines if name in ended]
    assert len(events) == 2 * 6
    live = peak = 0
    for _, d in sorted(events):
        live += d
        peak = max(peak, live)
    return peak


def test_reads_are_bounded_and_one_bad_module_fails_alone(fake_ethtool: Path, tmp_path: Path):
    ports = [PortSpec(f"mod{i}") for i in range(4)] + [PortSpec("hang"), PortSpec("broken"), PortSpec("virt"),
                                                       PortSpec("mlx5_0/1", "ib")]  # IB port without a netdev
    source = DomSource(ports, EthtoolReader(str(fake_ethtool)), concurrency=2, module_timeout=1.0)
    result = asyncio.run(source.poll())
    assert result.partial_errors == {"timeout": 1, "driver": 1}
    assert any("hang" in e for e in source.last_errors) and any("Input/output" in e for e in source.last_errors)
    supported = {r.labels["port"]: r.value for r in result.readings if r.spec is OPTIC_DOM}
    assert supported == {"mod0": 1.0, "mod1": 1.0, "mod2": 1.0, "mod3": 1.0, "virt": 0.0, "mlx5_0/1": 0.0}
    rx = {(r.labels["port"], r.labels["lane"]): r.value for r in result.readings if r.spec is OPTIC_RX}
    assert rx[("mod0", "3")] == -15.2 and rx[("mod1", "7")] == -10.0 and rx[("mod2", "1")] == -4.0
    assert _max_overlap(tmp_path / "log") <= 2
    # The hung ethtool was killed at its timeout, not left behind.
    pid = int((tmp_path / "pid").read_text())
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2],
             timeout=5, what="hung ethtool killed")


def test_missing_binary_is_a_config_error():
    source = DomSource([PortSpec("eth0")], EthtoolReader("/nonexistent/ethtool"))
    with pytest.raises(SourceError) as err:
        asyncio.run(source.poll())
    assert err.value.kind == "config"


def test_real_ethtool_on_a_nic_without_module_eeprom():
    ethtool = require_binary("ethtool")
    result = asyncio.run(DomSource([PortSpec("lo")], EthtoolReader(ethtool)).poll())
    assert result.partial_errors == {}
    assert [(r.spec, r.value) for r in result.readings] == [(OPTIC_DOM, 0.0)]


def test_dir_reader_uses_the_netdev_of_ib_ports(tmp_path: Path):
    shutil.copy(FIX / "osfp-400g-cmis.txt", tmp_path / "ib0.txt")
    ports = [PortSpec("mlx5_0/1", "ib", netdev="ib0"), PortSpec("eth7")]  # eth7: no file, no module
    result = asyncio.run(DomSource(ports, DirReader(tmp_path)).poll())
    assert result.partial_errors == {}
    supported = {r.labels["port"]: r.value for r in result.readings if r.spec is OPTIC_DOM}
    assert supported == {"mlx5_0/1": 1.0, "eth7": 0.0}
    assert sum(1 for r in result.readings if r.spec is OPTIC_RX and r.labels["port"] == "mlx5_0/1") == 8


def test_dom_settings_in_the_config():
    from agent.config import ConfigError, parse_config

    cfg = parse_config({"agent": {"rack": "r", "node": "n"},
                        "sources": {"dom": {"dom_dir": "/run/sim/dom", "concurrency": 2}}}).config
    assert cfg.sources.dom.dom_dir == Path("/run/sim/dom") and cfg.sources.dom.interval == 30.0
    with pytest.raises(ConfigError, match="sources.dom.concurency"):
        parse_config({"agent": {"rack": "r", "node": "n"}, "sources": {"dom": {"concurency": 2}}})
