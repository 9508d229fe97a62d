"""gpu_power_cap's `thermal_margin` mode: one node's limits from the loop's capacity and each GPU's margin.

Why apart from the cap action: the cap acts on one GPU per step, the plan
needs all of the node's GPUs at once. The plan is made once per incident and
node (the first GPU's step reads every GPU through NVML, the others take
their limit from it), so every GPU of one decision sees the same inputs.
The decision itself is agent/remediation/derate.py's; what it was based on
(method, why, capacity, load, shed, each GPU's power and temperature) goes
into every step's plan, so the journal's intent says which method was used
and why. Missing inputs (the incident carries no flow, supply or return; the
loop's load is unknown; a GPU's NVML read fails) fall back to the flat
`fallback_fraction` of the default limit, saying so.

Across the rack (`share: rack`): with every tray of the loop's cooling summary
(agent.coordination.tray_cooling, through the rack's shared tray vectors) as
it was sent just before the loop changed (`rack_trays`), the rack's shed is
planned over every GPU of the loop and this node applies its own GPUs' cuts.
Why before: every agent opens its incident a moment apart, and a summary
read in a transient (the dies heating as the flow falls or the supply
warms) ranks the trays by when it was read; before the change each agent
finds the same steady figures (its own as it sent them), none lowered yet
by a tray's own caps. The same only if the rack was steady then: a summary
sent between two agents' look-back instants (their onsets are their own CDU
polls, up to a poll apart) is picked by the later one alone, so a tray whose
power was still moving then (a job starting, caps just undone) makes the two
plans differ by that move; each agent still applies its own tray's cut of its
own plan. A tray of the loop without a summary then (its agent
down, its record refused, just started), or no peers at all: each tray sheds
its own share of its own load (`share: tray`, with `share_why`).
"""

from __future__ import annotations

import math

import asyncio
from collections import OrderedDict
from typing import Any, Awaitable, Callable, Mapping

from ..derate import (DEFAULT_MAX_DELTA_T_C, DEFAULT_MAX_RETURN_C, GpuMargin, loop_capacity, loop_inputs,
                      plan_cuts, plan_rack)
from . import ActionError

PARAMS = {"mode", "fallback_fraction", "max_delta_t_celsius", "max_return_celsius", "density_kg_m3",
          "heat_capacity_j_kgk"}
KEEP = 16  # plans remembered (one per open incident and node)
# How long before the incident's onset (its opening less its detector's fire hold) the trays' margins are taken:
# before the loop changed, a CDU poll and a vector refresh earlier, so no tray's figures are mid-transient.
ONSET_MARGIN_SECONDS = 5.0


def _param(params: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    """A numeric step parameter within its range, or a permanent error naming it."""
    value = params.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo < float(value) <= hi:
        raise ActionError(f"gpu_power_cap thermal_margin: {name} must be a number in ({lo:g}, {hi:g}], got {value!r}",
                          permanent=True)
    return float(value)


def _gpu_facts(lib: Any, index: int) -> tuple[float, float, float, float]:
    """Power now, temperature, lowest limit and limit now of one GPU (watts, Celsius), from NVML."""
    h = lib.nvmlDeviceGetHandleByIndex(index)
    lo, _ = lib.nvmlDeviceGetPowerManagementLimitConstraints(h)
    return (lib.nvmlDeviceGetPowerUsage(h) / 1000.0, float(lib.nvmlDeviceGetTemperature(h, 0)), lo / 1000.0,
            lib.nvmlDeviceGetPowerManagementLimit(h) / 1000.0)


def capacity_params(params: Mapping[str, Any]) -> dict[str, float]:
    """The loop capacity's parameters from the step's (checked, with their defaults)."""
    return {"max_delta_t_c": _param(params, "max_delta_t_celsius", DEFAULT_MAX_DELTA_T_C, 0.0, 100.0),
            "max_return_c": _param(params, "max_return_celsius", DEFAULT_MAX_RETURN_C, 0.0, 150.0),
            "density_kg_m3": _param(params, "density_kg_m3", 1025.0, 500.0, 2000.0),
            "heat_capacity_j_kgk": _param(params, "heat_capacity_j_kgk", 3900.0, 1000.0, 5000.0)}


def check_params(params: Mapping[str, Any]) -> None:
    """Every parameter of a thermal_margin step known and in range (playbook load and each plan)."""
    unknown = sorted(set(params) - PARAMS)
    if unknown:
        raise ActionError(f"gpu_power_cap thermal_margin: unknown parameter(s) {', '.join(unknown)}", permanent=True)
    _param(params, "fallback_fraction", 0.6, 0.0, 1.0)
    capacity_params(params)


def _over_budget(ctx: Mapping[str, Any]) -> float:
    """What the rack draws over its PDU budget (watts, 0 within it or when either is unknown): the derate sheds
    at least that, so the cut also keeps the rack within its budget."""
    power, budget = ctx.get("rack_power_watts"), ctx.get("power_budget_watts")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (power, budget))
    return max(float(power) - float(budget), 0.0) if ok and budget else 0.0  # type: ignore[arg-type]


