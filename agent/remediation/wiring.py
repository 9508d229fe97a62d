"""Hooks the remediation engine into a running agent: executors from the inventory, routes, metrics.

The engine never imports collectors; this module is where the agent hands
it device functions (NVML, Slurm, links, Modbus, SNMP) built from the same
inventory the collectors use.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from agent.context import AgentContext
from agent.remediation.api import add_remediation_routes
from agent.reliability import ComponentCollector, ObservedTime, component_counts
from agent.remediation.detectors import Detectors
from agent.remediation.engine import Executors, RemediationEngine

if TYPE_CHECKING:
    from agent.config import LoadedConfig

log = logging.getLogger("supernode.remediation")


def _scheduler(loaded: "LoadedConfig") -> Any:
    from agent.remediation.actions.slurm import SlurmScheduler

    s = loaded.config.remediation.slurm
    if not s.enabled:
        return None
    if s.backend == "simulated":
        from agent.backends import SCHEDULER_SIMULATED, load_backend

        simulated = load_backend(SCHEDULER_SIMULATED, "remediation.slurm.backend")
        return simulated(loaded.config.inventory.nodes or [loaded.config.agent.node])
    return SlurmScheduler(s.scontrol, s.sinfo, s.slurm_conf, s.timeout_seconds, scancel=s.scancel, squeue=s.squeue)


def _gpu_lib(loaded: "LoadedConfig") -> Any:
    if not loaded.config.sources.nvml.enabled:
        return None
    from agent.sources import nvml_library

    from exporters.gpu.nvml_control import InitOnFirstUse

    # Never nvmlInit here: this runs on the event loop at start and on reload, and a wedged driver would stop
    # /metrics and the watchdog. The init runs on its own thread; GPU actions wait for it on theirs, bounded.
    return InitOnFirstUse(nvml_library(loaded), loaded.config.sources.nvml.timeout)


def _fence(rack: Any, what: str) -> Any:
    """The leader's proof before a shared actuator write (agent.coordination); a refusal is a `fenced` block."""
    from agent.coordination.etcd_rack import Fenced
    from agent.remediation.actions import ActionError
    from agent.remediation.step_runner import UNFENCED

    async def check() -> None:
        if UNFENCED.get():  # a person approved this queued step while coordination was lost
            return
        try:
            await rack.fence(what)
        except Fenced as exc:
            raise ActionError(f"fenced: {exc}", guardrail="fenced") from None

    unfenced = UNFENCED.get()  # read on the loop: the write's thread does not carry the task's context

    def last_check() -> None:
        if unfenced:
            return
        try:
            rack.fence_now()
        except Fenced as exc:
            raise ActionError(f"fenced: {exc}", guardrail="fenced") from None
    return check, last_check


