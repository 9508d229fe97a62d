"""The BMC of one simulated compute tray, shaped like a GB200 NVL72 tray's: `Chassis_0` with four moisture detectors.

Its resources are mockups/gb200-tray (the tray) over DMTF's session, account
and event services (mockups/public-cooling-unit), bound by
bindings/gb200-tray.yaml. The detectors read the tray's own leak state in the
rack model (`NodeState.tray_leaks`, see leaks.py), apart from the CDU's leak
zones: a tray's moisture sensor and the facility's rope are different
sensors. `ComputerSystem.Reset` really switches the tray: ForceOff stops its
GPUs drawing power in the model, every reset is recorded in
`NodeState.power_actions` for the tests to see, and a power change raises a
ResourceEvent (ResourcePoweredOff/On).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from sim.rack import RackModel
from sim.redfish.leaks import LeakDetectors, detectors_at
from sim.redfish.pki import SimCA
from sim.redfish.service import Credentials, RedfishService, redfish_error

CHASSIS = "/redfish/v1/Chassis/Chassis_0"
LEAK_DETECTORS = f"{CHASSIS}/ThermalSubsystem/LeakDetection/LeakDetectors"
SYSTEM = "/redfish/v1/Systems/System_0"
RESET = f"{SYSTEM}/Actions/ComputerSystem.Reset"
# ResetType -> the host is on afterwards (a restart or power cycle ends on)
RESET_TYPES = {"On": True, "ForceOff": False, "GracefulShutdown": False, "ForceRestart": True, "PowerCycle": True}


class TrayBmc(RedfishService):
    kind = "redfish-bmc"
    manager = "/redfish/v1/Managers/BMC_0"
    layers = [("public-cooling-unit", ("SessionService", "AccountService", "EventService")), ("services", None),
              ("gb200-tray", None)]
    binding_files = ("services", "gb200-tray")

    def __init__(self, model: RackModel, node: str, credentials: Credentials, ca: SimCA, **kw: Any):
        self.node = node
        super().__init__(f"bmc-{node}", model, credentials, ca, **kw)
        self.actions[RESET] = self._reset
        with model.lock:
            self._seen_on = model.nodes[node].host_on

    def leak_detectors(self) -> LeakDetectors:
        return detectors_at(self, LEAK_DETECTORS, lambda: self.model.nodes[self.node].tray_leaks)

    def add_terms(self) -> None:
        node = self.node
        ident = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.model.rack}.{node}.supernode-agent.sim"))
        self.terms.update({
            "power_state": lambda a: "On" if self.model.nodes[node].host_on else "Off",
            "node_power_w": lambda a: round(self.model.node_power_w(node), 1),
            "node_uuid": lambda a: ident,
            "node_serial": lambda a: f"SIM{self.model.rack.upper()}{node.upper()}",
            "node_name": lambda a: node,
            "bmc_hostname": lambda a: f"{node}-bmc",
            "bmc_fqdn": lambda a: f"{node}-bmc.{self.model.rack}.sim",
        })

    def update(self, model: RackModel) -> None:
        super().update(model)
        on = model.nodes[self.node].host_on
        if on != self._seen_on:
            self._seen_on = on
            self.events.publish("ResourceEvent.1.3.ResourcePoweredOn" if on else "ResourceEvent.1.3.ResourcePoweredOff",
                                SYSTEM, "System_0", event_type="StatusChange")

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
