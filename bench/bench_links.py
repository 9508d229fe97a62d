"""Benchmark: port-state poll of 8 ports and DOM poll of 8 modules on the simulated tree.

Prints wall and CPU time per poll (median of several runs) and a ratio
against real peers measured in the same run: `ip -s -j link show` (iproute2
reading every host link's state and statistics in one call) for port state,
and 8 spawns of `ethtool -m` (the per-module process the agent runs on real
hardware; here on `lo`, which answers "not supported" without EEPROM time).

    .venv/bin/python bench/bench_links.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import tempfile
from pathlib import Path

from sim.links_tree import SimLinkTree
from sim.rack import RackModel
from exporters.links.dom import DirReader, DomSource
from exporters.links.links import LinkSource
from timing import median_wall_cpu

PORTS = tuple((f"mlx5_{i}/1", "ib", f"ib{i}") for i in range(4)) + tuple((f"eth{i}", "eth", None) for i in range(4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bench-links-"))
    model = RackModel(nodes=1, gpus_per_node=4)
    tree = SimLinkTree(model, "node01", base, ports=PORTS)
    asyncio.run(tree.start())
    with model.lock:
        model.step(1.0)
        tree.update(model)
    loop = asyncio.new_event_loop()
    links = LinkSource(tree.port_specs(), tree.root)
    dom = DomSource(tree.port_specs(), DirReader(tree.dom_dir))
    try:
        loop.run_until_complete(links.poll())  # warm-up (thread start, profile load)
        link_wall, link_cpu = median_wall_cpu(lambda: loop.run_until_complete(links.poll()), args.runs)
        dom_wall, dom_cpu = median_wall_cpu(lambda: loop.run_until_complete(dom.poll()), args.runs)
        n_readings = len(loop.run_until_complete(links.poll()).readings)
        n_dom = len(loop.run_until_complete(dom.poll()).readings)
        print(f"port-state poll, 8 ports ({n_readings} readings): wall {link_wall * 1e3:.2f} ms, "
              f"cpu {link_cpu * 1e3:.2f} ms  (median of {args.runs})")
        print(f"DOM poll, 8 modules ({n_dom} readings):       wall {dom_wall * 1e3:.2f} ms, "
              f"cpu {dom_cpu * 1e3:.2f} ms  (median of {args.runs})")
        ip = shutil.which("ip")
        if ip:
            ip_wall, _ = median_wall_cpu(lambda: subprocess.run([ip, "-s", "-j", "link", "show"], capture_output=True,
                                                         check=True), args.runs)
            print(f"peer: ip -s -j link show (one call): wall {ip_wall * 1e3:.2f} ms; "
                  f"port-state poll / peer = {link_wall / ip_wall:.2f}")
        ethtool = shutil.which("ethtool") or "/usr/sbin/ethtool"
        if Path(ethtool).exists():
            eth_wall, _ = median_wall_cpu(lambda: [subprocess.run([ethtool, "-m", "lo"], capture_output=True)
                                            for _ in range(8)], max(3, args.runs // 3))
            print(f"peer: 8 x ethtool -m spawns (no EEPROM time): wall {eth_wall * 1e3:.2f} ms; "
                  f"DOM poll / peer = {dom_wall / eth_wall:.2f}")
    finally:
        loop.run_until_complete(links.close())
        loop.close()
        asyncio.run(tree.stop())
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