def build_executors(loaded: "LoadedConfig", rack: Any = None) -> Executors:
    """Device functions from the inventory; with `rack`, every shared actuator write (zone valves, outlets)
    first proves this agent leads the rack (a txn on the leader key's revision, then the lease deadline
    right before the write itself), so a deposed leader's late write never reaches the device."""
    cfg = loaded.config
    ex = Executors(scheduler=_scheduler(loaded))
    lib = _gpu_lib(loaded)
    if lib is not None:
        ex.gpu_libs = {cfg.agent.node: lib}
    ports = {p.name: p for p in cfg.inventory.ports}
    if ports:
        from exporters.links.link_control import isolate_link, read_link_state

        root = cfg.sources.sysfs_root
        lc = cfg.remediation.link_control
        ex.link_isolate = lambda port, up: isolate_link(ports[port], up, timeout=lc.timeout_seconds, ip=lc.ip,
                                                        ibportstate=lc.ibportstate)

        def link_read(port: str) -> str:
            # A port's state follows `ip link set`/`ibportstate` with a lag (IB training, some NICs):
            # read back until it is definite or settle_seconds pass.
            import time

            deadline = time.monotonic() + lc.settle_seconds
            state = read_link_state(ports[port], root)
            while state not in ("up", "down") and time.monotonic() < deadline:
                time.sleep(0.05)
                state = read_link_state(ports[port], root)
            return state

        ex.link_read = link_read
    cdus = {d.name: d for d in cfg.inventory.cdus}
    if cdus:
        from exporters.cooling import modbus_control

        def control(cdu: str) -> Any:  # the CDU's protocol's control points (Modbus registers, BACnet objects)
            if cdus[cdu].protocol == "bacnet":
                from exporters.cooling.bacnet import control as bacnet_control

                return bacnet_control
            return modbus_control

        ex.cdu_write = lambda cdu, point, value: control(cdu).write_control_point(cdus[cdu], point, float(value))
        ex.cdu_read = lambda cdu, point: control(cdu).read_control_point(cdus[cdu], point)
        if rack is not None and rack.shared:
            plain_write = ex.cdu_write

            async def fenced_cdu_write(cdu: str, point: str, value: Any) -> Any:
                check, last_check = _fence(rack, f"cdu_write {cdu}:{point}")
                await check()

                last_check()  # the lease still proven alive: no await of ours between this and the write
                return await plain_write(cdu, point, value)
            ex.cdu_write = fenced_cdu_write
    if cfg.inventory.pdus:
        from agent.sources import pdu_sources

        controls = {s.source.device: s.source for s in pdu_sources(loaded)}

        async def pdu_set(pdu: str, outlet: str, on: bool) -> bool:
            if rack is not None and rack.shared:
                check, last_check = _fence(rack, f"pdu_outlet {pdu}:{outlet}")
                await check()
                last_check()
            return await controls[pdu].set_outlet(outlet, on)

        async def pdu_get(pdu: str, outlet: str) -> bool:
            return await controls[pdu].outlet_on(outlet)

        ex.pdu_set, ex.pdu_get = pdu_set, pdu_get
    # This node's own tray only: a leak powers off the tray that leaks, from that tray's own agent.
    trays = {e.name: e for e in cfg.inventory.redfish if e.kind == "tray" and e.node == cfg.agent.node}
    if trays:
        ex.tray_power_set, ex.tray_power_get = _tray_power(loaded, trays)
    return ex


def _tray_power(loaded: "LoadedConfig", trays: dict[str, Any]) -> tuple[Any, Any]:
    """Power set/get of this node's tray(s) over Redfish: a client of one connection per call (actions are rare,
    and nothing stays open between them), so the poller's bound of connections is exceeded by one at most."""
    from agent.sources import redfish_client
    from exporters.redfish.control import TrayPower

    async def run(bmc: str, fn: Any) -> Any:
        ep = trays[bmc]
        power = TrayPower(redfish_client(loaded, ep, max_connections=1), ep.profile,
                          settle_s=loaded.config.remediation.device_timeout_seconds / 2)
        try:
            return await fn(power)
        finally:
            await power.close()

    async def tray_set(bmc: str, on: bool) -> None:
        await run(bmc, lambda p: p.set(on))

    async def tray_get(bmc: str) -> bool:
        return bool(await run(bmc, lambda p: p.is_on()))

    return tray_set, tray_get


def _token(loaded: "LoadedConfig", configured: str | None, default: str) -> Any:
    name = configured or default
    return loaded.secrets.get(name)


def build_engine(loaded: "LoadedConfig", coordination: Any = None) -> RemediationEngine:
    """The engine an agent runs for this config: its executors, journal in state_dir (not started)."""
    cfg = loaded.config
    rack = coordination.rack if coordination is not None else None
    engine = RemediationEngine(cfg.remediation, cfg.agent.mode, cfg.agent, cfg.inventory,
                               cfg.agent.state_dir / "journal.db", build_executors(loaded, rack))
    if rack is not None:
        engine.use_rack(rack)
    planner = getattr(engine.actions.get("gpu_power_cap"), "margins", None)
    if planner is not None:  # the derate by margin plans across the loop's trays from their shared summaries
        planner.share = getattr(coordination, "links", None)
    return engine


