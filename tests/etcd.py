"""Tests use the same private etcd cluster the demo starts (sim/etcd_cluster.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from sim.etcd_cluster import EtcdCluster, EtcdMember  # noqa: F401
from tests.helpers import require_binary


def running_etcd(base: Path, members: int = 3, **options: Any) -> Iterator[EtcdCluster]:
    """An etcd cluster for a module's tests (`yield from` it in a fixture); a missing etcd fails (or skips).

    Its data lives on tmpfs: the suite shares a disk with other work, and etcd's WAL fsyncs there would
    time the tests, not etcd. It runs with TLS and auth (EtcdCluster); `options` go to EtcdCluster."""
    c = EtcdCluster(base, members, binary=require_binary("etcd"), memory=True, **options).start()
    try:
        yield c
    finally:
        c.stop()
