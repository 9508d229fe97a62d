"""The BMC of one simulated compute tray, shaped like a GB200 NVL72 tray's: `Chassis_0` with four moisture detectors.

Its resources are mockups/gb200-tray (the tray) over DMTF's session, account
and event services (mockups/public-cooling-unit), bound by
bindings/gb200-tray.yaml. The detectors read the tray's own leak state in the
rack model (`NodeState.tray_leaks`, set by the `tray-leak` and
`tray-leak-sensor-fault` faults): Critical or Warning for a leak, and for a
broken sensor a null `DetectorState` with `Status.Health` Warning and a
Condition naming the fault (what DMTF's LeakDetector schema asks for). Every
change raises an event at once (Environmental LeakDetected*, ResourceEvent
ResourceErrors*). `ComputerSystem.Reset` really switches the tray: ForceOff
stops its GPUs drawing power in the model, and every reset is recorded in
`NodeState.power_actions` for the tests to see.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from agent.sim.rack import RackModel
from agent.sim.redfish.events import condition
from agent.sim.redfish.service import Credentials, RedfishService, redfish_error
from agent.sim.redfish.pki import SimCA

CHASSIS = "/redfish/v1/Chassis/Chassis_0"
LEAK_DETECTORS = f"{CHASSIS}/ThermalSubsystem/LeakDetection/LeakDetectors"
SYSTEM = "/redfish/v1/Systems/System_0"
RESET = f"{SYSTEM}/Actions/ComputerSystem.Reset"
RESET_TYPES = {"On": True, "ForceOff": False, "GracefulShutdown": False, "ForceRestart": True, "PowerCycle": True}
LEAK_LEVELS = {"critical": "Critical", "warning": "Warning"}
SEVERITY = {"OK": 0, "Warning": 1, "Critical": 2}
LEAK_MESSAGES = {"Critical": "Environmental.1.1.LeakDetectedCritical", "Warning": "Environmental.1.1.LeakDetectedWarning",
                 "OK": "Environmental.1.1.LeakDetectedNormal"}
SENSOR_FAULT = "sensor_fault"


class TrayBmc(RedfishService):
    kind = "redfish-bmc"
    layers = [("public-cooling-unit", ("SessionService", "AccountService", "EventService")), ("gb200-tray", None)]
    binding_files = ("services", "gb200-tray")

    def __init__(self, model: RackModel, node: str, credentials: Credentials, ca: SimCA, **kw: Any):
        self.node = node
        super().__init__(f"bmc-{node}", model, credentials, ca, **kw)
        members = self.tree.resources[LEAK_DETECTORS]["Members"]
        self.detectors = [m["@odata.id"].rsplit("/", 1)[1] for m in members]
        self.actions[RESET] = self._reset
        with model.lock:
            self._seen = {d: self._leak(d) for d in self.detectors}
            self._seen_on = model.nodes[node].host_on

    # -- what the tray shows -----------------------------------------------------------

    def _leak(self, detector: str) -> str:
        """'dry', 'critical', 'warning' or 'sensor_fault' for one detector, from the rack model."""
        return self.model.nodes[self.node].tray_leaks.get(detector, "dry")

    def _detector_state(self, detector: str) -> str | None:
        leak = self._leak(detector)
        return None if leak == SENSOR_FAULT else LEAK_LEVELS.get(leak, "OK")

    def _detector_status(self, detector: str) -> dict[str, Any]:
        leak = self._leak(detector)
        if leak == SENSOR_FAULT:
            return {"State": "Enabled", "Health": "Warning",
                    "Conditions": [condition("ResourceEvent.1.3.ResourceErrorsDetected", f"{LEAK_DETECTORS}/{detector}",
                                             "DetectorState", "SensorFailure")]}
        return {"State": "Enabled", "Health": LEAK_LEVELS.get(leak, "OK")}

    def _health(self, _: str = "") -> str:
        """The worst detector health: the rollup LeakDetection, ThermalSubsystem and the chassis show."""
        worst = max((self._detector_status(d)["Health"] for d in self.detectors), key=SEVERITY.__getitem__, default="OK")
        return worst

    def add_terms(self) -> None:
        node = self.node
        ident = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.model.rack}.{node}.supernode-agent.sim"))
        self.terms.update({
            "detector_state": self._detector_state,
            "detector_status": self._detector_status,
            "leak_health": self._health,
            "power_state": lambda a: "On" if self.model.nodes[node].host_on else "Off",
            "node_power_w": lambda a: round(self.model.node_power_w(node), 1),
            "node_uuid": lambda a: ident,
            "node_serial": lambda a: f"SIM{self.model.rack.upper()}{node.upper()}",
            "node_name": lambda a: node,
        })

    # -- events ----------------------------------------------------------------------------

    def update(self, model: RackModel) -> None:
        for d in self.detectors:
            now, before = self._leak(d), self._seen[d]
            if now == before:
                continue
            self._seen[d] = now
            origin = f"{LEAK_DETECTORS}/{d}"
            if before == SENSOR_FAULT:
                self.events.publish("ResourceEvent.1.3.ResourceErrorsCorrected", origin, "DetectorState", "SensorFailure")
            if now == SENSOR_FAULT:
                self.events.publish("ResourceEvent.1.3.ResourceErrorsDetected", origin, "DetectorState", "SensorFailure")
            else:
                self.events.publish(LEAK_MESSAGES[LEAK_LEVELS.get(now, "OK")], origin, d)
        on = model.nodes[self.node].host_on
        if on != self._seen_on:
            self._seen_on = on
            self.events.publish("ResourceEvent.1.3.ResourcePoweredOn" if on else "ResourceEvent.1.3.ResourcePoweredOff",
                                SYSTEM, "System_0", event_type="StatusChange")

    # -- actions ---------------------------------------------------------------------------

    async def _reset(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        reset_type = body.get("ResetType")
        if reset_type is None:
            return redfish_error(400, "ActionParameterMissing", "The action ComputerSystem.Reset requires the "
                                 "parameter ResetType to be present in the request body.")
        if reset_type not in RESET_TYPES:
            return redfish_error(400, "ActionParameterValueNotInList", f"The value '{reset_type}' for the parameter "
                                 f"ResetType in the action ComputerSystem.Reset is not in the list of acceptable values "
                                 f"({', '.join(RESET_TYPES)}).")
        with self.model.lock:
            self.model.set_host_power(self.node, RESET_TYPES[reset_type], reset_type, time.time())
            self.update(self.model)
        return web.Response(status=204, headers={"OData-Version": "4.0"})
