"""Shared pieces of the remediation tests: config objects, snapshots, a loopback NVML twin server."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from agent.config import Identity, Inventory
from agent.remediation.engine import Executors, RemediationEngine
from agent.remediation.settings import RemediationSettings
from agent.snapshot import Snapshot
from exporters.model import Quality, Reading, counter, gauge

from tests.helpers import free_port

SPECS = {
    "supernode_leak_detected": gauge("supernode_leak_detected", "1 wet.", ["zone", "sensor"]),
    "supernode_cdu_flow_cubic_meters_per_second": gauge("supernode_cdu_flow_cubic_meters_per_second", "Flow (m3/s).",
                                                        ["cdu", "loop"]),
    "supernode_gpu_xid_errors_total": counter("supernode_gpu_xid_errors_total", "XIDs.", ["gpu", "uuid", "xid", "action"]),
    "supernode_gpu_temperature_celsius": gauge("supernode_gpu_temperature_celsius", "Temp (C).", ["gpu", "uuid", "sensor"]),
    "supernode_gpu_temperature_threshold_celsius": gauge("supernode_gpu_temperature_threshold_celsius", "Thr (C).",
                                                         ["gpu", "uuid", "threshold"]),
    "supernode_rack_power_watts": gauge("supernode_rack_power_watts", "W."),
    "supernode_rack_power_budget_watts": gauge("supernode_rack_power_budget_watts", "W."),
}


def reading(metric: str, value: float, ts: float | None = None, quality: Quality = Quality.OK, **labels: str) -> Reading:
    return Reading(SPECS[metric], value, labels, quality, ts if ts is not None else time.time())


def snap(*readings: Reading, at: float | None = None) -> Snapshot:
    return Snapshot(at if at is not None else time.time(), tuple(readings), ())


def identity(mode: str = "enforce", node: str = "node01") -> Identity:
    return Identity(rack="r01", node=node, mode=mode)


def inventory(nodes=("node01", "node02"), gpus: int = 4, valve: str | None = None, **kw: Any) -> Inventory:
    return Inventory(nodes=list(nodes), gpus={"count": gpus},
                     leak_zones=[{"name": "zone-a", "nodes": list(nodes), "valve": valve}], **kw)


def settings(**guard: Any) -> RemediationSettings:
    # These engines test other guardrails: a resume after a GPU fault needs no health check here
    # (the resume policy itself is tested in test_judgement.py, with it required).
    data: dict[str, Any] = {"guardrails": {"cooldown_seconds": 0, "retry_backoff_seconds": 0.01,
                                           "automatic": ["resume_after_check"], **guard}}
    return RemediationSettings.model_validate(data)


def engine(tmp_path, mode: str = "enforce", executors: Executors | None = None, inv: Inventory | None = None,
           **guard: Any) -> RemediationEngine:
    return RemediationEngine(settings(**guard), mode, identity(mode), inv or inventory(), tmp_path / "journal.db",
                             executors or Executors())


async def nvml_twin_server(model) -> tuple[web.AppRunner, str]:
    """The simulator's NVML routes on a loopback port (the twin's real HTTP peer)."""
    from sim.nvml_api import add_nvml_routes
    app = web.Application()
    add_nvml_routes(app, model)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def results(eng: RemediationEngine, **match: str) -> list:
    return [e for e in eng.journal.entries() if all(getattr(e, k) == v for k, v in match.items())]
