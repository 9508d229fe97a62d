"""The simulated links tree read by the real LinkSource/DomSource: faults show up within one poll."""

from __future__ import annotations

import asyncio
import sys
import math
import threading
from pathlib import Path
from typing import Iterator

import pytest

from sim.links_tree import SimLinkTree
from sim.rack import RackModel
from exporters.links.dom import OPTIC_ALARM, OPTIC_RX, DirReader, DomSource
from exporters.links.link_control import LinkControlError, isolate_link, read_link_state
from exporters.links.links import LINK_ERRORS, LINK_FLAPS, LINK_RX_BYTES, LINK_SATURATED, LINK_UP, LinkSource
from exporters.links.links_probe import probe_links
from exporters.links.ports import PortSpec


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[RackModel, SimLinkTree]]:
    model = RackModel(nodes=2, gpus_per_node=2)
    tree = SimLinkTree(model, "node02", tmp_path)
    asyncio.run(tree.start())
    yield model, tree
    asyncio.run(tree.stop())


def _tick(model: RackModel, tree: SimLinkTree, dt: float = 1.0) -> None:
    with model.lock:
        model.step(dt)
        tree.update(model)


def _by(readings, spec, *labels):
    return {tuple(r.labels[k] for k in labels): r.value for r in readings if r.spec is spec}


def test_counters_move_and_faults_show_in_one_poll(sim):
    model, tree = sim
    links = LinkSource(tree.port_specs(), tree.root)
    first = asyncio.run(links.poll()).readings
    assert _by(first, LINK_UP, "port") == {("mlx5_0/1",): 1.0, ("mlx5_1/1",): 1.0, ("eth0",): 1.0, ("eth1",): 1.0}
    _tick(model, tree)
    tree.link_flap("mlx5_0/1", 3)
    tree.link_flap("eth1", 1)
    tree.ib_errors("mlx5_1/1", "symbol_error", 1000)
    _tick(model, tree, 2.0)
    second = asyncio.run(links.poll()).readings
    assert _by(second, LINK_FLAPS, "port") == {("mlx5_0/1",): 3.0, ("mlx5_1/1",): 0.0, ("eth0",): 0.0, ("eth1",): 1.0}
    assert _by(second, LINK_ERRORS, "port", "counter")[("mlx5_1/1", "symbol_error")] == 2000
    rx_bytes = _by(second, LINK_RX_BYTES, "port")
    assert rx_bytes[("eth0",)] > _by(first, LINK_RX_BYTES, "port")[("eth0",)]
    # A fast error rate saturates the 16-bit counter, which then sticks.
    tree.ib_errors("mlx5_1/1", "symbol_error", 1e6)
    _tick(model, tree)
    third = asyncio.run(links.poll()).readings
    assert _by(third, LINK_ERRORS, "port", "counter")[("mlx5_1/1", "symbol_error")] == 65535
    assert _by(third, LINK_SATURATED, "port", "counter")[("mlx5_1/1", "symbol_error")] == 1.0
    asyncio.run(links.close())


def test_optic_degradation_raises_the_module_flags(sim):
    model, tree = sim
    dom = DomSource(tree.port_specs(), DirReader(tree.dom_dir))
    before = asyncio.run(dom.poll())
    assert before.partial_errors == {}
    assert _by(before.readings, OPTIC_RX, "port", "lane")[("eth0", "1")] == -1.5
    assert len([k for k in _by(before.readings, OPTIC_RX, "port", "lane") if k[0] == "mlx5_0/1"]) == 8
    tree.optic_degrade("eth0", -12.0)
    _tick(model, tree)
    after = asyncio.run(dom.poll()).readings
    assert _by(after, OPTIC_RX, "port", "lane")[("eth0", "2")] == -12.0
    alarms = _by(after, OPTIC_ALARM, "port", "alarm", "lane")
    assert alarms[("eth0", "rx_power_low_warning", "1")] == 1.0
    assert alarms[("eth0", "rx_power_low_alarm", "1")] == 0.0  # -12 is above the -13.5 alarm threshold
    assert alarms[("eth1", "rx_power_low_warning", "1")] == 0.0
    tree.clear()
    _tick(model, tree)
    assert _by(asyncio.run(dom.poll()).readings, OPTIC_RX, "port", "lane")[("eth0", "1")] == -1.5


