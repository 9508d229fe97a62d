"""notify: POST the incident as a JSON event to the configured URL. No undo."""

from __future__ import annotations

from typing import Any, Mapping

import aiohttp

from . import ActionError, ActionResult


class NotifyAction:
    kind = "notify"

    def __init__(self, url: str | None, timeout: float = 5.0):
        self.url = url
        self.timeout = timeout

    async def plan(self, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict:
        if not self.url:
            raise ActionError("notify: no remediation.notify_url configured", permanent=True)
        facts = {k: v for k, v in ctx.items() if isinstance(v, (str, int, float, dict, list))}
        return {"before": {}, "event": {"message": params.get("message", ""), **facts}}

    async def apply(self, target, params, ctx, plan) -> ActionResult:
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout)) as s:
                async with s.post(self.url, json=plan["event"]) as resp:
                    if resp.status >= 300:
                        raise ActionError(f"notify: {self.url} answered {resp.status}")
                    return ActionResult(True, f"posted ({resp.status})", after={"status": resp.status})
        except aiohttp.ClientError as exc:
            raise ActionError(f"notify: {exc}") from exc

    async def undo(self, target, before, after, params) -> ActionResult:
        return ActionResult(True, "notify has no undo", skipped=True)

    async def reconcile(self, target, params, plan) -> str:
        return "unknown"
