"""One agent's side of shared facts: its own polls out, the other pollers' polls into its store.

Whatever carries the facts (etcd keys, a static peer's stream), the rules are
the same: which poller's poll is taken (agent.coordination docs: one copy of
each poll, a safety input's wet poll from whichever poller read it first, a
newer poll never replaced by an older one), and nothing is stored before its
payload passed agent.coordination.facts.decode against this agent's own
source of that device.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from agent.coordination.facts import Fact, FactSchema, decode, is_wet, parse
from agent.coordination.records import RecordError


class FactExchange:
    """Both ends of shared facts in one agent, whatever carries them (etcd keys, a static peer's stream).

    Out: after this agent's own poll of a shared source it polls, `outgoing` gives the Fact to send.
    In: `ingest` puts another poller's fact in this agent's store under the same (source, device), so
    detectors, derived sources and the API see it as if polled here; a poller's failure is applied only
    when no other poller of that device read it fine within its staleness window (one poller's trouble is
    not the device's). `hidden` names the shared sources whose entry holds another agent's facts: not
    exported here, so a device's series come from its pollers only. A safety input's wet poll is taken from
    whichever poller read it (etcd: the standby polls half an interval out of the first's phase, so either
    may read a leak first); a poll older than the one in the store, from another poller, is dropped.
    """

    def __init__(self, node: str, jobs: dict[str, str], stale_after_intervals: float, clock: Callable[[], float],
                 safety: frozenset[str] = frozenset(), skew: float = 5.0):
        self.node = node
        self.jobs = jobs  # job id -> shared device
        self.safety = safety  # jobs whose wet polls are taken from any poller
        self.held: dict[str, tuple[float, str, float]] = {}  # job -> (poll start, poller, monotonic when taken)
        self.stale_after = stale_after_intervals
        self.clock = clock
        self.store: Any = None
        self.runners: dict[str, Any] = {}
        self.local: dict[str, bool] = {}  # job -> its store entry holds our own poll (not a fact)
        self.status: dict[str, dict[str, tuple[bool, float]]] = {}  # job -> poller -> (up, monotonic when)
        self.skew = skew  # coordination.max_clock_skew_seconds: how far ahead a fact's times may be
        self._schemas: dict[str, tuple[Any, FactSchema]] = {}  # job -> (the source it was built from, schema)
        self.ingesting = False
        self.published = 0
        self.received = 0

    def hidden(self) -> frozenset[tuple[str, str]]:
        return frozenset(tuple(j.split("/", 1)) for j in self.jobs if not self.local.get(j, False))

    def outgoing(self, snap: Any, origin: str, polling: bool) -> Fact | None:
        """Store listener side: the fact of our own poll of `origin`, or None (not shared, not ours, a fact in)."""
        if self.ingesting or origin not in self.jobs:
            return None
        self.local[origin] = True
        if not polling:
            return None
        source, _, device = origin.partition("/")
        st = next((s for s in snap.sources if s.source == source and s.device == device), None)
        if st is None:
            return None
        return Fact(self.node, source, device, st.up, list(st.readings) if st.up else [], st.last_duration or 0.0,
                    "" if st.up else "poll", st.last_error or "", {}, self.clock())

    def forget(self, job: str, poller: str) -> None:
        self.status.get(job, {}).pop(poller, None)

    def schema(self, job: str) -> FactSchema:
        """What facts of `job` may hold, from this agent's own source of that device (rebuilt if a reload
        replaced the source); RecordError for a job this agent has no source for."""
        runner = self.runners.get(job)
        if job not in self.jobs or runner is None:
            raise RecordError("unknown_job", f"{job[:80]!r} is no shared device source of this agent")
        cached = self._schemas.get(job)
        if cached is None or cached[0] is not runner.source:
            cached = self._schemas[job] = (runner.source, FactSchema.of(job, runner.source))
        return cached[1]

    def check(self, job: str, poller: str, raw: bytes | dict[str, Any]) -> Fact:
        """The fact `poller` filed for `job` (raw, or already parsed), checked (agent.coordination.facts.decode);
        RecordError when it is not one that device's source could publish now."""
        doc = raw if isinstance(raw, dict) else parse(raw)
        return decode(doc, self.schema(job), poller, self.clock(), self.skew)

    def wanted(self, job: str, poller: str, polling: Callable[[str], bool]) -> bool:
        """Would a fact of `job` by `poller` go into the store? Not our own, not one of a device this agent reads
        itself (once its own poll is in), not one it has no source for. Asked before a fact is decoded."""
        return not (poller == self.node or job not in self.jobs or job not in self.runners or self.store is None
                    or (polling(self.jobs[job]) and self.local.get(job)))

    def ingest(self, job: str, poller: str, raw: bytes | dict[str, Any], polling: Callable[[str], bool]
               ) -> str | None:
        """Take `poller`'s fact of `job` (who filed it is the transport's to prove) if wanted; the reason when it
        is not taken. RecordError (never stored) when its payload fails its checks."""
        if not self.wanted(job, poller, polling):
            return "not for us"
        return self.take(job, poller, self.check(job, poller, raw))

    def take(self, job: str, poller: str, fact: Fact) -> str | None:
        """Put a checked fact in the store, unless another poller's newer or first-slot poll stands."""
        now = time.monotonic()
        status = self.status.setdefault(job, {})
        status[poller] = (fact.up, now)
        self.received += 1
        runner = self.runners.get(job)
        interval = runner.settings.interval if runner is not None else 1.0
        window = interval * self.stale_after
        if not fact.up and any(ok and now - at <= window for p, (ok, at) in status.items() if p != poller):
            return None  # another poller reads it fine: one poller's trouble is not the device's
        started = fact.at - fact.duration
        held = self.held.get(job)
        if held is not None and held[1] != poller and now - held[2] <= window and started < held[0]:
            return None  # an older poll than the one in the store, from another poller: the newer one stands
        if fact.up and not (job in self.safety and is_wet(fact)) \
                and any(ok and p < poller and now - at <= window for p, (ok, at) in status.items()):
            return None  # the device's first poller answers: one copy of each poll is enough (half the work)
        self.ingesting = True
        try:
            if fact.up:
                self.store.publish(fact.source, fact.device, fact.readings, fact.duration, fact.partial_errors)
            else:
                self.store.fail(fact.source, fact.device, "remote", f"{poller}: {fact.error}", fact.duration)
            self.local[job] = False
            self.held[job] = (started, poller, now)
        except KeyError:  # a device this agent's config does not list
            return "not in this agent's inventory"
        finally:
            self.ingesting = False
        return None
