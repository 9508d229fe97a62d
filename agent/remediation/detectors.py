"""Local detectors: read a Snapshot, emit fire/clear events with hysteresis and hold times.

Why apart from action: a detector only says "this condition holds for these
targets"; incidents and playbooks decide what to do. Each detector gives a
tri-state per target: True (set threshold met), False (clear threshold met)
or None (between the two: keep the current state), and a `Tracker`
(hysteresis.py) turns that into fire/clear events using the hold times. A
reading whose quality is not ok never satisfies a condition: it feeds a
sensor-fault observation instead (detectors_base.py).

This module is the table: which detector reads which families and the
evaluation of a snapshot. The detectors themselves are defined by domain,
one module each: detectors_cooling (leaks by scope, coolant), detectors_gpu (GPUs,
NVLink), detectors_gpu_health (PCIe link, clock slowdown, stragglers),
detectors_optics (links), detectors_power (rack power, outlets), detectors_cold_plate (cold plates, tray flow).
"""

from __future__ import annotations

from typing import Iterator

from agent.snapshot import Snapshot

from .cdu_view import REDFISH_FAMILIES
from .detectors_base import Context
from .detectors_cold_plate import ColdPlateDetectors
from .detectors_cooling import CoolingDetectors
from .detectors_gpu import GpuDetectors
from .detectors_gpu_health import GpuHealthDetectors
from .detectors_loop import LoopHealthDetectors
from .detectors_optics import OpticDetectors
from .detectors_power import PowerDetectors
from .hysteresis import Event, Observation

__all__ = ["Context", "Detectors", "Event", "Observation"]