def shed_of(capacity_w: float, load_w: float) -> float:
    """The share of the load to shed so that it fits the capacity (0 when it does)."""
    return max(0.0, 1.0 - capacity_w / load_w) if load_w > 0 else 0.0


class MarginPlanner:
    """Plans for the cap action's thermal_margin mode, remembered per (incident, node)."""

    def __init__(self) -> None:
        self.plans: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self.locks: dict[tuple[str, str], asyncio.Lock] = {}
        # node -> each GPU's (power, temperature) when the first live derate of the node was planned: a second
        # coolant incident of the same loop (its other CDU, its supply) plans from the power before any of our
        # caps, never cutting a cut GPU again; forgotten when the caps are undone
        self.base: dict[str, dict[str, Any]] = {}
        self.stale: set[tuple[str, str]] = set()  # plans to make again at the next step (derate_watch.py)
        # the rack's shared tray summaries (agent.coordination.link_share.LinkShare; None: a lone tray), set by
        # the wiring: the derate is planned across the loop's trays from them
        self.share: Any = None
        self.rack_inputs: OrderedDict[str, dict[str, Any]] = OrderedDict()  # incident -> the trays it planned from

    def rack_trays(self, node: str, ctx: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]] | str:
        """The loop's trays' cooling summaries as each last sent them before the loop changed (the incident's
        onset less ONSET_MARGIN_SECONDS: every agent asks for its own incident's, a moment apart, and finds the
        same steady figures), with the trays of the loop that sent none then; or why the rack cannot be asked.
        The first complete answer is kept for the incident, so its re-plans weigh the trays alike."""
        share = self.share
        if share is None:
            return "no other tray to share with (no coordination peers): this tray sheds its own share"
        incident = str(ctx.get("incident_id", ""))
        if incident in self.rack_inputs:
            return self.rack_inputs[incident], []
        onset = ctx.get("incident_onset_at")
        if isinstance(onset, bool) or not isinstance(onset, (int, float)):
            return "the incident says not when the loop changed: this tray sheds its own share"
        got = {n: c for n, c in share.cooling_before(float(onset) - ONSET_MARGIN_SECONDS).items()
               if n in share.loop_nodes}
        missing = sorted(share.loop_nodes - set(got))
        if not missing:
            self.rack_inputs[incident] = got
            while len(self.rack_inputs) > KEEP:
                self.rack_inputs.popitem(last=False)
        return got, missing

    def plan_of(self, incident_id: str) -> dict[str, Any] | None:
        """The plan this agent applied for an incident (its node's), if any."""
        return next((p for (i, _), p in self.plans.items() if i == incident_id), None)

    def shed_now(self, node: str, loop: tuple[float, float, float], params: Mapping[str, Any]) -> float | None:
        """The share to shed for the loop as it is now, against the node's load before any of our caps (our caps
        lowered the load the loop reads now; the capacity depends on flow and supply alone)."""
        base = self.base.get(node)
        cap = loop_capacity(*loop, **capacity_params(params))
        if base is None or cap is None:
            return None
        return shed_of(cap.capacity_w, base["load_w"])

    def replan(self, incident_id: str) -> None:
        """An incident's next step plans again (from the same base); until then `plan_of` is the applied plan
        (a re-run a guardrail refuses is tried again later, against it)."""
        self.stale.update(k for k in self.plans if k[0] == incident_id)

    def forget(self, node: str) -> None:
        """The node's caps are undone: its next derate plans afresh."""
        self.base.pop(node, None)
        for key in [k for k in self.plans if k[1] == node]:
            self.plans.pop(key, None)
            self.locks.pop(key, None)
            self.stale.discard(key)
            self.rack_inputs.pop(key[0], None)

    async def node_plan(self, node: str, lib: Any, indices: list[int], params: Mapping[str, Any],
                        ctx: Mapping[str, Any], call: Callable[..., Awaitable[Any]]) -> dict[str, Any]:
        check_params(params)
        key = (str(ctx.get("incident_id", "")), node)
        lock = self.locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key not in self.plans or key in self.stale:
                self.stale.discard(key)
                self.plans[key] = await self._plan(node, lib, indices, params, ctx, call)
                while len(self.plans) > KEEP:
                    old, _ = self.plans.popitem(last=False)
                    self.locks.pop(old, None)
            return self.plans[key]

    async def _plan(self, node: str, lib: Any, indices: list[int], params: Mapping[str, Any],
                    ctx: Mapping[str, Any], call: Callable[..., Awaitable[Any]]) -> dict[str, Any]:
        fallback = _param(params, "fallback_fraction", 0.6, 0.0, 1.0)

        def flat(why: str) -> dict[str, Any]:
            return {"method": "flat", "why": why, "fraction": fallback}

        got = loop_inputs(ctx)
        if isinstance(got, str):
            return flat(got)
        cap = loop_capacity(*got, **capacity_params(params))
        if cap is None:
            flow, supply, ret = got
            return flat(f"the loop's load is unknown (flow {flow:g} m^3/s, return - supply {ret - supply:g} K)")
        supply = got[1]
        facts: dict[str, tuple[float, float, float, float]] = {}
        for i in indices:
            try:
                facts[str(i)] = await call(_gpu_facts, lib, i)
            except Exception as exc:  # NVMLError, a timeout: this GPU's margin is unknown
                return flat(f"gpu {i}: NVML: {type(exc).__name__}: {exc}")
        rack = self.rack_trays(node, ctx)
        trays = rack[0] if not isinstance(rack, str) and not rack[1] and node in rack[0] \
            and set(facts) <= set(rack[0][node].gpus) else None
        if node not in self.base and trays is not None:  # the power this tray said it draws, as the others read it
            own = trays[node].gpus
            self.base[node] = {"load_w": cap.load_w, "gpus": {k: (own[k].power_w, own[k].rise_k + supply)
                                                              for k in facts if k in own}}
        base = self.base.setdefault(node, {"load_w": cap.load_w,
                                           "gpus": {k: (p, t) for k, (p, t, _, _) in facts.items()}})
        facts = {k: (*base["gpus"].get(k, (p, t)), lo, limit) for k, (p, t, lo, limit) in facts.items()}
        gpus = [GpuMargin(k, p, t, lo) for k, (p, t, lo, _) in facts.items()]
        shed = shed_of(cap.capacity_w, base["load_w"])
        if trays is not None:  # the rack's power over its PDU budget is the rack's to shed: only a rack plan can
            return self._rack_plan(node, trays, facts, shed, _over_budget(ctx), cap, base, ctx)
        shed_w = shed * sum(g.power_w for g in gpus)
        cuts = plan_cuts(gpus, shed_w, supply)
        # A GPU whose cut is nil keeps its limit at a first plan (no cap at its draw of the moment); the others,
        # and every GPU of a re-plan (ours to raise again), go to their power before our caps less their cut.
        keep = not ctx.get("attempt")
        limits = {k: (facts[k][3] if cuts[k] <= 0 and keep else max(facts[k][0] - cuts[k], facts[k][2]))
                  for k in facts}
        missing = rack if isinstance(rack, str) else \
            f"no cooling summary of every GPU from {', '.join(rack[1]) or node} before the loop changed: each tray " \
            "sheds its own share"
        return {"method": "thermal_margin", "share": "tray", "share_why": missing,
                "why": f"the uncapped load is {base['load_w']:.0f} W, the loop can carry {cap.capacity_w:.0f} W "
                       f"within {cap.delta_t_allowed_c:.1f} K: shed {shed:.1%} of this node's GPU power",
                "capacity_watts": round(cap.capacity_w, 1), "load_watts": round(base["load_w"], 1),
                "shed_fraction": round(shed, 4), "shed_watts": round(shed_w, 1),
                "gpus": {k: {"power_watts": round(p, 1), "temp_celsius": t, "min_watts": lo,
                             "cut_watts": round(cuts[k], 1), "limit_watts": round(limits[k], 1)}
                         for k, (p, t, lo, _) in facts.items()}}

    @staticmethod
    def _rack_plan(node: str, trays: dict[str, Any], facts: dict[str, tuple[float, float, float, float]],
                   shed: float, floor: float, cap: Any, base: dict[str, Any], ctx: Mapping[str, Any]) -> dict[str, Any]:
        """The rack's shed water-filled over every GPU of the loop (derate.plan_rack) from the trays' shared
        summaries; this node applies its own GPUs' cuts, never below NVML's minimum."""
        margins = {n: [GpuMargin(k, g.power_w, g.rise_k, g.min_w) for k, g in c.gpus.items()]
                   for n, c in trays.items()}
        shed_w, cuts = plan_rack(margins, shed, floor)
        mine = {k: cuts[node].get(k, 0.0) for k in facts}
        keep = not ctx.get("attempt")
        limits = {k: (facts[k][3] if mine[k] <= 0 and keep else max(facts[k][0] - mine[k], facts[k][2]))
                  for k in facts}
        # fsum: exactly rounded, so every agent gets the same figure from the same summaries in any order (a plain
        # sum in each agent's order of the trays differed in the last bit, and rounded to 0.1 W apart)
        rack_w = math.fsum(g.power_w for gs in margins.values() for g in gs)
        return {"method": "thermal_margin", "share": "rack", "trays": sorted(trays),
                "why": f"the uncapped load is {base['load_w']:.0f} W, the loop can carry {cap.capacity_w:.0f} W "
                       f"within {cap.delta_t_allowed_c:.1f} K: shed {shed:.1%} of the loop's {len(trays)} trays' "
                       f"GPU power ({rack_w:.0f} W), by each GPU's margin across the trays",
                "capacity_watts": round(cap.capacity_w, 1), "load_watts": round(base["load_w"], 1),
                "shed_fraction": round(shed, 4), "rack_power_watts": round(rack_w, 1),
                "rack_shed_watts": round(shed_w, 1), "floor_watts": round(floor, 1),
                "tray_cuts_watts": {n: round(sum(c.values()), 1) for n, c in sorted(cuts.items())},
                "shed_watts": round(sum(mine.values()), 1),
                "gpus": {k: {"power_watts": round(p, 1), "temp_celsius": t, "min_watts": lo,
                             "cut_watts": round(mine[k], 1), "limit_watts": round(limits[k], 1)}
                         for k, (p, t, lo, _) in facts.items()}}

    @staticmethod
    def step_params(plan: Mapping[str, Any], index: int) -> dict[str, Any]:
        """What the cap's ordinary modes make of the plan for one GPU: its watts, or the flat fraction."""
        if plan["method"] == "flat":
            return {"fraction": plan["fraction"]}
        return {"watts": plan["gpus"][str(index)]["limit_watts"]}
