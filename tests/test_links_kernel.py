"""Real kernel links: a veth pair into a network namespace the test creates (and always removes)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from exporters.links.link_control import LinkControlError, isolate_link, read_link_state
from exporters.links.links import LINK_CARRIER_CHANGES, LINK_FLAPS, LINK_UP, LinkSource
from exporters.links.ports import PortSpec
from tests.helpers import ALLOW_MISSING_PEERS, require_binary, wait_for


def _ip(*args: str) -> None:
    subprocess.run([require_binary("ip"), *args], check=True, capture_output=True, timeout=10)


def _operstate(ifname: str) -> str:
    return Path(f"/sys/class/net/{ifname}/operstate").read_text().strip()


@pytest.fixture
def veth() -> Iterator[str]:
    """Host side of a veth pair whose peer sits, up, in a fresh namespace; both removed afterwards."""
    require_binary("ip")
    if os.geteuid() != 0:
        if ALLOW_MISSING_PEERS:
            pytest.skip("needs root to create network namespaces (SUPERNODE_TEST_ALLOW_MISSING_PEERS=1)")
        pytest.fail("the real-links test needs root (CAP_NET_ADMIN) to create namespaces")
    tag = uuid.uuid4().hex[:6]
    ns, host, peer = f"supernode-test-{tag}", f"snh{tag}", f"snp{tag}"
    _ip("netns", "add", ns)
    try:
        _ip("link", "add", host, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("-n", ns, "link", "set", peer, "up")
        _ip("link", "set", "dev", host, "up")
        wait_for(lambda: _operstate(host) == "up", timeout=10, what=f"{host} up")
        yield host
    finally:
        subprocess.run([require_binary("ip"), "link", "del", host], capture_output=True, timeout=10)
        subprocess.run([require_binary("ip"), "netns", "del", ns], capture_output=True, timeout=10)
    assert not Path(f"/sys/class/net/{host}").exists()
    assert ns not in subprocess.run([require_binary("ip"), "netns", "list"], capture_output=True, text=True).stdout


def _values(source: LinkSource, spec) -> float:
    result = asyncio.run(source.poll())
    return {r.spec.name: r.value for r in result.readings}[spec.name]


def test_down_and_up_is_seen_as_a_flap(veth: str):
    source = LinkSource([PortSpec(veth)], "/sys")
    try:
        assert _values(source, LINK_UP) == 1.0
        _ip("link", "set", "dev", veth, "down")
        wait_for(lambda: _operstate(veth) == "down", timeout=10, what="operstate down")
        result = asyncio.run(source.poll())
        values = {r.spec.name: r.value for r in result.readings}
        assert values[LINK_UP.name] == 0.0 and values[LINK_FLAPS.name] == 1.0
        changes_down = values[LINK_CARRIER_CHANGES.name]
        _ip("link", "set", "dev", veth, "up")
        wait_for(lambda: _operstate(veth) == "up", timeout=10, what="operstate up")
        result = asyncio.run(source.poll())
        values = {r.spec.name: r.value for r in result.readings}
        assert values[LINK_UP.name] == 1.0 and values[LINK_FLAPS.name] == 1.0
        assert values[LINK_CARRIER_CHANGES.name] > changes_down
        # Down and up again between two polls: the agent never sees it down, the kernel's counters do.
        _ip("link", "set", "dev", veth, "down")
        _ip("link", "set", "dev", veth, "up")
        wait_for(lambda: _operstate(veth) == "up", timeout=10, what="operstate up again")
        assert _values(source, LINK_FLAPS) == 2.0
    finally:
        asyncio.run(source.close())


def test_isolate_link_takes_the_port_down_and_back(veth: str):
    port = PortSpec(veth, "eth", isolatable=True)
    action = isolate_link(port, up=False)
    assert action.argv[1:] == ("link", "set", "dev", veth, "down")
    assert read_link_state(port) == "down"
    isolate_link(port, up=True)
    wait_for(lambda: read_link_state(port) == "up", timeout=10, what="link back up")


def test_port_not_isolatable_is_refused(veth: str):
    with pytest.raises(LinkControlError, match="not marked isolatable"):
        isolate_link(PortSpec(veth, "eth", isolatable=False), up=False)
    assert read_link_state(PortSpec(veth)) == "up"
    assert read_link_state(PortSpec("snnone0")) == "absent"
