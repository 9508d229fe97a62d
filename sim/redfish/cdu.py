"""A Redfish CDU controller shaped like DMTF's `public-cooling-unit` mockup, showing the rack model's coolant loop.

DMTF's mockup is served as DMTF wrote it (mockups/public-cooling-unit, BSD-3),
with the values bindings/public-cooling-unit.yaml names read live from the
rack model: the same loop the simulated Modbus CDU shows, so a pump failure
or a flow drop injected once appears on both protocols. Pump status follows
the model (a failed pump is `UnavailableOffline`/Critical with DMTF's
PumpFailed condition, and raises PumpFailed/PumpRestored events);
`Pump.SetMode` really stops or starts a pump. Its two leak detectors (the
cabinet's Moisture sensor and the reservoir's Overflow float switch, each shown
under both Chassis/CDU/LeakDetectors and the CDU's LeakDetection) read
`CoolantState.cdu_leaks` (leaks.py): the `tray-leak` faults name them with
`--node rfcdu1`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from sim.rack import RackModel
from sim.redfish.events import condition
from sim.redfish.leaks import LeakDetectors, detectors_at, worst
from sim.redfish.pki import SimCA
from sim.redfish.service import Credentials, RedfishService, redfish_error

CDU = "/redfish/v1/ThermalEquipment/CDUs/1"
PUMPS = f"{CDU}/Pumps"
CHASSIS_LEAK_DETECTORS = "/redfish/v1/Chassis/CDU/LeakDetectors"


class RedfishCdu(RedfishService):
    kind = "redfish-cdu"
    manager = "/redfish/v1/Managers/CDU"
    layers = [("public-cooling-unit", None), ("services", None), ("cdu-additions", None)]
    binding_files = ("services", "public-cooling-unit")

    def __init__(self, model: RackModel, name: str, credentials: Credentials, ca: SimCA, **kw: Any):
        super().__init__(name, model, credentials, ca, **kw)
        self.pumps = [m["@odata.id"].rsplit("/", 1)[1] for m in self.tree.resources[PUMPS]["Members"]]
        for pump in self.pumps:
            self.actions[f"{PUMPS}/{pump}/Actions/Pump.SetMode"] = self._set_mode(pump)
        with model.lock:
            self._seen = self._running()

    def _running(self) -> list[bool]:
        return list(self.model.coolant.pump_running)

    def _pump_status(self, pump: str) -> dict[str, Any]:
        c = self.model.coolant
        if c.pump_running[int(pump) - 1]:  # a pump short of its set speed (a worn one) runs, with a warning
            return {"State": "Enabled", "Health": "OK" if c.pump_wear[int(pump) - 1] >= 1 else "Warning"}
        return {"State": "UnavailableOffline", "Health": "Critical",
                "Conditions": [condition("Environmental.1.1.PumpFailed", f"{PUMPS}/{pump}", pump)]}

    def _reservoir_health(self, _: str = "") -> str:
        level = self.model.coolant.reservoir_level
        return "Critical" if level < 0.15 else "Warning" if level < 0.3 else "OK"

    def _health(self, _: str = "") -> str:
        healths = [self._pump_status(p)["Health"] for p in self.pumps] + [self._reservoir_health()]
        return worst(healths + [self._leaks().health()])

    def leak_detectors(self) -> LeakDetectors:
        return detectors_at(self, CHASSIS_LEAK_DETECTORS, lambda: self.model.coolant.cdu_leaks)

    def _status(self, _: str = "") -> dict[str, Any]:
        conditions = [c for p in self.pumps for c in self._pump_status(p).get("Conditions", ())]
        health = self._health()
        return {"State": "Enabled", "Health": health, "HealthRollup": health, "Conditions": conditions}

    def add_terms(self) -> None:
        self.terms.update({"pump_status": self._pump_status, "reservoir_health": self._reservoir_health,
                           "cdu_health": self._health, "cdu_status": self._status})

    def update(self, model: RackModel) -> None:
        super().update(model)
        running = self._running()
        for i, (now, before) in enumerate(zip(running, self._seen)):
            if now != before:
                pump = str(i + 1)
                self.events.publish("Environmental.1.1.PumpRestored" if now else "Environmental.1.1.PumpFailed",
                                    f"{PUMPS}/{pump}", pump)
        self._seen = running

    def _set_mode(self, pump: str):
        async def handler(request: web.Request, body: dict[str, Any]) -> web.Response:
            mode = body.get("Mode")
            if mode not in ("Enabled", "Disabled"):
                return redfish_error(400, "ActionParameterValueNotInList", f"The value '{mode}' for the parameter Mode "
                                     "in the action Pump.SetMode is not in the list of acceptable values (Enabled, "
                                     "Disabled).")
            with self.model.lock:
                self.model.coolant.pump_running[int(pump) - 1] = mode == "Enabled"
                self.update(self.model)
            return web.Response(status=204, headers={"OData-Version": "4.0"})
        return handler
