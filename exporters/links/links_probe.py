"""`supernode-agent probe links`: one poll of the node's ports and optics, as Prometheus text.

For an operator checking a new node (or a test) without starting the agent:
what would be exported, read the same way the running agent reads it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterable

from exporters.links.dom import DomSource, make_reader
from exporters.links.links import LinkSource
from exporters.model import PollResult
from exporters.render import render_readings


async def probe_links_async(ports: Iterable[Any], sysfs_root: Path | str = Path("/sys"),
                            dom_dir: Path | str | None = None, dom: bool = True,
                            ethtool: str = "ethtool") -> tuple[PollResult, PollResult | None, list[str]]:
    ports = list(ports)
    links = LinkSource(ports, sysfs_root)
    try:
        link_result = await links.poll()
    finally:
        await links.close()
    notes = list(links.last_problems)
    dom_result = None
    if dom:
        source = DomSource(ports, make_reader(dom_dir, ethtool))
        dom_result = await source.poll()
        notes += source.last_errors
    return link_result, dom_result, notes


def probe_links(config_ports: Iterable[Any], sysfs_root: Path | str = Path("/sys"),
                dom_dir: Path | str | None = None, dom: bool = True) -> str:
    """Prometheus text of one poll of the ports (and their optics unless `dom` is False).

    Problems (unreadable files, failed modules, not-OK readings) come first as `#` comment lines.
    """
    link_result, dom_result, notes = asyncio.run(probe_links_async(config_ports, sysfs_root, dom_dir, dom))
    readings = link_result.readings + (dom_result.readings if dom_result else [])
    notes += [f"{r.reading_id()}: quality {r.quality.value}" for r in readings if not r.ok]
    head = "".join(f"# problem: {n}\n" for n in notes)
    return head + render_readings(readings).decode()