class Detectors(CoolingDetectors, LoopHealthDetectors, GpuDetectors, GpuHealthDetectors, OpticDetectors,
                PowerDetectors, ColdPlateDetectors):
    """The default detector table of PLAYBOOKS.md, evaluated on every snapshot."""

    # -- entry point -------------------------------------------------------------

    # The one severity each detector's incidents carry (a test checks this against every Observation the
    # detectors build): the remediation families start at zero for that severity only, not for both (a
    # (detector, severity) series that can never leave zero is noise in the series budget, issue 38).
    SEVERITY: dict[str, str] = {
        **dict.fromkeys(("leak", "leak_tray", "leak_loop", "leak_source_down", "tray_leak_rack", "coolant_flow_low",
                         "coolant_supply_hot",
                         "gpu_lost", "gpu_fabric_degraded", "gpu_reset_required", "gpu_reboot_required",
                         "gpu_service_required", "nvlink_errors"), "critical"),
        **dict.fromkeys(("sensor_fault", "leak_sensor_fault", "condensation_risk", "coolant_service_due",
                         "filter_clogging", "pump_redundancy_lost", "reservoir_low", "cold_plate_degraded",
                         "tray_flow_low", "gpu_app_fault", "gpu_clock_slowdown", "gpu_pcie_degraded", "gpu_straggler",
                         "gpu_thermal", "nvlink_switch_fault", "optic_degraded", "pdu_outlet_off",
                         "rack_power_over_budget"), "warning"),
    }

    # The metric families each detector reads (a test checks this against what they really select): a
    # publish by one source runs only the detectors it feeds, not all of them on every leak poll.
    INPUTS: dict[str, frozenset[str]] = {
        "_leak": frozenset({"supernode_leak_detected", "supernode_leak_sensor_fault"}),
        "_coolant": frozenset({"supernode_cdu_flow_cubic_meters_per_second", "supernode_cdu_temperature_celsius",
                               "supernode_cdu_dew_point_margin_celsius", "supernode_cdu_pump_speed_setpoint_ratio",
                               "supernode_cdu_pump_running", "supernode_cdu_alarm_active",
                               "supernode_cdu_pump_speed_ratio", "supernode_cdu_pressure_pascals",
                               # the incident's evidence for the derate (loop_evidence): the rack's draw, its budget
                               "supernode_rack_power_watts", "supernode_rack_power_budget_watts"}) | REDFISH_FAMILIES,
        "_pump_health": frozenset({"supernode_cdu_pump_running", "supernode_cdu_pump_speed_ratio",
                                   "supernode_cdu_pump_speed_setpoint_ratio", "supernode_coolant_pump_speed_ratio",
                                   "supernode_coolant_pump_speed_setpoint_ratio", "supernode_redfish_health",
                                   "supernode_redfish_service_info"}),
        "_filter": frozenset({"supernode_cdu_pressure_pascals"}),
        "_reservoir": frozenset({"supernode_cdu_reservoir_level_ratio", "supernode_coolant_reservoir_level_ratio",
                                 "supernode_redfish_health", "supernode_redfish_service_info"}),
        "_service_hours": frozenset({"supernode_coolant_service_seconds", "supernode_coolant_rated_service_seconds"}),
        "_gpu_thermal": frozenset({"supernode_gpu_temperature_celsius", "supernode_gpu_temperature_threshold_celsius",
                                   "supernode_gpu_clock_event_active"}),
        "_gpu_faults": frozenset({"supernode_gpu_xid_errors_total", "supernode_gpu_recovery_action",
                                  "supernode_gpu_remapped_rows_pending", "supernode_gpu_remapped_rows_failure",
                                  "supernode_gpu_up", "supernode_gpu_hung", "supernode_gpu_info"}),
        "_gpu_lost": frozenset({"supernode_gpu_up", "supernode_gpu_hung"}),
        "_gpu_pcie": frozenset({"supernode_gpu_pcie_link_width", "supernode_gpu_pcie_link_generation",
                                "supernode_gpu_utilization_ratio"}),
        "_gpu_clock_slowdown": frozenset({"supernode_gpu_clock_event_active"}),
        "_gpu_straggler": frozenset({"supernode_gpu_clock_hertz", "supernode_gpu_power_watts",
                                     "supernode_gpu_utilization_ratio", "supernode_gpu_clock_event_active",
                                     "supernode_gpu_pcie_link_width", "supernode_gpu_pcie_link_generation",
                                     "supernode_gpu_rack_median_sm_clock_hertz"}),
        "_nvlink": frozenset({"supernode_nvlink_errors_total", "supernode_nvlink_up", "supernode_nvlink_bit_error_rate",
                              "supernode_nvlink_switch_fault"}),
        "_nvlink_switch": frozenset({"supernode_nvlink_switch_fault"}),
        "_gpu_fabric": frozenset({"supernode_gpu_fabric_state", "supernode_gpu_fabric_status_code",
                                  "supernode_gpu_fabric_health"}),
        "_optic": frozenset({"supernode_link_errors_total", "supernode_link_flaps_total",
                             "supernode_optic_rx_power_dbm", "supernode_optic_threshold_dbm"}),
        "_rack_power": frozenset({"supernode_rack_power_watts", "supernode_rack_power_budget_watts"}),
        "_outlets": frozenset({"supernode_pdu_outlet_on"}),
        "_tray_rack": frozenset({"supernode_leak_detector_state", "supernode_redfish_service_info"}),
        "_leak_loop": frozenset({"supernode_leak_detected", "supernode_cdu_flow_cubic_meters_per_second",
                                 "supernode_cdu_pressure_pascals"}),
        "_cold_plate": frozenset({"supernode_gpu_thermal_resistance_kelvin_per_watt",
                                  "supernode_gpu_thermal_resistance_baseline_kelvin_per_watt",
                                  "supernode_gpu_thermal_resistance_unavailable",
                                  "supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt",
                                  "supernode_gpu_thermal_resistance_rack_peers",
                                  "supernode_gpu_temperature_celsius", "supernode_gpu_temperature_threshold_celsius"}),
        "_tray_flow": frozenset({"supernode_coolant_connector_flow_cubic_meters_per_second",
                                 "supernode_redfish_service_info"}),
    }

    @classmethod
    def families(cls) -> frozenset[str]:
        """Every metric family some detector reads."""
        return frozenset().union(*cls.INPUTS.values())

    @classmethod
    def counters(cls) -> frozenset[str]:
        """The counter families some detector reads: a change of one is news (agent.runtime's quiet polls, the
        shared facts); other counters (a client's requests and the like) change with every poll and are not."""
        return frozenset(name for name in cls.families() if name.endswith("_total"))

    def evaluate(self, snap: Snapshot, families: frozenset[str] | None = None) -> list[Event]:
        """Observations of every detector, or only of those reading one of `families` (what a source published)."""
        events: list[Event] = []
        for obs in self.observe(snap, families):
            tracker = self.trackers[obs.detector]
            if not getattr(tracker.hold, "enabled", True):
                continue
            kind = tracker.observe(obs, snap.monotonic)
            if kind:
                events.append(Event(kind, obs.detector, dict(obs.targets), obs.severity, dict(obs.detail)))
        return events

    def leak_awaiting_confirmation(self) -> bool:
        """A zone read wet but not yet on enough consecutive polls: worth confirming at once.

        Also while this agent's own incident of that zone is still open in its clear hold (a wet reading after
        dry ones): the agents that read this poller's facts may have closed theirs a poll earlier (their clear
        hold counts from the facts' arrival), and their second wet reading is this poller's next poll; without
        the re-read they would wait a whole interval for it."""
        return any(0 < st.count < t.consecutive for t in (self.trackers["leak"], self.trackers["leak_tray"])
                   for st in t.keys.values())

    def observe(self, snap: Snapshot, families: frozenset[str] | None = None) -> Iterator[Observation]:
        for fn in (self._leak, self._coolant, self._gpu_thermal, self._gpu_faults, self._gpu_lost, self._nvlink,
                   self._nvlink_switch, self._pump_health, self._filter, self._reservoir, self._service_hours,
                   self._optic, self._rack_power, self._outlets, self._tray_rack, self._leak_loop,
                   self._gpu_pcie, self._gpu_clock_slowdown, self._gpu_straggler, self._gpu_fabric,
                   self._cold_plate, self._tray_flow):
            if families is None or self.INPUTS[fn.__name__] & families:
                yield from fn(snap)
