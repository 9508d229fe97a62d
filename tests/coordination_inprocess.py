"""Rack coordinators (the production EtcdCoordinator) in this test process, on a real etcd: no agent daemons.

For the rules of the etcd backend that need no device (guardrail transactions, the election, validation of
what is read back): three coordinators start in a second, against the test's own key prefix.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

from agent.config import parse_config
from agent.coordination.etcd_rack import EtcdCoordinator
from agent.snapshot import SnapshotStore
from tests.helpers import await_for

NODES = ["n1", "n2", "n3"]
RACK = "r1"


def coordinator(tmp_path: Path, etcd: Any, node: str, prefix: str, nodes: list[str] = NODES,
                **guardrails: Any) -> EtcdCoordinator:
    cfg = {"agent": {"rack": RACK, "node": node, "state_dir": str(tmp_path / node)},
           "inventory": {"nodes": nodes},
           "remediation": {"guardrails": guardrails},
           "coordination": {"backend": "etcd", "etcd": {"endpoints": etcd.endpoints, "prefix": prefix}}}
    return EtcdCoordinator(parse_config(etcd.authorize(cfg, tmp_path / node)))  # the node's own etcd user


async def start(coords: list[EtcdCoordinator]) -> list[EtcdCoordinator]:
    for c in coords:
        await c.start(types.SimpleNamespace(store=SnapshotStore(), scheduler=types.SimpleNamespace(poll_now=None)))
    await await_for(lambda: all(c.up() for c in coords), 30, what=f"{len(coords)} coordinators up")
    return coords


async def rack(tmp_path: Path, etcd: Any, prefix: str, **guardrails: Any) -> list[EtcdCoordinator]:
    return await start([coordinator(tmp_path, etcd, n, prefix, **guardrails) for n in NODES])


async def stop(coords: list[EtcdCoordinator]) -> None:
    for c in coords:
        await c.stop()
