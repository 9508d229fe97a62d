"""Issue 18 through the real daemon: hostile devices fault single readings while /metrics keeps answering.

One agent process watches a PDU served by the misbehaving SNMP agent
(DecimalDigits of 400 and -400 on outlets 1 and 2), two ports whose sysfs
has a `speed` of `--1`, and two transceivers, one of whose `ethtool -m` text
carries 20,000-space lines (the old parser backtracked on the event loop and
froze /metrics). The agent must serve every other reading as good, the bent
ones as `sensor_fault`, and keep each source up.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import threading
from pathlib import Path

import pytest

from sim.rack import RackModel
from sim.snmp_pdu import SimulatedRaritanPdu
from tests.agentproc import base_config, running_agent
from tests.bad_snmp_agent import BadSnmpAgent
from tests.helpers import wait_for

FIX = Path(__file__).parent / "fixtures" / "links"
HOSTILE = "\n".join([" " * 20_000, "Module voltage :" + " " * 20_000 + "VVV", "\t" * 20_000 + "x"]) + "\n"


class ThreadedPdu:
    """The misbehaving PDU agent on its own event loop in a thread, for a daemon in another process."""

    def __init__(self, mode: str):
        self.loop = asyncio.new_event_loop()
        self.dev = SimulatedRaritanPdu(RackModel(nodes=2, gpus_per_node=4), name="pdu-a")
        self.dev.agent = BadSnmpAgent(mode)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> tuple[str, int]:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.dev.start(), self.loop).result(10)
        return self.dev.endpoint

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self.dev.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def sample(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.timeout(120)
def test_hostile_devices_fault_single_readings_and_metrics_keep_answering(tmp_path: Path):
    sysfs = tmp_path / "sys"
    shutil.copytree(FIX / "sysfs", sysfs)
    (sysfs / "class/net/eth0/speed").write_text("--1\n")
    dom = tmp_path / "dom"
    dom.mkdir()
    sfp = (FIX / "ethtool" / "sfp-10g-lr.txt").read_text()
    (dom / "eth0.txt").write_text(sfp)
    (dom / "eth2.txt").write_text(sfp + HOSTILE)
    with ThreadedPdu("bad_digits") as (host, port):
        cfg = base_config(tmp_path, inventory={
            "ports": [{"name": "eth0", "kind": "eth"}, {"name": "eth2", "kind": "eth"}],
            "pdus": [{"name": "pdu-a", "profile": "raritan-pdu2", "host": host, "port": port,
                      "request_timeout": 1.0, "retries": 0}]})
        cfg["sources"].update({"sysfs_root": str(sysfs), "links": {"interval": 1.0, "timeout": 2.0},
                               "dom": {"interval": 5.0, "timeout": 20.0, "dom_dir": str(dom), "module_timeout": 15.0},
                               "pdu": {"interval": 1.0, "timeout": 3.0}})
        with running_agent(cfg, tmp_path) as agent:
            def settled() -> str | None:
                text = agent.metrics()
                want = [sample(text, "supernode_source_up", source=s) == 1.0 for s in ("pdu", "links", "dom")]
                have = sample(text, "supernode_optic_rx_power_dbm", port="eth2") is not None
                return text if all(want) and have else None

            text = wait_for(settled, 60, interval=0.2, what="pdu, links and dom up with eth2's optics read")
            log = agent.log()
    assert sample(text, "supernode_pdu_outlet_power_watts", outlet="3") is not None
    for outlet in ("1", "2"):
        assert sample(text, "supernode_pdu_outlet_power_watts", outlet=outlet) is None
        assert re.search(r'supernode_reading_quality\{[^}]*quality="sensor_fault"[^}]*reading="pdu_outlet_power_watts'
                         rf'[^"]*outlet={outlet}[,"]', text), outlet
    assert sample(text, "supernode_link_up", port="eth0") == 1.0
    assert sample(text, "supernode_link_speed_bytes_per_second", port="eth0") is None
    assert sample(text, "supernode_link_speed_bytes_per_second", port="eth2") is not None
    assert sample(text, "supernode_optic_rx_power_dbm", port="eth2", lane="1") == -4.0
    assert "Traceback" not in log
