"""What every detector shares: the node's context, counter rates, the per-detector trackers, sensor faults.

Why apart: the detector definitions live in one module per domain
(detectors_cooling, detectors_gpu, detectors_optics, detectors_power), each a
class over this base; `Detectors` (detectors.py) combines them into the table.
The state they read (settings, context, rates, trackers) is created here once,
and a reading whose quality is not ok is turned here, for every domain alike,
into a sensor-fault observation instead of satisfying a condition.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from exporters.model import Reading

from .dry_hold import DryHistory
from .flow_baseline import FlowBaselines
from .gpu_faults import GpuFaultJudge
from .hysteresis import Observation, Tracker, targets_of
from .recovery_ledger import RecoveryLedger
from .settings import DetectorSettings, Hold
from .xid_recovery import shipped_rules


LEAK_SCOPED = ("leak", "leak_tray")  # confirmed on consecutive polls of the wet detector


class _Rates:
    """Per-series rates and deltas from counter values across snapshots.

    Keyed on the reading's own timestamp: a snapshot that carries the same
    sample again (another source published) keeps the last rate; a counter
    reset or a first sighting gives no rate.
    """

    def __init__(self) -> None:
        self.last: dict[tuple, tuple[float, float, float | None]] = {}  # series -> (timestamp, value, rate)
        self.deltas: dict[tuple, tuple[float, float]] = {}  # series -> (timestamp, value)

    @staticmethod
    def _key(r: Reading) -> tuple:
        # Unsorted: a collector builds one series' labels in one order every poll (sorting them was a
        # third of the NVLink detector's time); a series whose label order changed only misses one rate.
        return r.spec.name, tuple(r.labels.items())

    def rate(self, r: Reading) -> float | None:
        key = (r.spec.name, tuple(r.labels.items()))  # _key, inlined: ~300 counters per NVML publish
        prev = self.last.get(key)
        ts, v = r.timestamp, r.value
        if prev is not None and ts <= prev[0]:
            return prev[2]
        rate = None if prev is None or v < prev[1] else (v - prev[1]) / max(ts - prev[0], 1e-6)
        self.last[key] = (ts, v, rate)
        return rate

    def delta(self, r: Reading) -> float | None:
        """Increase since the previous sample (0 for a repeated sample, None on first sighting)."""
        key = self._key(r)
        prev = self.deltas.get(key)
        if prev is not None and r.timestamp <= prev[0]:
            return 0.0
        self.deltas[key] = (r.timestamp, r.value)
        return None if prev is None else max(0.0, r.value - prev[1])


@dataclass
class Context:
    """What detectors need besides the snapshot: this node, the inventory's expectations."""

    node: str
    rack: str
    expected_gpus: int = 0
    power_budget_watts: float | None = None
    # (pdu, outlet) -> the inventory node it feeds: only those outlets are watched (an outlet that feeds
    # nothing the agent knows may be off on purpose)
    outlet_feeds: Mapping[tuple[str, str], str] = field(default_factory=dict)
    # what the recovery ladder's steps did (the engine records, the GPU fault judge reads): recovery_ledger.py
    recoveries: RecoveryLedger = field(default_factory=RecoveryLedger)
    # XID -> the operator's override of that catalogue entry (remediation.xid_overrides; XidOverride)
    xid_overrides: Mapping[int, Any] = field(default_factory=dict)
    # whether this agent leads the rack now: rack incidents every agent could see (nvlink_switch_fault) are its
    leads: Callable[[], bool] = lambda: True
    # leak scope (leak_scope.py): compute tray BMC -> its node, tray -> rack unit, trays watched below a leak
    tray_bmcs: Mapping[str, str] = field(default_factory=dict)
    rack_units: Mapping[str, int] = field(default_factory=dict)
    watch_below_trays: int = 1


