"""The leak detectors of a simulated Redfish service, read from the rack model, with the events their changes raise.

A detector's state lives in the rack model (a tray's `NodeState.tray_leaks`,
the CDU's `CoolantState.cdu_leaks`: detector Id -> "critical", "warning" or
"sensor_fault"; absent is dry), set by the `tray-leak` and
`tray-leak-sensor-fault` faults. Redfish shows a leak as `DetectorState`
Critical or Warning, and a broken sensor (a short, a cut cable) as DMTF's
LeakDetector schema asks: `DetectorState` null (unknown; OCP's profile wants the
property present) in the detector, absent from LeakDetection's excerpt of it
(DMTF's Tacklebox cannot print a null there), `Status.Health` Warning and a
Condition naming the fault. A client reads null and absent alike: not known. Every change raises an event at
once: Environmental LeakDetectedCritical/Warning/Normal, or ResourceEvent
ResourceErrorsDetected/Corrected for the sensor.
"""

from __future__ import annotations

from typing import Any, Callable

from sim.redfish.events import EventBus, condition
from sim.redfish.tree import OMIT

LEVELS = {"critical": "Critical", "warning": "Warning"}
SEVERITY = {"OK": 0, "Warning": 1, "Critical": 2}
LEAK_MESSAGES = {"Critical": "Environmental.1.1.LeakDetectedCritical", "Warning": "Environmental.1.1.LeakDetectedWarning",
                 "OK": "Environmental.1.1.LeakDetectedNormal"}
SENSOR_FAULT = "sensor_fault"
SENSOR_ERRORS = ("DetectorState", "SensorFailure")  # ResourceErrors* MessageArgs: the property, the error type


def detectors_at(service: Any, collection: str, states: Callable[[], dict[str, str]]) -> "LeakDetectors":
    """The detectors a service lists in its `collection` (a LeakDetectors URI), reading `states` from the model."""
    members = service.tree.resources[collection]["Members"]
    uris = {m["@odata.id"].rsplit("/", 1)[1]: m["@odata.id"] for m in members}
    return LeakDetectors(service.events, states, uris)


def worst(healths: list[str]) -> str:
    return max(healths, key=SEVERITY.__getitem__, default="OK")


class LeakDetectors:
    """Detector Id -> its URI; `states()` is the model's dict for this service (read under the model's lock)."""

    def __init__(self, events: EventBus, states: Callable[[], dict[str, str]], uris: dict[str, str]):
        self.events = events
        self.states = states
        self.uris = uris
        self.ids = list(uris)
        self._seen = {d: self.leak(d) for d in self.ids}

    def leak(self, detector: str) -> str:
        """'dry', 'critical', 'warning' or 'sensor_fault'."""
        return self.states().get(detector, "dry")

    def state(self, detector: str) -> str | None:
        """OK, Warning or Critical; None (null: unknown) while the sensor is broken."""
        leak = self.leak(detector)
        return None if leak == SENSOR_FAULT else LEVELS.get(leak, "OK")

    def excerpt_state(self, detector: str) -> Any:
        """The state in LeakDetection's excerpt of the detector: absent (OMIT) rather than null while broken."""
        state = self.state(detector)
        return OMIT if state is None else state

    def status(self, detector: str) -> dict[str, Any]:
        leak = self.leak(detector)
        if leak == SENSOR_FAULT:
            return {"State": "Enabled", "Health": "Warning",
                    "Conditions": [condition("ResourceEvent.1.3.ResourceErrorsDetected", self.uris[detector],
                                             *SENSOR_ERRORS)]}
        return {"State": "Enabled", "Health": LEVELS.get(leak, "OK")}

    def health(self, _: str = "") -> str:
        """The worst detector's health: what LeakDetection and the resources above it roll up."""
        return worst([self.status(d)["Health"] for d in self.ids])

    def terms(self) -> dict[str, Callable[[str], Any]]:
        return {"detector_state": self.state, "detector_excerpt_state": self.excerpt_state,
                "detector_status": self.status, "leak_health": self.health}

    def resolve(self, detector: str) -> str:
        """A detector by Id or by position (0-based), as the fault parameters name it; ValueError names the choices."""
        if detector.isdigit():
            if not 0 <= int(detector) < len(self.ids):
                raise ValueError(f"detector: {detector} out of range 0..{len(self.ids) - 1}")
            return self.ids[int(detector)]
        if detector not in self.ids:
            raise ValueError(f"detector: {detector!r} is not one of {', '.join(self.ids)}")
        return detector

    def update(self) -> None:
        """Raise an event for each detector whose state changed since the last call (under the model's lock)."""
        for d in self.ids:
            now, before = self.leak(d), self._seen[d]
            if now == before:
                continue
            self._seen[d] = now
            origin = self.uris[d]
            if before == SENSOR_FAULT:
                self.events.publish("ResourceEvent.1.3.ResourceErrorsCorrected", origin, *SENSOR_ERRORS)
            if now == SENSOR_FAULT:
                self.events.publish("ResourceEvent.1.3.ResourceErrorsDetected", origin, *SENSOR_ERRORS)
            else:
                self.events.publish(LEAK_MESSAGES[LEVELS.get(now, "OK")], origin, d)
