"""Hooks the remediation engine into a running agent: executors from the inventory, routes, metrics.

The engine never imports collectors; this module is where the agent hands
it device functions (NVML, Slurm, links, Modbus, SNMP) built from the same
inventory the collectors use.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from agent.remediation.api import add_remediation_routes
from agent.remediation.engine import Executors, RemediationEngine

if TYPE_CHECKING:
    from agent.config import LoadedConfig
    from agent.daemon import Agent

log = logging.getLogger("supernode.remediation")


def _scheduler(loaded: "LoadedConfig") -> Any:
    from agent.remediation.actions.slurm import SimulatedScheduler, SlurmScheduler

    s = loaded.config.remediation.slurm
    if not s.enabled:
        return None
    if s.backend == "simulated":
        return SimulatedScheduler(loaded.config.inventory.nodes or [loaded.config.agent.node])
    return SlurmScheduler(s.scontrol, s.sinfo, s.slurm_conf, s.timeout_seconds)


def _gpu_lib(loaded: "LoadedConfig") -> Any:
    if not loaded.config.sources.nvml.enabled:
        return None
    from agent.sources import nvml_library

    lib = nvml_library(loaded)
    try:
        lib.nvmlInit()
    except Exception as exc:  # no driver: GPU actions are then blocked as not_configured
        log.warning("NVML unavailable for remediation", extra={"error": repr(exc)})
        return None
    return lib


def build_executors(loaded: "LoadedConfig") -> Executors:
    cfg = loaded.config
    ex = Executors(scheduler=_scheduler(loaded))
    lib = _gpu_lib(loaded)
    if lib is not None:
        ex.gpu_libs = {cfg.agent.node: lib}
    ports = {p.name: p for p in cfg.inventory.ports}
    if ports:
        from exporters.link_control import isolate_link, read_link_state

        root = cfg.sources.sysfs_root
        ex.link_isolate = lambda port, up: isolate_link(ports[port], up, sysfs_root=root)

        def link_read(port: str) -> str:
            # The simulator applies an isolation on its next tick: wait for the state to settle.
            import time

            deadline = time.monotonic() + 2.0
            state = read_link_state(ports[port], root)
            while state not in ("up", "down") and time.monotonic() < deadline:
                time.sleep(0.05)
                state = read_link_state(ports[port], root)
            return state

        ex.link_read = link_read
    cdus = {d.name: d for d in cfg.inventory.cdus}
    if cdus:
        from exporters.modbus import read_control_point, write_control_point

        ex.cdu_write = lambda cdu, point, value: write_control_point(cdus[cdu], point, float(value))
        ex.cdu_read = lambda cdu, point: read_control_point(cdus[cdu], point)
    if cfg.inventory.pdus:
        from agent.sources import _pdus

        controls = {s.source.device: s.source for s in _pdus(loaded)}

        async def pdu_set(pdu: str, outlet: str, on: bool) -> bool:
            return await controls[pdu].set_outlet(outlet, on)

        async def pdu_get(pdu: str, outlet: str) -> bool:
            return await controls[pdu].outlet_on(outlet)

        ex.pdu_set, ex.pdu_get = pdu_set, pdu_get
    return ex


def _token(loaded: "LoadedConfig", configured: str | None, default: str) -> Any:
    name = configured or default
    return loaded.secrets.get(name)


def build_engine(loaded: "LoadedConfig") -> RemediationEngine:
    """The engine an agent runs for this config: its executors, journal in state_dir (not started)."""
    cfg = loaded.config
    return RemediationEngine(cfg.remediation, cfg.agent.mode, cfg.agent, cfg.inventory,
                             cfg.agent.state_dir / "journal.db", build_executors(loaded))


def attach(agent: "Agent") -> None:
    loaded = agent.loaded
    cfg = loaded.config
    engine = build_engine(loaded)
    agent.remediation = RemediationHook(engine)
    agent.store.add_listener(engine.on_snapshot)
    engine.repoll = agent.scheduler.poll_now
    agent.extra_collectors.append(engine.collector())
    admin = _token(loaded, cfg.remediation.admin_token_secret, "admin_token")
    webhook = _token(loaded, cfg.remediation.webhook_token_secret, "webhook_token")
    agent.route_mounts.append(lambda app: add_remediation_routes(app, engine, admin, webhook,
                                                                 cfg.listen.max_body_bytes))


class RemediationHook:
    """What the daemon calls: start before the sources (journal reconciliation first), stop, reload."""

    def __init__(self, engine: RemediationEngine):
        self.engine = engine

    @property
    def mode(self) -> str:
        return self.engine.mode

    async def start(self) -> None:
        await self.engine.start()

    async def stop(self) -> None:
        await asyncio.wait_for(self.engine.stop(), 3.0)

    def reconfigure(self, loaded: "LoadedConfig") -> None:
        """A reload may change the mode (observe -> enforce); other remediation settings need a restart."""
        new_mode = loaded.config.agent.mode
        if new_mode != self.engine.mode:
            log.info("remediation mode changed", extra={"from": self.engine.mode, "to": new_mode})
            self.engine.mode = new_mode
            self.engine.journal.append("engine", result="mode_changed", detail={"mode": new_mode})
