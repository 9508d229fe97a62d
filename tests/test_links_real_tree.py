"""The links collector on a real /sys/class/infiniband tree of an H100 node, read as it is.

tests/fixtures/links/h100-gpud is a capture (see its README): NDR rates, no trailing
newlines, port_xmit_data/port_rcv_data above 2^32 (octets / 4). Expected values are
read from the capture's files here with plain int(), not through the collector.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from exporters.links.links import LINK_ERRORS, LINK_IB_PHYS_STATE, LINK_RX_BYTES, LINK_SPEED, LINK_TX_BYTES, LINK_UP, LinkSource
from exporters.model import Quality
from exporters.links.ports import PortSpec

ROOT = Path(__file__).parent / "fixtures" / "links" / "h100-gpud"
IB_DIR = ROOT / "class" / "infiniband"
DEVICES = sorted(p.name for p in IB_DIR.iterdir())
PORTS = [PortSpec(f"{d}/1", "ib") for d in DEVICES]


def _raw(dev: str, rel: str) -> str:
    return (IB_DIR / dev / "ports" / "1" / rel).read_text()


def _by(readings, spec, label: str | None = None) -> dict:
    return {(r.labels["port"], r.labels[label]) if label else r.labels["port"]: r.value
            for r in readings if r.spec is spec and r.quality is Quality.OK}


def test_every_port_of_the_real_h100_tree_reads_whole():
    assert len(DEVICES) == 9  # mlx5_0,1,4..9 and the RoCE bond
    result = asyncio.run(LinkSource(PORTS, ROOT).poll())
    assert result.partial_errors == {}
    assert not [r for r in result.readings if r.quality is not Quality.OK]
    up, phys, speed = (_by(result.readings, s) for s in (LINK_UP, LINK_IB_PHYS_STATE, LINK_SPEED))
    rx, tx = _by(result.readings, LINK_RX_BYTES), _by(result.readings, LINK_TX_BYTES)
    errors = _by(result.readings, LINK_ERRORS, "counter")
    big = 0
    for dev in DEVICES:
        port = f"{dev}/1"
        assert _raw(dev, "state") == "4: ACTIVE" and up[port] == 1.0
        assert _raw(dev, "phys_state") == "5: LinkUp" and phys[port] == 5.0
        gbps = {"400 Gb/sec (4X NDR)": 400, "200 Gb/sec (2X NDR)": 200}[_raw(dev, "rate")]
        assert speed[port] == gbps * 1e9 / 8
        words_rx, words_tx = int(_raw(dev, "counters/port_rcv_data")), int(_raw(dev, "counters/port_xmit_data"))
        assert rx[port] == 4 * words_rx and tx[port] == 4 * words_tx  # octets / 4 in sysfs, bytes exported
        big += words_rx > 2**32
        for name in ("symbol_error", "link_downed", "port_rcv_errors", "excessive_buffer_overrun_errors"):
            assert errors[(port, name)] == int(_raw(dev, f"counters/{name}"))
    assert big == len(DEVICES)  # every data counter is past 32 bits: no truncation happened
