"""The BMC of one simulated NVLink switch tray (GB200 NVL72: 9 of them, 2 NVSwitch chips each).

Its resources are mockups/gb200-switch-tray over DMTF's session, account and
event services, bound by bindings/gb200-switch-tray.yaml: `Chassis_0` with two
moisture detectors (the chips' cold plates, the tray's manifold), temperature
Sensors (one per NVSwitch chip, the coolant inlet) and a power sensor. The
detectors read `SwitchTrayState.leaks` in the rack model (set by the
`switch-tray-leak` fault); the chassis' health rolls up the detectors'. The
chip temperatures follow the secondary loop's supply, so a hot supply heats
the switches as it does the GPUs. There is no ComputerSystem: no agent runs
on a switch tray and nothing powers it off.
"""

from __future__ import annotations

import uuid
from typing import Any

from sim.rack import RackModel
from sim.redfish.leaks import LeakDetectors, detectors_at
from sim.redfish.pki import SimCA
from sim.redfish.service import Credentials, RedfishService

CHASSIS = "/redfish/v1/Chassis/Chassis_0"
LEAK_DETECTORS = f"{CHASSIS}/ThermalSubsystem/LeakDetection/LeakDetectors"
CHIP_ABOVE_SUPPLY_C = 30.0  # an NVSwitch chip at load, over the coolant it sits on


class SwitchTrayBmc(RedfishService):
    kind = "redfish-switch"
    manager = "/redfish/v1/Managers/BMC_0"
    layers = [("public-cooling-unit", ("SessionService", "AccountService", "EventService")), ("services", None),
              ("gb200-switch-tray", None)]
    binding_files = ("services", "gb200-switch-tray")

    def __init__(self, model: RackModel, tray: str, credentials: Credentials, ca: SimCA, **kw: Any):
        self.tray = tray
        super().__init__(f"bmc-{tray}", model, credentials, ca, **kw)

    def leak_detectors(self) -> LeakDetectors:
        return detectors_at(self, LEAK_DETECTORS, lambda: self.model.switch_trays[self.tray].leaks)

    def add_terms(self) -> None:
        tray = self.tray
        ident = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.model.rack}.{tray}.supernode-agent.sim"))
        self.terms.update({
            "switch_uuid": lambda a: ident,
            "switch_serial": lambda a: f"SIM{self.model.rack.upper()}{tray.upper()}",
            "inlet_c": lambda a: round(self.model.coolant.secondary_supply_c, 1),
            "chip_c": lambda a: round(self.model.coolant.secondary_supply_c + CHIP_ABOVE_SUPPLY_C, 1),
            "bmc_hostname": lambda a: f"{tray}-bmc",
            "bmc_fqdn": lambda a: f"{tray}-bmc.{self.model.rack}.sim",
        })
