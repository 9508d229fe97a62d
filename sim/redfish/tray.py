"""The BMC of one simulated compute tray, shaped like a GB200 NVL72 tray's: `Chassis_0` with four moisture detectors
and its coolant connector (the tray's flow, supply and return: ThermalSubsystem/CoolantConnectors/TrayInlet).

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

from sim.rack import PG25_DENSITY, PG25_HEAT_CAPACITY, RackModel
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
        self.terms.update(self._coolant_terms())

    def _coolant_terms(self) -> dict[str, Any]:
        """The tray's coolant connector (its manifold quick-disconnects): the flow the rack model gives the tray
        (a blocked tray passes less at the same CDU pressure), the loop's supply temperature, and the return the
        tray's own GPU heat makes at that flow (return = supply + P / (flow * rho * cp))."""
        m, node = self.model, self.node

        def supply(_: Any) -> float:
            return round(m.coolant.secondary_supply_c, 2)

        def rise(_: Any) -> float:
            flow_m3s = m.tray_flow_lpm(node) / 60000.0
            heat = sum(g.power_w for g in m.nodes[node].gpus if not g.lost)
            return round(min(heat / (flow_m3s * PG25_DENSITY * PG25_HEAT_CAPACITY), 40.0) if flow_m3s > 1e-9 else 40.0, 2)

        return {"tray_flow_lpm": lambda a: round(m.tray_flow_lpm(node), 3),
                "tray_rated_flow_lpm": lambda a: round(m.coolant.nominal_flow_lpm / max(len(m.nodes), 1), 3),
                "tray_supply_c": supply, "tray_delta_c": rise,
                "tray_return_c": lambda a: round(supply(a) + rise(a), 2)}

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
