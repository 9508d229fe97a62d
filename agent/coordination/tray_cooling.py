"""A tray's cooling summary, shared with the rack: each loaded GPU's thermal resistance and each GPU's margin.

Why shared: two cooling decisions are the rack's, not the tray's.
- A cold plate's R judged only against its tray mates misses a tray where every plate fouled, and says nothing
  on a tray with one or two GPUs under load (no median of peers). Against the other trays' loaded GPUs on the
  same loop and flow, at the same moment, it still stands out (`rack_resistance`, the reference the
  cold_plate_degraded detector reads as `supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt`).
- A derate sheds the rack's power by thermal margin across the rack's GPUs (agent/remediation/derate.py
  `plan_rack`): the hottest trays cut most. Each agent caps only its own GPUs, so each needs every tray's
  margins and must reach the same plan from them: each GPU's power, its rise over the coolant supply and its
  lowest limit, as each tray last sent them before the loop changed (LinkShare keeps each tray's recent
  summaries: a steady state no transient has reordered, and no tray's own caps have lowered yet).

It rides on the tray's link vector (agent.coordination.link_vectors, `cool`), the record every agent already
publishes for the rack (etcd `links/<node>`, a key only that node may write; static: its links feed), so no new
key, role or stream. What a reader takes is checked (`decode`): numbers finite and in physical range, at most
MAX_GPUS GPUs, the CDU a short name; anything else is a RecordError naming the field, and the whole vector is
refused (counted in supernode_coordination_rejected_records_total{key_kind="links"}), so a peer's garbage is
no peer: never a reference and never a margin.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from agent.coordination.records import RecordError, as_object
from agent.thermal_baseline import flow_band

MAX_GPUS = 16
MAX_R_KELVIN_PER_WATT = 1.0  # 100 K over the coolant at 100 W: far past any plate that still cools
MAX_POWER_WATTS = 10e3
MAX_RISE_KELVIN = 200.0
MAX_FLOW_M3S = 1.0  # 60,000 L/min: no rack loop
MAX_NAME = 64


@dataclass(frozen=True, slots=True)
class GpuCooling:
    r: float | None  # smoothed thermal resistance, K/W; None while the GPU is below the load gate
    power_w: float  # power now, or before this tray's derate caps while one holds
    rise_k: float  # die temperature over the tray's coolant supply
    min_w: float  # the lowest power limit NVML allows


@dataclass(frozen=True, slots=True)
class TrayCooling:
    cdu: str  # the CDU that feeds the tray (agent.derived_thermal.supply_cdu)
    flow_m3s: float | None  # that CDU's secondary flow when read
    gpus: Mapping[str, GpuCooling]  # gpu index -> its figures


def encode(c: TrayCooling) -> dict[str, Any]:
    return {"cdu": c.cdu, "flow": c.flow_m3s,
            "g": {k: [g.r, g.power_w, g.rise_k, g.min_w] for k, g in sorted(c.gpus.items())}}


def _number(value: Any, what: str, lo: float, hi: float, null: bool = False) -> float | None:
    if value is None and null:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not lo <= value <= hi:
        raise RecordError("range", f"{what}: expected a number {lo:g}..{hi:g}{' or null' if null else ''}")
    return float(value)


def decode(raw: Any) -> TrayCooling | None:
    """The summary a vector carries (None when it carries none), checked; RecordError naming the field."""
    if raw is None:
        return None
    doc = as_object(raw, "links.cool")
    cdu = doc.get("cdu")
    if not isinstance(cdu, str) or len(cdu) > MAX_NAME:
        raise RecordError("type", f"links.cool.cdu: expected a CDU name of at most {MAX_NAME} characters")
    flow = _number(doc.get("flow"), "links.cool.flow", 0.0, MAX_FLOW_M3S, null=True)
    gpus = doc.get("g")
    if not isinstance(gpus, dict) or len(gpus) > MAX_GPUS:
        raise RecordError("type", f"links.cool.g: expected an object of at most {MAX_GPUS} GPUs")
    out: dict[str, GpuCooling] = {}
    for gpu, figures in gpus.items():
        if not gpu.isdigit() or len(gpu) > 3:
            raise RecordError("type", f"links.cool.g: {gpu[:20]!r} is not a GPU index")
        if not isinstance(figures, list) or len(figures) != 4:
            raise RecordError("type", f"links.cool.g.{gpu}: expected [r, watts, rise, min watts]")
        r = _number(figures[0], f"links.cool.g.{gpu}.r", 1e-6, MAX_R_KELVIN_PER_WATT, null=True)
        power = _number(figures[1], f"links.cool.g.{gpu}.watts", 0.0, MAX_POWER_WATTS)
        rise = _number(figures[2], f"links.cool.g.{gpu}.rise", -MAX_RISE_KELVIN, MAX_RISE_KELVIN)
        lo = _number(figures[3], f"links.cool.g.{gpu}.min_watts", 0.0, MAX_POWER_WATTS)
        assert power is not None and rise is not None and lo is not None
        out[gpu] = GpuCooling(r, power, rise, lo)
    return TrayCooling(cdu, flow, out)


class CoolingBuilder:
    """This tray's summary from its own snapshot."""

    def __init__(self, node: str, cdu: str | None):
        self.node = node
        self.cdu = cdu

    def build(self, snap: Any) -> TrayCooling | None:
        from agent.remediation.cdu_view import loop_value

        if self.cdu is None:
            return None
        supply = loop_value(snap, "supernode_cdu_temperature_celsius", cdu=self.cdu, loop="secondary",
                            point="supply")
        if supply is None:  # no rise, no R: this tray says nothing of its cooling now
            return None
        flow = loop_value(snap, "supernode_cdu_flow_cubic_meters_per_second", cdu=self.cdu, loop="secondary")

        def own(name: str, **labels: str) -> dict[str, float]:
            return {r.label("gpu"): r.value for r in snap.select(name, **labels)
                    if r.ok and r.label("node", self.node) == self.node and r.label("gpu").isdigit()}

        temps = own("supernode_gpu_temperature_celsius", sensor="gpu")
        power = own("supernode_gpu_power_watts")
        mins = own("supernode_gpu_power_limit_watts", limit="min")
        rs = own("supernode_gpu_thermal_resistance_kelvin_per_watt")
        gpus = {g: GpuCooling(rs.get(g), power[g], temps[g] - supply, mins[g])
                for g in sorted(set(temps) & set(power) & set(mins))[:MAX_GPUS]}
        return TrayCooling(self.cdu, flow if flow is not None and 0 <= flow <= MAX_FLOW_M3S else None, gpus) \
            if gpus else None


