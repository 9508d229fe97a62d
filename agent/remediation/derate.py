"""Derate by margin: how much power the rack must shed for the heat its loop can still carry, and who sheds it.

Why a pure module: the decision (which GPU gets which limit) is the part
that must be right, and is tested with hypothesis on its own; the action
(actions/gpu_power_cap.py, mode `thermal_margin`) only reads its inputs
from NVML and the incident, and applies the result.

The loop's capacity (the heat it carries within the allowed rise):

    Q_cap  = flow x rho x cp x dT_allowed,  dT_allowed = min(max_delta_t, max_return - supply)
    Q_load = flow x rho x cp x (return - supply)          (what it carries now)
    shed   = max(0, 1 - Q_cap / Q_load)                   (the share of the load to take off)

rho and cp default to PG25 near 30 C (1025 kg/m^3, 3900 J/(kg K):
exporters/cooling/coolant.py, DEVICES.md section 7); max_delta_t defaults to
10 K, the rise a loop sized at 1.5 L/min per kW is built for (the same
coolant.py sizing note); max_return to 50 C, ASHRAE W45's supply limit plus
5 K. Every agent reads the same CDU, so every agent computes the same share
and sheds it from its own GPUs: the rack's total cut is that share of the
rack's GPU power, with no coordination round trip.

The cut goes by thermal margin: each GPU's weight is its rise over the
coolant supply (T_gpu - T_supply = R x P: the hottest, and at the same power
the highest thermal resistance, weigh most); cuts are proportional to the
weights, water-filled so no GPU goes below its minimum limit (one at its
minimum passes the rest of its share to the others).

Across the rack (`plan_rack`): the trays share each GPU's power, rise and
minimum (agent.coordination.tray_cooling), so the rack's shed (the share of
the rack's GPU power, and at least what the rack draws over its PDU budget)
is water-filled over every GPU of the loop at once: a hotter tray sheds more
than a cooler one. Every agent computes the same plan from the same
summaries and applies its own tray's cuts. Where a tray of the loop has no
fresh summary (its agent down, its record refused), its margins are unknown:
each tray then sheds the same share of its own load, as above, and says so
(actions/margin_cap.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from exporters.cooling.coolant import PG25

DEFAULT_MAX_DELTA_T_C = 10.0
DEFAULT_MAX_RETURN_C = 50.0
MIN_WEIGHT_K = 0.1  # a GPU at the supply temperature (idle) still takes a sliver: the plan always has a solution


@dataclass(frozen=True)
class GpuMargin:
    """One GPU as the plan sees it: its power now, temperature, and NVML's lowest limit (watts, Celsius)."""

    key: str
    power_w: float
    temp_c: float
    min_w: float


@dataclass(frozen=True)
class LoopCapacity:
    capacity_w: float  # Q_cap
    load_w: float  # Q_load
    shed_fraction: float  # share of the load to shed (0: the loop carries it)
    delta_t_allowed_c: float


def loop_capacity(flow_m3s: float, supply_c: float, return_c: float, *, max_delta_t_c: float = DEFAULT_MAX_DELTA_T_C,
                  max_return_c: float = DEFAULT_MAX_RETURN_C, density_kg_m3: float = PG25.density_kg_m3,
                  heat_capacity_j_kgk: float = PG25.heat_capacity_j_kgk) -> LoopCapacity | None:
    """Q_cap, Q_load and the share to shed; None when the loop's load cannot be known (no flow, no rise)."""
    rho_cp = density_kg_m3 * heat_capacity_j_kgk
    load = flow_m3s * rho_cp * (return_c - supply_c)
    if flow_m3s <= 0 or load <= 0:
        return None
    allowed = max(min(max_delta_t_c, max_return_c - supply_c), 0.0)
    cap = flow_m3s * rho_cp * allowed
    return LoopCapacity(cap, load, max(0.0, 1.0 - cap / load), allowed)


def plan_cuts(gpus: Sequence[GpuMargin], shed_w: float, supply_c: float) -> dict[str, float]:
    """Each GPU's cut (watts, >= 0) so that they sum to `shed_w` when the GPUs can give it, each in proportion
    to its rise over the supply, none below its minimum limit. Infeasible (their headroom is less): every
    GPU goes to its minimum."""
    headroom = {g.key: max(g.power_w - g.min_w, 0.0) for g in gpus}
    weight = {g.key: max(g.temp_c - supply_c, MIN_WEIGHT_K) for g in gpus}
    if shed_w <= 0:
        return dict.fromkeys(headroom, 0.0)
    if sum(headroom.values()) <= shed_w:
        return headroom

    def total(lam: float) -> float:
        return sum(min(headroom[k], lam * weight[k]) for k in headroom)

    lo, hi = 0.0, 1.0
    while total(hi) < shed_w:
        hi *= 2.0
    for _ in range(100):  # bisection on the water level; hi always gives at least the shed
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if total(mid) < shed_w else (lo, mid)
    return {k: min(headroom[k], hi * weight[k]) for k in headroom}


def plan_limits(gpus: Sequence[GpuMargin], shed_w: float, supply_c: float) -> dict[str, float]:
    """The power limit for each GPU: its power now less its cut, never below its minimum."""
    cuts = plan_cuts(gpus, shed_w, supply_c)
    return {g.key: max(g.power_w - cuts[g.key], g.min_w) for g in gpus}


def plan_rack(trays: Mapping[str, Sequence[GpuMargin]], shed_fraction: float, floor_w: float = 0.0
              ) -> tuple[float, dict[str, dict[str, float]]]:
    """The rack's shed across every tray's GPUs: (shed in watts, node -> gpu -> cut). The shed is
    `shed_fraction` of the rack's GPU power, and at least `floor_w` (the rack's power over its PDU budget);
    each GPU's `temp_c` here is its rise over its tray's coolant supply (so the plan is made with supply 0).

    Deterministic: every agent of the rack holds the same trays' summaries (in whatever order it got them) and
    must reach the same cuts, each applying its own tray's; so the GPUs are taken in one order (node, gpu),
    whatever order the mapping has, and the water level is found by a fixed number of bisections."""
    gpus = [GpuMargin(f"{node}/{g.key}", g.power_w, g.temp_c, g.min_w)
            for node in sorted(trays) for g in sorted(trays[node], key=lambda g: (len(g.key), g.key))]
    shed_w = max(shed_fraction * sum(g.power_w for g in gpus), floor_w, 0.0)
    cuts = plan_cuts(gpus, shed_w, 0.0)
    out: dict[str, dict[str, float]] = {node: {} for node in trays}
    for key, cut in cuts.items():
        node, gpu = key.rsplit("/", 1)
        out[node][gpu] = cut
    return shed_w, out


def loop_inputs(ctx: Mapping[str, object]) -> tuple[float, float, float] | str:
    """Flow, supply and return from the incident (detectors_cooling.loop_evidence), or why they are missing."""
    names = ("flow_cubic_meters_per_second", "supply_celsius", "return_celsius")
    missing = [n for n in names if not isinstance(ctx.get(n), (int, float))]
    if missing:
        return f"the incident carries no {', '.join(missing)} (the CDU did not report it)"
    return tuple(float(ctx[n]) for n in names)  # type: ignore[return-value,arg-type]
