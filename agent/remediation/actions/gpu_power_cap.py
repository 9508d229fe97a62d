"""gpu_power_cap: set an NVML power limit (watts, fraction of default, `min`, a rack budget share, or by margin).

`mode: thermal_margin` (the coolant playbooks): the node's limits from the
loop's capacity and each GPU's thermal margin (margin_cap.py, derate.py),
the flat `fallback_fraction` where an input is missing.

The limit is clamped to the GPU's own constraints, read back, and the limit
found before is recorded so undo restores exactly that, and only if the
limit is still the one we set (a person who changed it since wins). A retried apply (the write or its read-back
failed) knows a limit at its own target as its own earlier write, so the cap keeps its owner and its undo.
`libs` maps node -> an object with pynvml's function names (real pynvml
or the simulator's NVML twin); calls are blocking, so they run on NVML's own bounded pool (agent.remediation.calls)
with a timeout.
"""

from __future__ import annotations

from typing import Any, Mapping

from . import ActionError, ActionResult
from .margin_cap import MarginPlanner
from .nvml_gpu import GpuActionBase

try:  # the shared NVML control helpers, when present
    from exporters.gpu.nvml_control import get_power_limit, set_power_limit  # type: ignore
except ImportError:  # pragma: no cover - same signatures, used until that module lands
    def get_power_limit(lib: Any, index: int) -> float:
        h = lib.nvmlDeviceGetHandleByIndex(index)
        return lib.nvmlDeviceGetPowerManagementLimit(h) / 1000.0

    def set_power_limit(lib: Any, index: int, watts: float) -> float:
        h = lib.nvmlDeviceGetHandleByIndex(index)
        lo, hi = lib.nvmlDeviceGetPowerManagementLimitConstraints(h)
        mw = int(min(max(watts * 1000.0, lo), hi))
        lib.nvmlDeviceSetPowerManagementLimit(h, mw)
        return lib.nvmlDeviceGetPowerManagementLimit(h) / 1000.0


def _constraints(lib: Any, index: int) -> tuple[float, float, float]:
    h = lib.nvmlDeviceGetHandleByIndex(index)
    lo, hi = lib.nvmlDeviceGetPowerManagementLimitConstraints(h)
    default = lib.nvmlDeviceGetPowerManagementDefaultLimit(h)
    return lo / 1000.0, hi / 1000.0, default / 1000.0