def attach(agent: AgentContext) -> None:
    """Run remediation in this agent: one engine at a time behind a hook, so a reload can swap it."""
    coordination = getattr(agent, "coordination", None)
    # A confirmation re-read asked for while the source is mid-poll (a timed poll, an event's) runs right after
    # that poll instead of being dropped: else the second wet reading waits a whole interval.
    hook = RemediationHook(agent.loaded, build_engine(agent.loaded, coordination),
                           lambda job_id: agent.scheduler.poll_now(job_id, queue=True))
    hook.coordination = coordination
    agent.remediation = hook
    # only publishes the detectors read (every engine has the same table): the PDU's outlets run none
    agent.store.add_listener(hook.on_snapshot, Detectors.families())
    agent.extra_collectors.append(_CurrentCollector(hook))
    agent.extra_collectors.append(ComponentCollector(hook.observed))
    cfg = agent.loaded.config
    agent.route_mounts.append(lambda app: add_remediation_routes(
        app, _CurrentEngine(hook), hook.admin_tokens, hook.webhook_token, cfg.listen.max_body_bytes,
        open_reads=lambda: hook.loaded.config.auth.open_reads))
    from agent.drill.api import add_drill_routes
    from agent.drill.runner import DrillRunner

    # the fault drill feeds the store and watches this hook's engine; a zone's drill reaches the zone's other
    # agents through the rack's coordination (agent/drill/rack.py)
    drill = DrillRunner(agent.store, hook, coordination)
    hook.drill = drill  # the status page's banner and report (agent/status/)
    agent.route_mounts.append(lambda app: add_drill_routes(app, drill, hook.admin_tokens))


class _CurrentEngine:
    """Forwards to whichever engine the hook runs now, so the HTTP routes survive a reload."""

    def __init__(self, hook: "RemediationHook"):
        self._hook = hook

    def __getattr__(self, name: str) -> Any:
        return getattr(self._hook.engine, name)


class _CurrentCollector(Collector):
    """The remediation metrics of whichever engine runs now."""

    def __init__(self, hook: "RemediationHook"):
        self._hook = hook

    def collect(self) -> Iterator[Metric]:
        return self._hook.engine.collector().collect()


class RemediationHook:
    """What the daemon calls: start before the sources (journal reconciliation first), stop, reload.

    A reload builds a whole new engine from the new config (`prepare`, which may refuse), then
    stops the old one and starts the new one on the same journal (`swap`): exactly what a restart
    does, so an action cut off by the swap is reconciled like one cut off by a crash, and no
    setting (thresholds, guardrails, playbooks, executors, tokens) needs a restart to apply.
    """

    def __init__(self, loaded: "LoadedConfig", engine: RemediationEngine, repoll: Any):
        self.loaded = loaded
        self.engine = engine
        self.repoll = repoll
        engine.repoll = repoll
        # component-time watched (MTBF's numerator), carried across reloads that change the inventory
        self.observed = ObservedTime(component_counts(loaded.config.inventory))
        self.drill: Any = None  # the fault drill's runner (agent/drill/runner.py), set by attach()

    @property
    def mode(self) -> str:
        return self.engine.mode

    def on_snapshot(self, snap: Any, origin: str) -> None:
        self.engine.on_snapshot(snap, origin)

    def admin_tokens(self) -> Any:
        """Name -> admin token of the config running now (auth.admin_tokens and the legacy secret)."""
        return self.loaded.admin_tokens

    def webhook_token(self) -> Any:
        return _token(self.loaded, self.loaded.config.remediation.webhook_token_secret, "webhook_token")

    degraded: str | None = None  # why remediation is not running (observation goes on without it)
    coordination: Any = None  # the agent's rack coordinator (engines of later reloads use it too)

    async def start(self) -> None:
        """Start the engine; a failure (journal unopenable, a device call) degrades remediation, never the agent."""
        try:
            await self.engine.start()
        except Exception as exc:
            self.degraded = f"remediation not started: {type(exc).__name__}: {exc}"
            log.error("remediation not started; observation continues", extra={"error": self.degraded},
                      exc_info=exc)
        else:
            self.degraded = None

    async def stop(self, close_journal: bool = True) -> None:
        async with asyncio.timeout(3.0):
            await self.engine.stop(close_journal)

    def prepare(self, loaded: "LoadedConfig") -> tuple["LoadedConfig", RemediationEngine]:
        """The engine for a new config, built but not started (raises if the config cannot run)."""
        return loaded, build_engine(loaded, self.coordination)

    async def swap(self, prepared: tuple["LoadedConfig", RemediationEngine]) -> None:
        loaded, engine = prepared
        old = self.engine
        engine.repoll = self.repoll
        same_journal = self.degraded is None and engine.journal.path == old.journal.path
        await self.stop(close_journal=not same_journal)
        if same_journal:
            engine.adopt_journal(old.journal)  # one writer per file; rows still queued carry over
        self.loaded, self.engine = loaded, engine
        self.observed.update(component_counts(loaded.config.inventory))
        await self.start()
        if engine.mode != old.mode:
            log.info("remediation mode changed", extra={"from": old.mode, "to": engine.mode})
