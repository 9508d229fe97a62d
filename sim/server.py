"""The simulator process: the rack model, its clock, its devices and the fault-injection API.

It runs apart from the agents (as real devices would), on 127.0.0.1 only.
It writes a discovery file so `supernode-sim inject` finds it without
being told the URL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from sim import faults
from sim.devices import SimDevice
from sim.nvml_faults import clear_gpu_faults
from sim.rack import FILTER_CLEAN_DP_PA, RackModel

log = logging.getLogger("supernode.sim")


def discovery_file() -> Path:
    """Where a running simulator advertises its URL (overridable for tests and parallel demos)."""
    env = os.environ.get("SUPERNODE_SIM_FILE")
    return Path(env) if env else Path(tempfile.gettempdir()) / "supernode-agent-sim.json"


class Simulator:
    def __init__(self, nodes: int = 2, gpus: int = 4, nvlinks: int = 18, tick: float = 0.1, port: int = 0,
                 rack: str = "r01", leak_zones: dict[str, list[str]] | None = None, devices: bool = True,
                 workdir: Path | None = None, advertise: bool = True, personality: str = "h100",
                 redfish_session_timeout: float = 1800.0, cdu_protocol: str = "modbus"):
        if leak_zones is None:
            # One leak zone per node (a tray's cold-plate manifold): a leak endangers that node only.
            leak_zones = {f"zone-{chr(ord('a') + i)}": [f"node{i + 1:02d}"] for i in range(nodes)}
        self.model = RackModel(rack=rack, nodes=nodes, gpus_per_node=gpus, nvlinks=nvlinks, leak_zones=leak_zones,
                               personality=personality)
        self.tick = tick
        self.port = port
        self.with_devices = devices
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="supernode-sim-"))
        self.advertise = advertise
        self.redfish_session_timeout = redfish_session_timeout  # idle seconds before a Redfish session expires
        from sim.device_set import check_cdu_protocol

        self.cdu_protocol = check_cdu_protocol(cdu_protocol)  # what the rack CDU cdu1 speaks (sim/device_set.py)
        self.devices: dict[str, SimDevice] = {}
        self.active_faults: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None
        self._tick_task: asyncio.Task | None = None
        self._writing: asyncio.Future | None = None  # the tick's file writes, in a worker thread
        self.url = ""

    # -- devices -------------------------------------------------------------------

    def _build_devices(self) -> list[SimDevice]:
        """Every simulated device, each on a free loopback port (added as the device modules exist)."""
        from sim.device_set import build_devices

        return build_devices(self)

    def endpoints(self) -> dict[str, Any]:
        """What an agent config needs to reach each device (name -> host/port or paths)."""
        out: dict[str, Any] = {}
        for name, dev in self.devices.items():
            endpoint = getattr(dev, "endpoint", None)
            describe = getattr(dev, "describe", None)
            if callable(describe):  # a device that says more than its address (Redfish: URL, CA, credentials)
                out[name] = describe()
            elif endpoint:
                out[name] = {"endpoint": f"{endpoint[0]}:{endpoint[1]}"}
            else:  # a file tree (simulated sysfs) rather than a network device
                out[name] = {"root": str(getattr(dev, "root", ""))}
        return out

    # -- HTTP API ------------------------------------------------------------------

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024)
        app.router.add_get("/api/v1/state", self._state)
        app.router.add_get("/api/v1/faults", self._faults)
        app.router.add_post("/api/v1/inject", self._inject)
        app.router.add_post("/api/v1/clear", self._clear)
        try:
            from sim.nvml_api import add_nvml_routes
        except ImportError:
            log.warning("NVML twin routes unavailable")
        else:
            add_nvml_routes(app, self.model)
        return app

    async def _state(self, _: web.Request) -> web.Response:
        return web.json_response(self.state())

    def state(self) -> dict[str, Any]:
        m = self.model
        with m.lock:
            c = m.coolant
            return {
                "rack": m.rack,
                "time": m.time,
                "rack_power_w": m.rack_power_w(),
                "coolant": {"supply_c": c.secondary_supply_c, "return_c": c.secondary_return_c,
                            "flow_lpm": c.flow_lpm, "leak_zones": dict(c.leak_zones),
                            "valve_open": dict(c.valve_open)},
                "nodes": {n.name: {"power_w": n.power_w, "host_power": "On" if n.host_on else "Off",
                                   "boot_id": n.boot_id, "boot_time": n.boot_time, "boots": n.boots,
                                   "power_actions": list(n.power_actions), "tray_leaks": dict(n.tray_leaks),
                                   "gpus": [{"index": g.index, "uuid": g.uuid, "power_w": round(g.power_w, 1),
                                             "limit_w": g.power_limit_mw / 1000, "temp_c": round(g.temp_c, 1),
                                             "lost": g.lost, "xid_faults": [dict(f) for f in g.xid_faults],
                                             "last_xid": dict(g.last_xid) if g.last_xid else None}
                                            for g in n.gpus]}
                          for n in m.nodes.values()},
                "switch_trays": {t.name: {"chips": list(t.chips), "zone": t.zone, "leaks": dict(t.leaks)}
                                 for t in m.switch_trays.values()},
                "faults": list(self.active_faults),
                "devices": self.endpoints(),
                "redfish": self.redfish(),
            }

    def redfish(self) -> dict[str, Any]:
        """The Redfish services in one place: each tray BMC by node, the CDUs, the CA file and the account."""
        from sim.redfish.service import RedfishService
        from sim.redfish.switch_tray import SwitchTrayBmc
        from sim.redfish.tray import TrayBmc

        services = [d for d in self.devices.values() if isinstance(d, RedfishService)]
        if not services:
            return {}
        first = services[0].describe()
        trays = self.model.switch_trays
        return {"ca_file": first["ca_file"], "username": first["username"], "password_file": first["password_file"],
                "bmcs": {d.node: d.url for d in services if isinstance(d, TrayBmc)},
                "switches": {d.tray: {"bmc": d.name, "url": d.url, "chips": list(trays[d.tray].chips),
                                      "zone": trays[d.tray].zone}
                             for d in services if isinstance(d, SwitchTrayBmc)},
                "cdus": {d.name: d.url for d in services if not isinstance(d, (TrayBmc, SwitchTrayBmc))}}

    async def _faults(self, _: web.Request) -> web.Response:
        return web.json_response({k: {"help": f.help, "params": [{"name": p.name, "type": p.type.__name__,
                                                                   "required": p.required, "help": p.help}
                                                                  for p in f.params]}
                                  for k, f in sorted(faults.REGISTRY.items())})

    async def _inject(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": "body: expected JSON {kind, params}"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("kind"), str):
            return web.json_response({"error": "kind: expected a fault kind name"}, status=400)
        params = body.get("params") or {}
        if not isinstance(params, dict):
            return web.json_response({"error": "params: expected an object"}, status=400)
        try:
            result = self.inject(body["kind"], params)
        except faults.FaultError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"injected": body["kind"], "result": result})

    async def _clear(self, _: web.Request) -> web.Response:
        self.clear()
        return web.json_response({"cleared": True})

    def inject(self, kind: str, params: dict[str, Any]) -> str:
        fk = faults.REGISTRY.get(kind)
        if fk is None:
            raise faults.FaultError(f"kind: unknown fault {kind!r}; known: {', '.join(sorted(faults.REGISTRY))}")
        parsed = fk.parse(params)
        result = fk.apply(self, parsed)
        self._update_devices()  # a sensor's register flips when the fault happens, not at the next tick
        self.active_faults.append({"kind": kind, "params": parsed, "at": time.time()})
        log.info("fault injected", extra={"kind": kind, "result": result})
        return result

    def clear(self) -> None:
        """Back to nominal: a fresh model state for faults, keeping time, energy and counters."""
        m = self.model
        with m.lock:
            clear_gpu_faults(m)
            for node in m.nodes.values():
                node.powered = True
                node.host_on = True
                node.tray_leaks.clear()
                for g in node.gpus:
                    g.workload = 0.85
            for tray in m.switch_trays.values():
                tray.leaks.clear()
            c = m.coolant
            c.flow_factor = 1.0
            c.supply_hot_extra_c = 0.0
            c.pump_running = [True] * len(c.pump_running)
            c.pump_wear = [1.0] * len(c.pump_wear)
            c.filter_clog_rate_pa_s = 0.0
            c.filter_dp_pa = FILTER_CLEAN_DP_PA
            for z in c.leak_zones:
                c.leak_zones[z] = "dry"
            c.cdu_leaks.clear()
            faults.clear_plates_and_tray_flow(m)
        for dev in self.devices.values():
            clear = getattr(dev, "clear_faults", None) or getattr(dev, "clear", None)
            if callable(clear):
                clear()
        self.active_faults.clear()
        self._update_devices()
        log.info("faults cleared")

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> str:
        if self.with_devices:
            for dev in self._build_devices():
                await dev.start()
                self.devices[dev.name] = dev
        self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{self.port}"
        self._update_devices()
        self._tick_task = asyncio.create_task(self._ticker())
        if self.advertise:
            tmp = discovery_file().with_suffix(".tmp")
            tmp.write_text(json.dumps({"url": self.url, "pid": os.getpid()}))
            tmp.replace(discovery_file())
        log.info("simulator started", extra={"url": self.url, "nodes": len(self.model.nodes)})
        return self.url

    def _update_devices(self, write_files: bool = True) -> None:
        """Every device follows the model; `write_files=False`: a device that writes files (a node's link tree)
        only advances its state, and `_write_files` writes it."""
        with self.model.lock:
            for dev in self.devices.values():
                if write_files or not hasattr(dev, "write_files"):
                    dev.update(self.model)
                else:
                    dev.update(self.model, write=False)

    def _write_files(self) -> None:
        for dev in list(self.devices.values()):
            write = getattr(dev, "write_files", None)
            if write is not None:
                write()

    async def _ticker(self) -> None:
        # The link trees' files (some 50 a node, each written and renamed) are written in a worker thread: on
        # this loop they held every simulated device's answer ~7 ms a node every tick, so a Modbus read of the
        # leak controller could wait 20-60 ms behind them and the agent's leak latency measured the simulator.
        last = time.monotonic()
        while True:
            await asyncio.sleep(self.tick)
            now = time.monotonic()
            self.model.step(now - last)
            last = now
            self._update_devices(write_files=False)
            self._writing = asyncio.ensure_future(asyncio.to_thread(self._write_files))
            await asyncio.shield(self._writing)

    async def stop(self) -> None:
        if self._tick_task:
            self._tick_task.cancel()
        if self._writing is not None:  # a tree is removed below: never while its files are being written
            await asyncio.gather(self._writing, return_exceptions=True)
        for dev in self.devices.values():
            try:
                await dev.stop()
            except Exception:
                log.exception("device stop failed", extra={"device": dev.name})
        if self._runner:
            await self._runner.cleanup()
        if self.advertise:
            try:
                data = json.loads(discovery_file().read_text())
                if data.get("url") == self.url:
                    discovery_file().unlink()
            except (OSError, ValueError):
                pass


def find_simulator(explicit: str | None = None) -> str:
    """The URL of the running simulator: explicit, else $SUPERNODE_SIM_URL, else the discovery file."""
    if explicit:
        return explicit.rstrip("/")
    env = os.environ.get("SUPERNODE_SIM_URL")
    if env:
        return env.rstrip("/")
    path = discovery_file()
    try:
        return json.loads(path.read_text())["url"]
    except (OSError, ValueError, KeyError):
        raise LookupError(f"no running simulator found ({path} missing); start `supernode-sim demo` "
                          "or pass --sim URL") from None
