"""The daemon: wires config, sources, snapshot, HTTP and remediation; owns signals and shutdown.

Reload (SIGHUP or POST /-/reload) is all-or-nothing: the new file is
validated and its sources built before anything running is touched, so a
bad file leaves the running config exactly as it was.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from pathlib import Path
from typing import Any, Callable

from agent import __version__
from agent.config import ConfigError, LoadedConfig, load_config
from agent.coordination import CoordinationCollector, build_coordinator
from agent.exposition import build_registry, inventory_readings, render_metrics
from agent.self_metrics import ReloadStats, self_collectors
from agent.series_budget import SeriesBudget
from agent.http import RouteMount, build_app, start_server
from agent.memory import return_free_heap, trim_heap_forever
from agent.runtime import ScheduledSource, SourceScheduler
from agent.sdnotify import Notifier
from agent.snapshot import SnapshotStore
from agent.sources import build_sources
from exporters.model import gauge

log = logging.getLogger("supernode.agent")

SourceFactory = Callable[..., list[ScheduledSource]]


class Agent:
    def __init__(self, loaded: LoadedConfig, source_factory: SourceFactory = build_sources,
                 notifier: Notifier | None = None):
        self.loaded = loaded
        self.source_factory = source_factory
        self.store = SnapshotStore()
        self.scheduler = SourceScheduler(self.store)
        self.notifier = notifier or Notifier()
        self.route_mounts: list[RouteMount] = []
        self.extra_collectors: list[Any] = []
        self.remediation: Any = None
        self.status_hub: Any = None  # the status page's stream (agent.status.http), once the listener runs
        self.port: int | None = None
        self._runner = None
        self._stop = asyncio.Event()
        self._reload_lock = asyncio.Lock()
        self._watchdog_task: asyncio.Task | None = None
        self._trim_task: asyncio.Task | None = None
        self._remediation_error: str | None = None
        # A state_dir that cannot exist is a configuration error (exit 2, named); anything that goes
        # wrong inside remediation after that only degrades remediation.
        loaded.config.agent.state_dir.mkdir(parents=True, exist_ok=True)
        self.coordination = build_coordinator(loaded)  # before remediation: the engine asks it who leads
        self._setup_remediation()
        from agent import redfish_events

        self.route_mounts.append(redfish_events.mount(self))
        self.series_budget = SeriesBudget()  # kept across reloads: a link shown once stays shown
        self.reloads = ReloadStats()
        self.registry = build_registry(self.store, self.identity,
                                       [*self.extra_collectors, RemediationHealth(self.remediation_degraded),
                                        CoordinationCollector(self.coordination), *self_collectors(self.reloads)],
                                       self.coordination.hidden)

    # -- identity and state ------------------------------------------------------

    def identity(self) -> dict[str, str]:
        a = self.loaded.config.agent
        mode = a.mode
        if self.remediation is not None and hasattr(self.remediation, "mode"):
            mode = self.remediation.mode
        return {"rack": a.rack, "node": a.node, "role": a.role, "version": __version__, "mode": mode}

    def _with_derived(self, loaded: LoadedConfig, sources: list[ScheduledSource]) -> list[ScheduledSource]:
        """Add the derived sources: rack power (sums the PDUs' inlets), the leak watch (unknown leak zones)."""
        from agent.derived import derived_sources

        return sources + derived_sources(self.store, loaded, sources, self.coordination.idle)

    def render_metrics(self) -> bytes:
        """What /metrics serves: memory only, never a device."""
        detail = self.loaded.config.metrics.detail
        return render_metrics(self.registry, self.store, inventory_readings(self.loaded.config.inventory),
                              self.coordination.hidden(), lambda rs: self.series_budget.apply(rs, detail))

    def rack_power_w(self) -> float | None:
        """The rack power the PDUs reported last (None until they have): feeds the CDU's flow per kW."""
        return self.store.snapshot().value("supernode_rack_power_watts")

    def sources_not_polled(self) -> list[str]:
        """Sources without a first poll; a shared one that coordination gates (another agent may poll it) never
        holds readiness back."""
        return [job_id for job_id, r in self.scheduler.runners.items() if r.polls == 0 and r.gate is None]

    def state_dict(self) -> dict[str, Any]:
        snap = self.store.snapshot()
        readings = [r.as_dict() for r in snap.readings]
        return {
            "agent": self.identity(),
            "taken_at": snap.taken_at,
            "sources": [s.as_dict(snap.taken_at) for s in self.store.states()],
            "readings": readings,
            "config": self.loaded.config.dump(),
        }

    # -- remediation hook-up -------------------------------------------------------

    def _setup_remediation(self) -> None:
        """Attach remediation; any failure leaves observation running and is said (log, /readyz, metric)."""
        try:
            from agent.remediation.wiring import attach
            attach(self)
        except Exception as exc:
            self.remediation = None
            self._remediation_error = f"remediation not attached: {type(exc).__name__}: {exc}"
            log.error("remediation unavailable; observation continues", extra={"error": self._remediation_error},
                      exc_info=exc)

    def remediation_degraded(self) -> str | None:
        """Why remediation is not running, or None when it is (reported by /readyz and a metric)."""
        if self.remediation is None:
            return self._remediation_error
        return getattr(self.remediation, "degraded", None)

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        if self.remediation is not None and hasattr(self.remediation, "start"):
            try:
                await self.remediation.start()  # journal reconciliation runs before any source
            except Exception as exc:  # the hook degrades itself; anything else must not stop observation
                self.remediation, self._remediation_error = None, f"remediation start failed: {exc!r}"
                log.error("remediation unavailable; observation continues", extra={"error": self._remediation_error})
        sources = self._with_derived(self.loaded, self.source_factory(self.loaded, self.rack_power_w))
        self.scheduler.start()
        await self.scheduler.replace(sources, self.loaded.config.sources.stale_after_intervals)
        self.coordination.gate_runners(self.scheduler.runners)  # before any poll runs: the loop has not yielded
        await self.coordination.start(self)
        self._runner, self.port = await start_server(build_app(self), self.loaded.config.listen)
        log.info("agent started", extra={"listen": f"{self.loaded.config.listen.address}:{self.port}",
                                         "sources": len(sources), "mode": self.identity()["mode"],
                                         "node": self.loaded.config.agent.node})
        _settle_gc()
        self._trim_task = asyncio.create_task(trim_heap_forever())
        self.notifier.ready()
        if self.notifier.watchdog_interval:
            self._watchdog_task = asyncio.create_task(self._watchdog(self.notifier.watchdog_interval))

    async def _watchdog(self, every: float) -> None:
        # Pinged from the event loop itself: a wedged loop stops the pings and systemd restarts us.
        while True:
            self.notifier.watchdog()
            await asyncio.sleep(every)

    async def reload(self) -> tuple[bool, str]:
        """Load the file again and swap everything, or nothing; counted in supernode_config_reload_total."""
        async with self._reload_lock:
            ok, why = await self._reload()
            self.reloads.record(ok)
            return ok, why

    async def _reload(self) -> tuple[bool, str]:
        path = self.loaded.path
        if path is None:
            return False, "config was not loaded from a file"
        try:
            # Parsed on a worker thread: whatever the file holds, /metrics and the watchdog keep answering.
            new = await asyncio.to_thread(load_config, path)
            if new.config.coordination != self.loaded.config.coordination:
                raise ConfigError("coordination: a change of this section needs a restart (the agent's rack "
                                  "membership, leadership and poller slots are held under the running one)")
            sources = self._with_derived(new, self.source_factory(new, self.rack_power_w))
            # Remediation is built too before anything running changes: a playbook that does not
            # load refuses the whole reload.
            # (on a thread: building it calls nvmlInit, which a wedged driver can hold for long)
            prepared = await asyncio.to_thread(self.remediation.prepare, new) if self.remediation else None
        except ConfigError as exc:
            log.error("reload refused, keeping running config", extra={"error": str(exc)})
            return False, str(exc)
        except Exception as exc:
            log.error("reload refused, keeping running config", extra={"error": repr(exc)})
            return False, f"{type(exc).__name__}: {exc}"
        self.loaded = new
        await self.scheduler.replace(sources, new.config.sources.stale_after_intervals)
        self.coordination.gate_runners(self.scheduler.runners)
        if self.remediation is not None:
            await self.remediation.swap(prepared)
        gc.unfreeze()  # what the old config left in cycles can be collected now, then the new one is kept
        _settle_gc()
        log.info("config reloaded", extra={"path": str(path), "sources": len(sources)})
        return True, "reloaded"

    def request_stop(self) -> None:
        self._stop.set()

    async def stop(self) -> None:
        self.notifier.stopping()
        if self._watchdog_task:
            self._watchdog_task.cancel()
        if self._trim_task:
            self._trim_task.cancel()
        await self.scheduler.shutdown()
        if self.remediation is not None and hasattr(self.remediation, "stop"):
            async with asyncio.timeout(3.0):
                await self.remediation.stop()
        try:
            async with asyncio.timeout(1.5):  # hands leadership and slots over at once
                await self.coordination.stop()
        except asyncio.TimeoutError:
            log.warning("coordination stop took too long")
        if self._runner is not None:
            await self._runner.cleanup()
        log.info("agent stopped")

    async def run_until_stopped(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        loop.add_signal_handler(signal.SIGINT, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        if os.environ.get("SUPERNODE_CPU_PROFILE"):  # bench_overhead's profile of one window (agent.cpu_profile)
            from agent.cpu_profile import install

            install(loop)
        await self.start()
        await self._stop.wait()
        try:
            async with asyncio.timeout(4.5):  # systemd's stop must never hit its timeout
                await self.stop()
        except asyncio.TimeoutError:
            log.error("clean stop took too long; exiting anyway")


def _settle_gc() -> None:
    """Keep what start-up built (modules, config, profiles, the app) out of the cyclic collector's work.

    The agent allocates thousands of short-lived readings a second; each of the
    collector's passes over the old generation also walked every object of the
    start-up, which never becomes garbage. A larger first threshold lets most
    readings die by reference count before a pass sees them.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    return_free_heap()  # what start-up (or the old config) freed goes back to the kernel


REMEDIATION_DEGRADED = gauge("supernode_remediation_degraded",
                             "1 while remediation is not running (see /readyz for why); observation continues.")


class RemediationHealth:
    """`supernode_remediation_degraded`: 1 while remediation is not running (the agent still observes)."""

    def __init__(self, reason: Callable[[], str | None]):
        self.reason = reason

    def describe(self) -> list:
        return []

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        yield GaugeMetricFamily(REMEDIATION_DEGRADED.name, REMEDIATION_DEGRADED.help, value=1 if self.reason() else 0)


def _loop_factory(kind: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """agent.event_loop: None (asyncio's own loop) or uvloop's."""
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


def run(config_path: Path) -> int:
    loaded = load_config(config_path)
    for warning in loaded.warnings:
        log.warning("config warning", extra={"warning": warning})
    try:
        agent = Agent(loaded)
    except OSError as exc:  # the journal's state_dir, a device file: say which, not a traceback
        raise ConfigError(f"cannot start: {exc.strerror or exc}: {exc.filename or ''} "
                          f"(agent.state_dir is {loaded.config.agent.state_dir})") from None
    try:
        with asyncio.Runner(loop_factory=_loop_factory(loaded.config.agent.event_loop)) as runner:
            runner.run(agent.run_until_stopped())
    except OSError as exc:  # the listen address taken or not ours
        listen = loaded.config.listen
        raise ConfigError(f"cannot start: {exc.strerror or exc} "
                          f"(listen.address {listen.address}, listen.port {listen.port})") from None
    return 0