class GpuPowerCapAction(GpuActionBase):
    kind = "gpu_power_cap"

    def __init__(self, libs: Mapping[str, Any], lock_timeout: float = 5.0):
        self.libs = dict(libs)
        self.timeout = lock_timeout
        self.margins = MarginPlanner()
        # Writes sent whose outcome an attempt did not learn (the write or its read-back failed): (incident, re-run,
        # node, gpu) -> the limit sent. The step runner retries a failed apply; the retry re-reads the limit and
        # must know a limit at its own target as its own earlier write, not another incident's cap (that would
        # leave the cap with no owner, and nothing to undo it).
        self._unconfirmed: dict[tuple[str, str, str, int], float] = {}

    def _wanted(self, lib: Any, index: int, params: Mapping[str, Any], ctx: Mapping[str, Any]) -> tuple[float, dict]:
        lo, hi, default = _constraints(lib, index)
        current = get_power_limit(lib, index)
        if "watts" in params:
            want = float(params["watts"])
        elif params.get("limit") == "min":
            want = lo
        elif "fraction" in params:
            want = default * float(params["fraction"])
        elif params.get("mode") == "rack_budget":
            budget, power = ctx.get("budget_watts"), ctx.get("power_watts")
            if not budget or not power:
                raise ActionError("rack_budget mode needs budget_watts and power_watts in the incident", permanent=True)
            want = current * float(budget) / float(power) * float(params.get("headroom", 0.95))
        else:
            raise ActionError("gpu_power_cap needs watts, fraction, limit: min or mode: rack_budget", permanent=True)
        return min(max(want, lo), hi), {"min_watts": lo, "max_watts": hi, "default_watts": default, "current": current}

    async def plan(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict:
        """Read the current limit and work out the clamped one; recorded in the intent."""
        lib, index = self._lib(target["node"]), int(target["gpu"])
        derate = None
        try:
            if params.get("mode") == "thermal_margin":
                count = int(await self._call(lambda lib_, _: lib_.nvmlDeviceGetCount(), lib, index))
                derate = await self.margins.node_plan(target["node"], lib, list(range(count)), params, ctx,
                                                      self._call)
                params = MarginPlanner.step_params(derate, index)
            want, info = await self._call(self._wanted, lib, index, params, ctx)
        except ActionError:
            raise
        except Exception as exc:  # NVMLError and friends
            raise ActionError(f"NVML: {type(exc).__name__}: {exc}") from exc
        # a re-plan of a derate may raise a limit of ours again (the loop recovered part of its capacity): the
        # plan never goes above the GPU's power before the first cap, and the undo restores the limit before it
        # (derate_watch.py says whether another kind of incident holds a cap here: then never raised)
        owned = want < info["current"] or (derate is not None and bool(ctx.get("attempt"))
                                           and ctx.get("derate_raise_ok") is True and abs(want - info["current"]) > 1.0)
        out = {"before": {"limit_watts": info["current"], "owned": owned}, "want_watts": want,
               "raise": owned and want >= info["current"], **info}
        if derate is not None:  # the decision this limit comes from, journaled with the step's intent
            out["derate"] = derate
        return out

    async def apply(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any],
                    plan: Mapping[str, Any]) -> ActionResult:
        lib, index = self._lib(target["node"]), int(target["gpu"])
        before, want = plan["before"]["limit_watts"], plan["want_watts"]
        if not plan["before"]["owned"]:
            return ActionResult(True, f"limit {before:.0f} W already at or below {want:.0f} W",
                                before=dict(plan["before"]), after={"limit_watts": before}, skipped=True)
        sent = (str(ctx.get("incident_id", "")), str(ctx.get("attempt", "")), target["node"], index)
        try:
            # Read again just before the write: another incident's cap of the same GPU (the loop's Modbus and its
            # Redfish CDU open one each, planned at the same moment) may have landed since this plan read the
            # limit, and a cap never raises another's lower limit (only a derate's own re-plan may raise its own)
            now = await self._call(get_power_limit, lib, index)
            ours = sent in self._unconfirmed and abs(now - self._unconfirmed[sent]) <= 1.0
            if not plan.get("raise") and now <= want + 1.0 and not ours:
                return ActionResult(True, f"limit {now:.0f} W already at or below {want:.0f} W",
                                    before={"limit_watts": now, "owned": False}, after={"limit_watts": now},
                                    skipped=True)
            self._unconfirmed[sent] = want
            while len(self._unconfirmed) > 256:  # caps that failed for good: their markers age out
                del self._unconfirmed[next(iter(self._unconfirmed))]
            applied = await self._call(set_power_limit, lib, index, want)
            readback = await self._call(get_power_limit, lib, index)
        except Exception as exc:
            raise ActionError(f"NVML: {type(exc).__name__}: {exc}") from exc
        if abs(readback - want) > 1.0:
            raise ActionError(f"read-back: limit {readback:.0f} W, wanted {want:.0f} W")
        self._unconfirmed.pop(sent, None)
        return ActionResult(True, f"gpu {index} limit {before:.0f} -> {readback:.0f} W", before=dict(plan["before"]),
                            after={"limit_watts": readback, "applied_watts": applied})

    async def undo(self, target: Mapping[str, str], before: Mapping[str, Any], after: Mapping[str, Any],
                   params: Mapping[str, Any]) -> ActionResult:
        lib, index = self._lib(target["node"]), int(target["gpu"])
        self.margins.forget(target["node"])  # the node's derate ends with its caps
        if not before.get("owned"):
            return ActionResult(True, "limit was not changed by us", skipped=True)
        try:
            current = await self._call(get_power_limit, lib, index)
            ours = after.get("limit_watts")
            if ours is not None and abs(current - float(ours)) > 1.0:
                return ActionResult(True, f"limit now {current:.0f} W, not the {ours:.0f} W we set: left alone",
                                    after={"limit_watts": current}, skipped=True)
            await self._call(set_power_limit, lib, index, float(before["limit_watts"]))
            readback = await self._call(get_power_limit, lib, index)
        except Exception as exc:
            raise ActionError(f"NVML: {type(exc).__name__}: {exc}") from exc
        if abs(readback - float(before["limit_watts"])) > 1.0:
            raise ActionError(f"read-back: limit {readback:.0f} W, wanted {before['limit_watts']} W")
        return ActionResult(True, f"gpu {index} limit restored to {readback:.0f} W", after={"limit_watts": readback})

    async def reconcile(self, target: Mapping[str, str], params: Mapping[str, Any], plan: Mapping[str, Any]) -> str:
        try:
            lib, index = self._lib(target["node"]), int(target["gpu"])
            current = await self._call(get_power_limit, lib, index)
        except Exception:
            return "unknown"
        return "applied" if abs(current - float(plan["want_watts"])) <= 1.0 else "not_applied"