def test_isolate_link_on_the_simulated_tree(sim):
    """The agent runs the same commands as on a host; the simulator's stand-in programs act on its tree."""
    model, tree = sim
    shim = [sys.executable, "-m", "sim.link_shim", str(tree.root)]
    programs = {"ip": shim, "ibportstate": shim}
    links = LinkSource(tree.port_specs(), tree.root)
    asyncio.run(links.poll())
    for name in ("eth1", "mlx5_1/1"):
        port = PortSpec(name, "eth" if name.startswith("eth") else "ib", isolatable=True)
        action = isolate_link(port, up=False, **programs)
        assert action.argv[:len(shim)] == tuple(shim)
        assert action.argv[-1] in ("down", "disable")
        _tick(model, tree)
        assert read_link_state(port, tree.root) == "down"
    readings = asyncio.run(links.poll()).readings
    assert _by(readings, LINK_UP, "port")[("eth1",)] == 0.0 and _by(readings, LINK_UP, "port")[("mlx5_1/1",)] == 0.0
    assert _by(readings, LINK_FLAPS, "port")[("eth1",)] == 1.0
    assert (tree.root / "class/infiniband/mlx5_1/ports/1/phys_state").read_text() == "3: Disabled\n"
    # Dark optics on the isolated link.
    rx = _by(asyncio.run(DomSource(tree.port_specs(), DirReader(tree.dom_dir)).poll()).readings, OPTIC_RX, "port", "lane")
    assert rx[("eth1", "1")] == -math.inf
    isolate_link(PortSpec("eth1", isolatable=True), up=True, **programs)
    _tick(model, tree)
    assert read_link_state(PortSpec("eth1"), tree.root) == "up"
    with pytest.raises(LinkControlError):
        isolate_link(PortSpec("eth0"), up=False, **programs)
    asyncio.run(links.close())


def test_readers_never_see_half_written_files(sim):
    model, tree = sim
    files = [tree.root / "class/net/eth0/statistics/rx_bytes", tree.root / "class/infiniband/mlx5_0/ports/1/state",
             tree.dom_dir / "eth0.txt"]
    stop = threading.Event()
    bad: list[str] = []
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            for f in files:
                text = f.read_text()
                reads[0] += 1
                if not text.endswith("\n") or (f.suffix == ".txt" and "threshold" not in text):
                    bad.append(f"{f.name}: {text[-40:]!r}")

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(60):
            tree.optic_degrade("eth0", -3.0 - (i % 10))  # DOM file changes every tick
            _tick(model, tree, 0.1)
    finally:
        stop.set()
        t.join(10)
    assert reads[0] > 0 and bad == []


def test_probe_prints_one_poll(sim):
    model, tree = sim
    tree.optic_degrade("eth1", -14.0)
    _tick(model, tree)
    text = probe_links(tree.port_specs(), tree.root, tree.dom_dir)
    assert 'supernode_link_up{kind="ib",port="mlx5_0/1"} 1.0' in text
    assert "# TYPE supernode_link_flaps_total counter" in text
    assert 'supernode_optic_rx_power_dbm{lane="1",port="eth1"} -14.0' in text
    assert 'supernode_optic_alarm_active{alarm="rx_power_low_alarm",lane="1",port="eth1"} 1.0' in text
    assert "# problem" not in text
    missing = probe_links([("eth5", "eth")], tree.root, tree.dom_dir)
    assert missing.startswith("# problem:") and 'supernode_link_up{kind="eth",port="eth5"} 0.0' in missing
    assert 'supernode_optic_dom_supported{port="eth5"} 0.0' in missing


def test_fault_setters_check_their_arguments(sim):
    _, tree = sim
    with pytest.raises(ValueError, match="no port"):
        tree.link_flap("eth9", 1)
    with pytest.raises(ValueError, match="no IB counter"):
        tree.ib_errors("eth0", "symbol_error", 1)
    with pytest.raises(ValueError, match="count"):
        tree.link_flap("eth0", 0)
