"""Thin adapters for isolate_link, cdu_write and pdu_outlet over injected device functions.

Why injected: the link, Modbus and SNMP helpers own those protocols
(exporters/links/link_control.py, exporters/cooling/modbus_control.py, exporters/power/pdu.py); the engine
gets plain async-or-sync callables so this package never reaches into
collector internals, and a test can hand it the real functions.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ..calls import DEVICES, DeviceCallTimeout
from . import ActionError, ActionResult


async def _call(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Call a sync or async device function with a timeout; a sync one on the devices' own bounded pool."""
    try:
        return await DEVICES(fn, *args, **kw)
    except ActionError:
        raise
    except DeviceCallTimeout as exc:
        raise ActionError(str(exc)) from None
    except Exception as exc:  # the device refused or dropped the connection: a failed try, journaled, retried
        raise ActionError(f"{type(exc).__name__}: {exc}") from None


class IsolateLinkAction:
    """Take a redundant port down (undo: up). Ports not marked isolatable in the inventory are refused."""

    kind = "isolate_link"

    def __init__(self, isolate: Callable[[str, bool], Any], read_state: Callable[[str], Any], isolatable: set[str]):
        self.isolate = isolate
        self.read_state = read_state
        self.isolatable = set(isolatable)

    async def plan(self, target, params, ctx) -> dict:
        port = target["port"]
        if port not in self.isolatable:
            raise ActionError(f"port {port} is not marked isolatable in the inventory", guardrail="not_isolatable")
        state = await _call(self.read_state, port)
        return {"before": {"up": _is_up(state), "owned": _is_up(state)}}

    async def apply(self, target, params, ctx, plan) -> ActionResult:
        port = target["port"]
        if not plan["before"]["owned"]:
            return ActionResult(True, f"{port} already down", before=dict(plan["before"]), skipped=True)
        await _call(self.isolate, port, False)
        after = await _call(self.read_state, port)
        if _is_up(after):
            raise ActionError(f"read-back: {port} still up")
        return ActionResult(True, f"{port} down", before=dict(plan["before"]), after={"up": False})

    async def undo(self, target, before, after, params) -> ActionResult:
        port = target["port"]
        if not before.get("owned"):
            return ActionResult(True, f"{port} was down before us: left alone", skipped=True)
        await _call(self.isolate, port, True)
        return ActionResult(True, f"{port} up", after={"up": _is_up(await _call(self.read_state, port))})

    async def reconcile(self, target, params, plan) -> str:
        try:
            return "applied" if not _is_up(await _call(self.read_state, target["port"])) else "not_applied"
        except Exception:
            return "unknown"


def _is_up(state: Any) -> bool:
    if isinstance(state, bool):
        return state
    if isinstance(state, Mapping):
        return bool(state.get("admin_up", state.get("up", False)))
    if isinstance(state, str):
        return state.lower() in ("up", "unknown")
    return bool(getattr(state, "admin_up", getattr(state, "up", False)))


class CduWriteAction:
    """Write a profile-declared control point; undo writes back the recorded value."""

    kind = "cdu_write"

    def __init__(self, write: Callable[[str, str, float], Any], read: Callable[[str, str], Any]):
        self.write = write
        self.read = read

    async def plan(self, target, params, ctx) -> dict:
        before = await _call(self.read, target["cdu"], target["point"])
        return {"before": {"value": before, "owned": True}, "value": params["value"]}

    async def apply(self, target, params, ctx, plan) -> ActionResult:
        await _call(self.write, target["cdu"], target["point"], plan["value"])
        after = await _call(self.read, target["cdu"], target["point"])
        if float(after) != float(plan["value"]):
            raise ActionError(f"read-back: {target['point']} = {after}, wanted {plan['value']}")
        return ActionResult(True, f"{target['cdu']}:{target['point']} {plan['before']['value']} -> {after}",
                            before=dict(plan["before"]), after={"value": after})

    async def undo(self, target, before, after, params) -> ActionResult:
        await _call(self.write, target["cdu"], target["point"], before["value"])
        return ActionResult(True, f"{target['point']} restored to {before['value']}",
                            after={"value": await _call(self.read, target["cdu"], target["point"])})

    async def reconcile(self, target, params, plan) -> str:
        try:
            now = await _call(self.read, target["cdu"], target["point"])
        except Exception:
            return "unknown"
        return "applied" if float(now) == float(plan["value"]) else "not_applied"


class PowerSwitchAction:
    """Switch something's power (off by default) and read it back; undo switches it back on if we turned it off.

    One shape for a PDU outlet (SNMP) and a tray's power (Redfish ComputerSystem.Reset): `keys` are the
    target labels the device functions take, `what` names it in messages.
    """

    kind = "power_switch"
    keys: tuple[str, ...] = ()
    what = "power"

    def __init__(self, set_power: Callable[..., Any], get_power: Callable[..., Any]):
        self.set_power = set_power
        self.get_power = get_power

    def _name(self, target: Mapping[str, str]) -> str:
        return f"{self.what} {' '.join(target[k] for k in self.keys)}"

    async def _get(self, target: Mapping[str, str]) -> bool:
        return bool(await _call(self.get_power, *(target[k] for k in self.keys)))

    async def plan(self, target, params, ctx) -> dict:
        on = await self._get(target)
        want = params.get("state", "off") == "on"
        return {"before": {"on": on, "owned": on != want}, "on": want}

    async def apply(self, target, params, ctx, plan) -> ActionResult:
        if not plan["before"]["owned"]:
            return ActionResult(True, f"{self._name(target)} already in state", before=dict(plan["before"]),
                                skipped=True)
        await _call(self.set_power, *(target[k] for k in self.keys), plan["on"])
        now = await self._get(target)
        if now != plan["on"]:
            raise ActionError(f"read-back: {self._name(target)} on={now}")
        return ActionResult(True, f"{self._name(target)} {'on' if now else 'off'}", before=dict(plan["before"]),
                            after={"on": now})

    async def undo(self, target, before, after, params) -> ActionResult:
        if not before.get("owned"):
            return ActionResult(True, f"{self._name(target)} not switched by us", skipped=True)
        await _call(self.set_power, *(target[k] for k in self.keys), before["on"])
        return ActionResult(True, f"{self._name(target)} restored", after={"on": before["on"]})

    async def reconcile(self, target, params, plan) -> str:
        try:
            now = await self._get(target)
        except Exception:
            return "unknown"
        return "applied" if now == plan["on"] else "not_applied"


class PduOutletAction(PowerSwitchAction):
    """Switch a PDU outlet over SNMP; undo switches it back."""

    kind = "pdu_outlet"
    keys = ("pdu", "outlet")
    what = "outlet"


class TrayPowerAction(PowerSwitchAction):
    """Power a leaking tray off through its BMC (Redfish ComputerSystem.Reset ForceOff); undo powers it On.

    The undo is the playbook's `undo_approval: always`: a tray that leaked is powered on only once a
    person approves, whatever `guardrails.automatic` says.
    """

    kind = "tray_power"
    keys = ("bmc",)
    what = "tray"


