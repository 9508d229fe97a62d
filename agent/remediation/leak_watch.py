"""While a tray leaks, the trays watched below it are read at the leak interval, not at their own schedule.

Why: a tray BMC is polled every `sources.redfish.interval` (2 s), its events aside (SSE or push, where the BMC
offers them). Below a leaking tray, where the water runs, that is the slowest reading of the rack's most likely
next leak; so while the tray's incident is open, every `leak_scope.watch_poll_seconds` (the leak rope's 0.5 s)
the agent asks each watched tray's BMC source for a poll now (the runtime's `poll_now`, the same path a first
wet reading's confirmation takes). Only the sources this agent has are read: the rack leader's, with
`sources.redfish.watch_rack_trays`. Part of RemediationEngine.
"""

from __future__ import annotations

import asyncio

from .incidents import Incident


class LeakWatch:
    """Part of RemediationEngine: see the module docstring."""

    def watched_sources(self, inc: Incident) -> list[str]:
        """The job ids (`redfish/<bmc>`) of the trays a tray leak watches below it."""
        watched = {n for n in inc.detail.get("watched") or () if isinstance(n, str)}
        inv = self.inventory
        bmcs = [e.name for e in getattr(inv, "redfish", []) if e.kind == "tray" and e.node in watched]
        bmcs += [s.bmc for s in getattr(inv, "switch_trays", []) if s.name in watched]
        return [f"redfish/{b}" for b in sorted(bmcs)]

    async def watch_below(self, inc: Incident) -> None:
        """Poll the watched trays' BMCs every `watch_poll_seconds` until the tray's incident resolves."""
        jobs = self.watched_sources(inc)
        every = self.settings.leak_scope.watch_poll_seconds
        while jobs and self.started and inc.state != "resolved":
            if self.repoll is not None:
                for job in jobs:
                    self.repoll(job)
            await asyncio.sleep(every)