class DetectorBase:
    """The state and reading helpers of the detector table; the domains' classes add the detectors."""

    def __init__(self, settings: DetectorSettings, ctx: Context, clock: Callable[[], float] | None = None):
        self.s = settings
        self.ctx = ctx
        self.clock = clock or time.time
        rules, catalogue = shipped_rules()
        # The GPU fault judge (gpu_faults.py): its memory is the XID history the ladder's four detectors read.
        self.gpu_faults = GpuFaultJudge(rules, catalogue, ctx.recoveries, self.clock, ctx.xid_overrides,
                                        settings.gpu_app_fault.clear_seconds)
        # A fault drill's XIDs are judged apart, by a judge that lives as long as the drill's XID readings do: they
        # never enter a GPU's real history (its repeat rules), and the drill's fault ends with the drill, where a
        # real one waits for a proven recovery (the drill's reset or reboot is dry-run).
        self.new_drill_judge = lambda: GpuFaultJudge(rules, catalogue, ctx.recoveries, self.clock,
                                                     ctx.xid_overrides, settings.gpu_app_fault.clear_seconds)
        self.drill_gpu_faults: GpuFaultJudge | None = None
        self.rates = _Rates()
        self.flow_baselines = FlowBaselines(settings.flow_baseline_window_seconds,
                                            settings.flow_setpoint_settle_seconds)
        self.flaps: dict[str, list[tuple[float, float]]] = {}
        self.trackers: dict[str, Tracker] = {}
        for name in ("leak", "leak_sensor_fault", "leak_source_down", "coolant_flow_low", "coolant_supply_hot",
                     "condensation_risk", "gpu_thermal", "gpu_app_fault", "gpu_reset_required", "gpu_reboot_required",
                     "gpu_service_required", "gpu_lost", "nvlink_errors", "gpu_fabric_degraded", "nvlink_switch_fault",
                     "optic_degraded", "rack_power_over_budget", "pdu_outlet_off", "tray_leak_rack", "leak_tray",
                     "leak_loop"):
            hold: Hold = getattr(settings, name)
            self.trackers[name] = Tracker(hold, settings.leak_consecutive_polls if name in LEAK_SCOPED else 1)
        self.dry = DryHistory()  # every leak detector's dry history: what a resume after a leak waits on
        self.trackers["sensor_fault"] = Tracker(Hold(fire_seconds=0.0, clear_seconds=10.0))
        self._fault_keys = 0
        self._faulted: frozenset[str] = frozenset()
        # The NVLink error readings last evaluated and each link's summed rate from them (see `_nvlink`).
        self._nvlink_rates: tuple[list[Reading], dict[tuple[str, str, str], float]] = ([], {})
        self._rack_stragglers: set[tuple[str, str]] = set()  # GPUs gpu_straggler holds against the rack median
        self._hung_since: dict[tuple[str, str], float] = {}  # (node, gpu) -> its first hung reading's time, while hung

    def _fault(self, r: Reading) -> Observation:
        return Observation("sensor_fault", targets_of(reading=r.reading_id()), "warning", True,
                           detail={"quality": r.quality.value, "metric": r.spec.name})

    def _ok_or_fault(self, readings: Iterable[Reading]) -> Iterator[Reading | Observation]:
        """Yield ok readings, and a sensor-fault observation for each reading that is not ok.

        An ok reading's observation (the fault cleared) is yielded only for families with a sensor-fault
        key: elsewhere it would change nothing, and building one per reading per pass was most of the
        cost of the cheap detectors."""
        faulted = self._faulted_families()
        for r in readings:
            if r.ok:
                if r.spec.name in faulted:
                    yield Observation("sensor_fault", targets_of(reading=r.reading_id()), "warning", False)
                yield r
            else:
                yield self._fault(r)

    def _faulted_families(self) -> frozenset[str]:
        """Metric families with a reading in the sensor-fault tracker (observed faulty, or restored)."""
        keys = self.trackers["sensor_fault"].keys
        if len(keys) != self._fault_keys:  # keys are only ever added: their count says when to look again
            self._fault_keys = len(keys)
            self._faulted = frozenset("supernode_" + dict(k).get("reading", "").split(",", 1)[0] for k in keys)
        return self._faulted
