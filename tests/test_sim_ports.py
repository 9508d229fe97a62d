"""Loopback ports for the peers the tests start, and an etcd cluster whose port another process took.

CI once failed because an etcd member exited at start-up: its port, picked from the ephemeral range, could be
taken by any outgoing connection before etcd bound it. These tests pin the two halves of the fix.
"""

from __future__ import annotations

import socket
from pathlib import Path

from sim import ports
from tests.etcd import EtcdCluster
from tests.helpers import require_binary


def test_ports_come_from_below_the_ephemeral_range_and_are_never_handed_out_twice():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    given = [ports.free_port() for _ in range(200)] + [ports.free_port(socket.SOCK_DGRAM) for _ in range(50)]
    tcp, udp = given[:200], given[200:]
    assert all(p < low for p in given), [p for p in given if p >= low]
    assert len(set(tcp)) == len(tcp) and len(set(udp)) == len(udp)
    with socket.socket() as s:  # what it hands out is bindable by the caller
        s.bind(("127.0.0.1", tcp[-1]))


def test_a_port_in_use_is_not_handed_out():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert taken not in {ports.free_port() for _ in range(200)}


def test_an_etcd_member_whose_port_was_taken_gets_the_cluster_restarted_on_fresh_ports(tmp_path):
    cluster = EtcdCluster(tmp_path, 3, binary=require_binary("etcd"), memory=True)
    first_log = cluster.members[0].dir / "etcd.log"
    clash = cluster.members[0].client_port
    with socket.socket() as squatter:  # another process owns m1's client port when etcd starts
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", clash))
        squatter.listen()
        cluster.start()
        try:
            assert cluster.members[0].client_port != clash
            assert cluster.healthy()
            assert "address already in use" in first_log.read_text().lower()
        finally:
            cluster.stop()
    assert not any(m.running() for m in cluster.members)
