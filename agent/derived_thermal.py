"""Each GPU's cold-plate thermal resistance, derived from readings the agent already has: R = (T_gpu - T_supply) / P.

Why: a cold plate that fouls (deposits, air trapped in the loop, a failing quick-disconnect) shows first as a GPU
that runs hotter over its coolant for the heat it makes, days before it reaches its slowdown temperature. Every
input is already in the snapshot: the die temperature and power from NVML, the secondary supply temperature and
flow from the CDU that feeds the tray, Modbus or Redfish (read through agent/remediation/cdu_view.py, the one view
of every CDU's loop the coolant detectors read too). No device is read here (a derived source): when an input goes stale, R
goes with it and the reason says which input, never a frozen figure.

The gate (ThermalResistanceSettings): R is computed only while the GPU draws at least `min_power_ratio` of its
default (board) power limit and its utilisation is at least `min_utilization_ratio`, and `settle_seconds` after
the gate opened. Below that load the rise over the coolant is a few kelvin, within the sensors' error, and the
ratio is noise; right after a power step the die has not yet reached its new temperature and R reads low.

Smoothing: an exponentially weighted mean with time constant `smoothing_seconds`, restarted when the gate closes.
Why an EWMA rather than a median over a window: temperature and power are sampled at one instant but the die lags
the power by the plate's thermal time constant, so the instantaneous ratio swings with every power step of the
job; an EWMA longer than that lag averages the swing out in O(1) state per GPU (a median would hold a window of
samples per GPU, and a GPU sensor does not spike in a way a median would need to reject).

Which coolant supply belongs to a GPU: the tray's CDU, found through the inventory's leak zones that list its
node: the CDU holding those zones' isolation valve (`valve: cdu1:zone_valve_1`), else the one CDU whose `channels`
serve them (a rear-door heat exchanger's leak channels may serve the same zone: then the valve decides); a zone
with no valve of its own is on the rack's loop when the rack's valves all sit on one CDU (the rack valve's, else
every zone valve's); with no mapping at all and exactly one CDU in the inventory, that one; else none (reason
`no_supply_mapping`).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.remediation.cdu_view import loop_value
from agent.snapshot import Snapshot, SnapshotStore
from agent.thermal_baseline import FILE_NAME, ThermalBaselines, flow_band
from exporters.model import PollResult, Reading, gauge

if TYPE_CHECKING:
    from agent.config import Inventory, ThermalResistanceSettings

G = ("gpu", "uuid")
RESISTANCE = gauge("supernode_gpu_thermal_resistance_kelvin_per_watt", (
    "Cold-plate thermal resistance of the GPU, (die temperature - coolant supply temperature) / power, smoothed; "
    "only while the GPU is under load (absent otherwise: see supernode_gpu_thermal_resistance_unavailable)."),
    G, "kelvin_per_watt")
BASELINE = gauge("supernode_gpu_thermal_resistance_baseline_kelvin_per_watt", (
    "The GPU's own learnt thermal resistance at the loop's present flow band (persisted across restarts); absent "
    "while that band is still learning or the flow is unknown."), G, "kelvin_per_watt")
LEARNING = gauge("supernode_gpu_thermal_resistance_baseline_learnt_ratio", (
    "Share (0-1) of its learning time the GPU's baseline at the present flow band has had (1: a reference)."),
    G, "ratio")
UNAVAILABLE = gauge("supernode_gpu_thermal_resistance_unavailable", (
    "1 for the reason the GPU's thermal resistance is not computed now: one series, only while it is not "
    "(absent while supernode_gpu_thermal_resistance_kelvin_per_watt is there)."),
    G + ("reason",))

# In the order they are checked: the first that holds is the reason.
REASONS = ("no_temperature_reading", "no_power_reading", "no_supply_mapping", "no_supply_reading",
           "below_load_gate", "settling")
# An input missing for a moment (a poll that failed on a loaded host) is no change of the GPU's load: the smoothing
# and the settle go on from where they were when it returns, unless the gap outlasted GAP_KEPT_TAUS time
# constants of the smoothing (then it starts afresh, settle included). Restarting at every gap reset R's EWMA and
# its settle, and the detector's hold with them (bench_cooling's run that warned only at slowdown).
INPUT_GAPS = frozenset({"no_temperature_reading", "no_power_reading", "no_supply_reading"})
GAP_KEPT_TAUS = 3.0


def supply_cdu(inv: "Inventory", node: str) -> str | None:
    """The CDU whose coolant feeds `node`'s tray, from the leak zones listing the node: the CDU that holds their
    isolation valve (`valve: cdu:point`: the valve that cuts a zone's coolant sits on the CDU feeding it), else
    the one CDU whose channels serve them. Failing those (no zone of its own, or channels of several CDUs and no
    valve of its own): the rack's loop, which is the CDU holding the rack's valve (`inventory.rack_valve`), else
    the one CDU holding every zone valve of the rack, else the inventory's only CDU (Modbus or Redfish kind cdu),
    else None (not guessed)."""
    known = {c.name for c in inv.cdus} | {r.name for r in inv.redfish if r.kind == "cdu"}

    def valve_cdu(point: str | None) -> set[str]:
        return {point.split(":", 1)[0]} & known if point else set()

    zones = [z for z in inv.leak_zones if node in z.nodes]
    by_valve = sorted(set().union(*(valve_cdu(z.valve) for z in zones)))
    if len(by_valve) == 1:
        return by_valve[0]
    names = {z.name for z in zones}
    mapped = sorted({c.name for c in inv.cdus if names & set(c.channels.values())})
    if len(mapped) == 1:
        return mapped[0]
    if by_valve:
        return None  # valves of several CDUs: not guessed
    rack = sorted(valve_cdu(inv.rack_valve)) \
        or sorted(set().union(*(valve_cdu(z.valve) for z in inv.leak_zones)))
    if len(rack) == 1 and (not mapped or rack[0] in mapped):
        return rack[0]
    return sorted(known)[0] if len(known) == 1 and not mapped else None


@dataclass
class _Gpu:
    gate_since: float | None = None
    r: float | None = None
    at: float | None = None  # monotonic time of the last sample smoothed in


def _own(snap: Snapshot, metric: str, node: str, **labels: str) -> dict[tuple[str, str], float]:
    """(gpu, uuid) -> value of this node's ok readings of one GPU family."""
    return {(r.label("gpu"), r.label("uuid")): r.value for r in snap.select(metric, **labels)
            if r.ok and r.labels.get("node", node) == node}


class ThermalResistanceSource:
    name = "derived"
    device = "thermal_resistance"

    def __init__(self, store: SnapshotStore, settings: "ThermalResistanceSettings", node: str, cdu: str | None,
                 baselines: ThermalBaselines):
        self.store = store
        self.s = settings
        self.node = node
        self.cdu = cdu
        self.baselines = baselines
        self.gpus: dict[tuple[str, str], _Gpu] = {}

    def _reason(self, key: tuple[str, str], temp: float | None, power: float | None, limit: float | None,
                util: float | None, supply: float | None, now: float) -> str | None:
        st = self.gpus.setdefault(key, _Gpu())
        if temp is None:
            reason: str | None = "no_temperature_reading"
        elif power is None:
            reason = "no_power_reading"
        elif self.cdu is None:
            reason = "no_supply_mapping"
        elif supply is None:
            reason = "no_supply_reading"
        elif limit is None or util is None or power < self.s.min_power_ratio * limit \
                or util < self.s.min_utilization_ratio:
            reason = "below_load_gate"
        else:
            if st.at is not None and now - st.at > GAP_KEPT_TAUS * self.s.smoothing_seconds:
                st.gate_since, st.r, st.at = None, None, None  # back after a long gap: afresh, settle included
            if st.gate_since is None:
                st.gate_since = now
            return "settling" if now - st.gate_since < self.s.settle_seconds else None
        if reason not in INPUT_GAPS:
            st.gate_since, st.r, st.at = None, None, None  # the gate closed: the next loaded spell starts afresh
        return reason

    def _smooth(self, st: _Gpu, sample: float, now: float) -> float:
        if st.r is None or st.at is None:
            st.r = sample
        else:
            st.r += (sample - st.r) * (1 - math.exp(-max(now - st.at, 0.0) / self.s.smoothing_seconds))
        st.at = now
        return st.r

    async def poll(self) -> PollResult:
        snap = self.store.snapshot()
        now, ts, node = snap.monotonic, snap.taken_at, self.node
        temps = _own(snap, "supernode_gpu_temperature_celsius", node, sensor="gpu")
        power = _own(snap, "supernode_gpu_power_watts", node)
        limits = _own(snap, "supernode_gpu_power_limit_watts", node, limit="default")
        util = _own(snap, "supernode_gpu_utilization_ratio", node, engine="gpu")
        supply = flow = None
        if self.cdu is not None:  # a Modbus CDU's registers or a Redfish CDU's coolant connectors alike
            supply = loop_value(snap, "supernode_cdu_temperature_celsius", cdu=self.cdu, loop="secondary",
                                point="supply")
            flow = loop_value(snap, "supernode_cdu_flow_cubic_meters_per_second", cdu=self.cdu, loop="secondary")
        band = flow_band(flow, self.s.baseline_flow_band_ratio) if flow is not None and flow > 0 else None
        out: list[Reading] = []
        for key in sorted(set(temps) | set(power)):
            labels = {"gpu": key[0], "uuid": key[1]}
            st = self.gpus.setdefault(key, _Gpu())
            prev_at = st.at
            reason = self._reason(key, temps.get(key), power.get(key), limits.get(key), util.get(key), supply, now)
            if reason is not None:  # only the reason that holds: six zeros a GPU said nothing (series budget)
                out.append(Reading(UNAVAILABLE, 1.0, {**labels, "reason": reason}, timestamp=ts))
            if band is not None:
                learnt = self.baselines.baseline(key[1], band)
                if learnt is not None:
                    out.append(Reading(BASELINE, learnt, labels, timestamp=ts))
            if reason is not None or supply is None:
                if band is not None:
                    out.append(Reading(LEARNING, self.baselines.learning(key[1], band), labels, timestamp=ts))
                continue
            r = self._smooth(st, (temps[key] - supply) / power[key], now)
            out.append(Reading(RESISTANCE, r, labels, timestamp=ts))
            if band is not None:
                if prev_at is not None:
                    self.baselines.add(key[1], band, r, now - prev_at)
                out.append(Reading(LEARNING, self.baselines.learning(key[1], band), labels, timestamp=ts))
        await self._save(now)
        return PollResult(out)

    async def _save(self, now: float, force: bool = False) -> None:
        """The baselines to disk when due, the write (an fsync) off the event loop: a slow disk never delays it."""
        data = self.baselines.pending(now, force)
        if data is not None:
            await asyncio.to_thread(self.baselines.write, data)

    async def close(self) -> None:
        await self._save(self.store.snapshot().monotonic, force=True)


def thermal_resistance_source(store: SnapshotStore, inv: "Inventory", settings: "ThermalResistanceSettings",
                              node: str, state_dir) -> ThermalResistanceSource:
    baselines = ThermalBaselines(state_dir / FILE_NAME, settings.baseline_learn_seconds, settings.persist_seconds)
    return ThermalResistanceSource(store, settings, node, supply_cdu(inv, node), baselines)