def comparable(a: TrayCooling, b: TrayCooling, band_ratio: float) -> bool:
    """Same loop (the same CDU) at comparable flow (the same flow band, when both read it)."""
    if not a.cdu or a.cdu != b.cdu:
        return False
    if a.flow_m3s and b.flow_m3s:
        return flow_band(a.flow_m3s, band_ratio) == flow_band(b.flow_m3s, band_ratio)
    return True


@dataclass(frozen=True, slots=True)
class RackResistance:
    median: float | None  # median R of the other trays' loaded GPUs; None without any
    gpus: int  # how many loaded GPUs of other trays it is the median of
    trays: tuple[str, ...]  # those trays


def rack_resistance(own: str, cooling: Mapping[str, TrayCooling], band_ratio: float) -> RackResistance:
    """The reference a GPU of tray `own` is judged against: the median R of the loaded GPUs of the OTHER trays
    (fresh summaries only: the caller's) on the same loop at comparable flow. Other trays only, so a tray
    whose every plate fouled does not pull its own reference up; the median of GPUs (not of trays), so one
    fouled tray among many cannot move it."""
    mine = cooling.get(own)
    if mine is None:
        return RackResistance(None, 0, ())
    values: list[float] = []
    trays = []
    for node in sorted(cooling):
        c = cooling[node]
        if node == own or not comparable(mine, c, band_ratio):
            continue
        loaded = [g.r for g in c.gpus.values() if g.r is not None]
        if loaded:
            trays.append(node)
            values += loaded
    return RackResistance(statistics.median(values) if values else None, len(values), tuple(trays))
