"""COV subscriptions of one source's leak and alarm points: made and renewed from its polls, confirmed by a notification.

Why from the polls and not a task of their own: a subscription is only worth
having while the device answers, and the poll is what finds that out; a poll
that reads the device also (re)subscribes what is due, so nothing runs
against a device that is down, and a device that restarted (and forgot its
subscriptions) is subscribed again within one renewal period. Renewal is due
at half the lifetime, so one lost renewal still leaves the old subscription
alive. A subscription counts as confirmed only once a notification for it
arrives (the standard has the device notify at once on a subscription): a
device that acknowledges and then never notifies stays "polled only", which
`supernode_bacnet_cov_up` says. Polling runs underneath either way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from bacpypes3.primitivedata import ObjectIdentifier

from exporters.cooling.bacnet.client import BacnetError, BacnetLink
from exporters.model import SourceError

log = logging.getLogger("supernode.bacnet")
UNSUPPORTED_RETRY_S = 600.0  # a device that refused COV is asked again this long after (its config may change)


@dataclass
class _Subscription:
    process_id: int | None = None
    renew_at: float = 0.0
    confirmed: bool = False


class CovWatch:
    def __init__(self, link: BacnetLink, objects: list[ObjectIdentifier], sink: Callable[[ObjectIdentifier, str, Any], None],
                 lifetime: int = 300, enabled: bool = True, clock: Callable[[], float] = time.monotonic):
        self.link = link
        self.lifetime = max(10, int(lifetime))
        self.enabled = enabled and bool(objects)
        self.clock = clock
        self._sink = sink
        self.subs: dict[ObjectIdentifier, _Subscription] = {o: _Subscription() for o in objects}
        self.unsupported: str | None = None  # why push is off for this device, if it refused
        self._retry_at = 0.0

    @property
    def up(self) -> bool:
        """Every point subscribed and confirmed by a notification."""
        return self.enabled and self.unsupported is None and all(s.confirmed for s in self.subs.values())

    def notified(self, objid: ObjectIdentifier) -> None:
        """A notification for `objid` arrived (the device's first one may come before its SubscribeCOV ack)."""
        sub = self.subs.get(objid)
        if sub is not None and self.unsupported is None:
            sub.confirmed = True

    def deliver(self, objid: ObjectIdentifier, prop: str, value: Any) -> None:
        """A value of a notification (bacpypes3 calls this per value): the source's sink, and the confirmation."""
        self.notified(objid)
        self._sink(objid, prop, value)

    async def maintain(self) -> None:
        """Subscribe or renew what is due; called after a poll that read the device. Never fails the poll."""
        if not self.enabled:
            return
        now = self.clock()
        info = self.link.info
        if self.unsupported is not None and now < self._retry_at:
            return
        if info is not None and not info.cov:
            self._refused("the device does not list SubscribeCOV among its services", now)
            return
        self.unsupported = None
        for objid, sub in self.subs.items():
            if now < sub.renew_at:
                continue
            try:
                sub.process_id = await self.link.subscribe(objid, self.lifetime, self.deliver, sub.process_id)
                sub.renew_at = now + self.lifetime / 2
            except BacnetError as exc:
                self._refused(f"SubscribeCOV {objid}: {exc.reason}", now)
                return
            except SourceError:  # unanswered: the previous subscription (if any) still runs; try at the next poll
                sub.confirmed = False
                return

    def _refused(self, why: str, now: float) -> None:
        if self.unsupported != why:
            log.info("COV push off: polling only", extra={"device": self.link.name, "why": why})
        self.unsupported = why
        self._retry_at = now + UNSUPPORTED_RETRY_S
        for sub in self.subs.values():
            if sub.process_id is not None:
                self.link.drop_subscription(sub.process_id)
            sub.process_id, sub.renew_at, sub.confirmed = None, 0.0, False

    def lost(self) -> None:
        """The device stopped answering: a restart forgets subscriptions, so each is made again at the next read."""
        for sub in self.subs.values():
            sub.renew_at = 0.0
            sub.confirmed = False

    async def close(self, timeout: float = 1.0) -> None:
        """Cancel every subscription at the device (bounded: a dead device is not waited for)."""
        subs = [(o, s.process_id) for o, s in self.subs.items() if s.process_id is not None]
        for sub in self.subs.values():
            sub.process_id, sub.renew_at, sub.confirmed = None, 0.0, False
        if not subs:
            return
        try:
            async with asyncio.timeout(timeout):
                for objid, pid in subs:
                    await self.link.unsubscribe(objid, pid)
        except (TimeoutError, SourceError):
            for _, pid in subs:
                self.link.drop_subscription(pid)
