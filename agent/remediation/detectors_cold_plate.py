"""Detectors of the cold plates and the trays' coolant paths: a plate that fouls, a tray whose flow is blocked.

Why apart from detectors_cooling: those judge the loop (the CDU's flow, its supply temperature, leaks), where one
threshold holds for the whole rack; these judge one GPU's plate or one tray's path against its peers at the same
moment and against its own past, which no threshold on the loop shows. Both warn long before a GPU reaches its
slowdown temperature, and neither caps nor drains anything: their playbooks only notify.

cold_plate_degraded reads the derived thermal resistance (agent/derived_thermal.py). Three references:
- peers: the median R of the tray's other loaded GPUs (at least cold_plate_min_peers of them), on the same loop
  at the same moment, so one fouled plate stands out with no history at all;
- rack: the median R of the OTHER trays' loaded GPUs on the same CDU at comparable flow, from the summaries the
  trays share (agent.coordination.tray_cooling, `supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt`,
  used from cold_plate_min_peers GPUs), so a plate stands out on a tray with one or two GPUs under load (no tray
  median) and on a tray where every plate fouled (its own median moved with it), still with no history;
- baseline: the GPU's own learnt R at the loop's present flow band (persisted), so a plate that fouls as its
  tray mates and the rack do (a slow drift of the whole loop) shows too.
When every loaded GPU of the tray (two or more) is off its baseline, or off the rack, alike, that is the tray's
(its manifold, its quick-disconnects, air in its branch, or every plate fouled): one incident with targets
{node}, scope tray, instead of one per GPU.
A GPU with no R now (below the load gate, no coolant supply reading) is neither fired nor cleared: its state is
kept (unknown), and the reason is in supernode_gpu_thermal_resistance_unavailable. When the reason is a missing
input (a CDU poll or an NVML read that failed: INPUT_GAPS), a fire hold already running goes on through the gap
for up to the hold itself (hysteresis.Tracker gap_grace): on a loaded host such gaps come every few minutes, and
restarting a 5-minute hold at each one made the warning late or never (bench_cooling's run that warned only at
slowdown). An idle GPU restarts its hold.

tray_flow_low reads the trays' coolant flow from their BMCs' coolant connectors (Redfish ThermalSubsystem/
CoolantConnectors, loop chassis). A tray whose flow is below tray_flow_low_ratio of the median of the other
trays it sees fires: at the same CDU pressure, a path that passes less is blocked. The trays compared are those
this agent reads (every tray for the rack leader with sources.redfish.watch_rack_trays), all taken to be on one
CDU (the rack's loop). A tray whose BMC answers but reports no flow, or with too few peers, is unknown (held).
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterator

from agent.snapshot import Snapshot

from .detectors_base import Context, DetectorBase
from .hysteresis import Observation, Tracker, targets_of
from .settings import DetectorSettings


# Why a GPU has no R now that says nothing of its plate: an input is missing for a moment (agent/derived_thermal.py
# keeps R's smoothing through such a gap); an idle GPU (below the load gate) is no gap: its hold starts again.
INPUT_GAPS = frozenset({"no_temperature_reading", "no_power_reading", "no_supply_reading"})


def _above(value: float, ref: float | None, ratio: float) -> bool:
    return ref is not None and ref > 0 and value > ref * (1 + ratio)


class ColdPlateDetectors(DetectorBase):
    """cold_plate_degraded and tray_flow_low, methods of the detector table (`Detectors`)."""

    COLD_PLATE_DETECTORS = ("cold_plate_degraded", "tray_flow_low")

    def __init__(self, settings: DetectorSettings, ctx: Context, clock: Callable[[], float] | None = None):
        super().__init__(settings, ctx, clock)
        for name in self.COLD_PLATE_DETECTORS:  # a gap in R's inputs shorter than the fire hold does not restart it
            hold = getattr(settings, name)
            self.trackers[name] = Tracker(hold, gap_grace=hold.fire_seconds if name == "cold_plate_degraded" else 0.0)

    # -- cold plates -------------------------------------------------------------------

    def _cold_plate(self, snap: Snapshot) -> Iterator[Observation]:
        s, node = self.s, self.ctx.node
        own = lambda r: r.ok and r.labels.get("node", node) == node  # noqa: E731
        rs = {r.label("gpu"): r.value for r in snap.select("supernode_gpu_thermal_resistance_kelvin_per_watt") if own(r)}
        base = {r.label("gpu"): r.value
                for r in snap.select("supernode_gpu_thermal_resistance_baseline_kelvin_per_watt") if own(r)}
        why = {r.label("gpu"): r.label("reason") for r in snap.select("supernode_gpu_thermal_resistance_unavailable")
               if own(r) and r.value >= 0.5}
        rack_peers = snap.value("supernode_gpu_thermal_resistance_rack_peers") or 0.0
        rack = snap.value("supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt") \
            if rack_peers >= s.cold_plate_min_peers else None
        ratio, inside = s.cold_plate_degraded_ratio, s.cold_plate_degraded_ratio / 2
        over_base = {g for g, r in rs.items() if _above(r, base.get(g), ratio)}
        over_rack = {g for g, r in rs.items() if _above(r, rack, ratio)}
        # Every loaded GPU of the tray off alike (its manifold, its quick-disconnects, air in its branch, or
        # every plate fouled): the tray's, one incident, whichever reference shows it.
        wide = [n for n, over in (("baseline", over_base), ("rack", over_rack)) if len(rs) >= 2 and over == set(rs)]
        tray_back = not any(_above(r, base.get(g), inside) or _above(r, rack, inside) for g, r in rs.items())
        if rs:
            tray_cond: bool | None = True if wide else False if tray_back else None
            detail = self._detail(snap, "tray", rs, base, None, rack) if wide else {}
            if wide:
                detail["off"] = wide
            yield Observation("cold_plate_degraded", targets_of(node=node), "warning", tray_cond, detail=detail)
        for gpu in sorted(set(rs) | set(why), key=lambda g: (len(g), g)):
            targets = targets_of(node=node, gpu=gpu)
            if gpu not in rs:
                reason = why.get(gpu, "no_thermal_resistance")
                yield Observation("cold_plate_degraded", targets, "warning", None, detail={"unknown": reason},
                                  input_gap=reason in INPUT_GAPS)
                continue
            r = rs[gpu]
            peers = [v for g, v in rs.items() if g != gpu]
            median = statistics.median(peers) if len(peers) >= s.cold_plate_min_peers else None
            off = {"peers": _above(r, median, ratio),
                   "rack": gpu in over_rack and "rack" not in wide,
                   "baseline": gpu in over_base and "baseline" not in wide}
            back = not _above(r, median, inside) and ("baseline" in wide or not _above(r, base.get(gpu), inside)) \
                and ("rack" in wide or not _above(r, rack, inside))
            cond = True if any(off.values()) else False if back else None
            detail = self._detail(snap, "gpu", {gpu: r}, base, median, rack) if cond else {}
            if cond:
                detail["off"] = [n for n, o in off.items() if o]
            yield Observation("cold_plate_degraded", targets, "warning", cond, detail=detail)

    def _detail(self, snap: Snapshot, scope: str, rs: dict[str, float], base: dict[str, float],
                median: float | None, rack: float | None) -> dict:
        """The evidence, with each GPU's temperature and slowdown threshold now (how far from a throttle)."""
        gpus = {}
        for gpu, r in sorted(rs.items()):
            gpus[gpu] = {"thermal_resistance_kelvin_per_watt": round(r, 5),
                         "baseline_kelvin_per_watt": round(base[gpu], 5) if gpu in base else None,
                         "temperature_celsius": snap.value("supernode_gpu_temperature_celsius", gpu=gpu, sensor="gpu"),
                         "slowdown_celsius": snap.value("supernode_gpu_temperature_threshold_celsius", gpu=gpu,
                                                        threshold="slowdown")}
        out: dict = {"scope": scope, "ratio": self.s.cold_plate_degraded_ratio,
                     "rack_median_kelvin_per_watt": round(rack, 5) if rack is not None else None}
        if scope == "gpu":
            (gpu, one), = gpus.items()
            out.update(one, peers_median_kelvin_per_watt=round(median, 5) if median is not None else None)
        else:
            out["gpus"] = gpus
        return out

    # -- tray coolant flow -------------------------------------------------------------

    def _tray_flow(self, snap: Snapshot) -> Iterator[Observation]:
        trays = {r.label("bmc") for r in snap.select("supernode_redfish_service_info", kind="tray") if r.ok}
        if not trays:
            return
        flows: dict[str, float] = {}
        for r in snap.select("supernode_coolant_connector_flow_cubic_meters_per_second", loop="chassis"):
            if r.ok and r.label("bmc") in trays:
                flows[r.label("bmc")] = flows.get(r.label("bmc"), 0.0) + r.value
        s = self.s
        for bmc in sorted(trays):
            targets = targets_of(bmc=bmc)
            peers = [v for b, v in flows.items() if b != bmc]
            if bmc not in flows or len(peers) < s.tray_flow_min_peers:
                unknown = "no_flow_reading" if bmc not in flows else "too_few_peers"
                yield Observation("tray_flow_low", targets, "warning", None, detail={"unknown": unknown})
                continue
            median = statistics.median(peers)
            share = flows[bmc] / median if median > 0 else None
            if share is None:
                yield Observation("tray_flow_low", targets, "warning", None, detail={"unknown": "peers_no_flow"})
                continue
            cond = True if share < s.tray_flow_low_ratio else False if share >= s.tray_flow_clear_ratio else None
            yield Observation("tray_flow_low", targets, "warning", cond,
                              detail={"flow_cubic_meters_per_second": flows[bmc], "share_of_peers": round(share, 3),
                                      "peers_median_cubic_meters_per_second": median, "peers": len(peers)})
