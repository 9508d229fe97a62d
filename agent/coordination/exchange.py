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
from exporters.model import Kind

COUNTER = Kind.COUNTER


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
                 safety: frozenset[str] = frozenset(), skew: float = 5.0, heartbeat: float = 0.0,
                 read_counters: frozenset[str] = frozenset(), monotonic: Callable[[], float] = time.monotonic):
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
        # Facts out only when they say something new (see `due`): at least every `heartbeat` seconds (0: every
        # poll), at once when what a detector reads changed (every gauge's value, the counters in read_counters).
        self.heartbeat = heartbeat
        self.read_counters = read_counters
        self._sent: dict[str, tuple[tuple, float]] = {}  # job -> (what its last fact out said, monotonic when)
        self.withheld = 0  # polls not sent: nothing a detector reads changed and no heartbeat was due
        self.monotonic = monotonic
        self.ingesting = False
        self.published = 0
        self.received = 0

    def hidden(self) -> frozenset[tuple[str, str]]:
        return frozenset(tuple(j.split("/", 1)) for j in self.jobs if not self.local.get(j, False))

    def outgoing(self, snap: Any, origin: str, polling: bool) -> Fact | None:
        """Store listener side: the fact of our own poll of `origin`, or None (not shared, not ours, a fact in)."""
        if self.ingesting or origin not in self.jobs:
            return None
        if self.local.get(origin) is False:  # our own polls again: staleness counted in our own interval
            runner = self.runners.get(origin)
            if runner is not None:
                source, _, device = origin.partition("/")
                self.store.register(source, device, runner.settings.interval, self.stale_after)
        self.local[origin] = True
        if not polling:
            return None
        source, _, device = origin.partition("/")
        st = next((s for s in snap.sources if s.source == source and s.device == device), None)
        if st is None:
            return None
        return Fact(self.node, source, device, st.up, list(st.readings) if st.up else [], st.last_duration or 0.0,
                    "" if st.up else "poll", st.last_error or "", {}, self.clock())

    def due(self, job: str, fact: Fact, beat: bool = False) -> bool:
        """Whether this poll of `job` goes out now (called last, right before it is sent; True records it as sent).

        Why not every poll: the leak inputs are polled twice a second and nearly every poll reads what the last
        one did; each fact out is an encode and an etcd put at the poller and a watch event decoded at every
        agent (issue 38). So a fact goes out when what a detector reads changed (up or not, the error, every
        gauge's value and quality, the counters detectors read), whenever a safety input reads wet (the
        confirmation's second wet poll included: every wet poll reaches every agent at once), and otherwise
        every `heartbeat` seconds, which keeps the receivers' entries fresh (`fed_interval`). `beat`: it is the
        heartbeat of a poll that was vouched fresh without a publish (`heartbeat_due`)."""
        if self.heartbeat <= 0:
            return True
        said = self._said(fact)
        if beat:  # the heartbeat of a poll vouched fresh (`heartbeat_due` said it is time)
            self._sent[job] = (said, self.monotonic())
            return True
        now = self.monotonic()
        last = self._sent.get(job)
        if last is not None and last[0] == said and now - last[1] < self.heartbeat \
                and not (job in self.safety and is_wet(fact)):
            self.withheld += 1
            return False
        self._sent[job] = (said, now)
        return True

    def heartbeat_due(self, job: str) -> bool:
        """Whether a poll of `job` that said nothing new (a source vouched fresh without publishing) is due out as
        the heartbeat: this agent sent a fact of it before, and the heartbeat falls before its next tick. Why half
        a tick early: a source ticking every `heartbeat` seconds (a Redfish BMC's 2 s) would otherwise miss it by a
        millisecond of jitter every other tick, and its facts arrive two heartbeats apart, at the receivers' edge
        of stale."""
        last = self._sent.get(job)
        if self.heartbeat <= 0 or last is None:
            return False
        runner = self.runners.get(job)
        tick = runner.settings.interval if runner is not None else 0.0
        return self.monotonic() - last[1] >= self.heartbeat - 0.5 * min(tick, self.heartbeat)

    def touched(self, origin: str, publish: Callable[..., None]) -> None:
        """Store touch listener's work: our own poll of a shared device vouched fresh without a publish (it read the
        same, or its event stream stands in for the timer's poll): its fact goes out anyway through `publish` (the
        coordinator's store listener, with beat=True) once the heartbeat is due, or the agents reading it from us
        would count it stale while it is not."""
        if origin in self.jobs and self.store is not None and self.heartbeat_due(origin):
            publish(self.store.snapshot(), origin, beat=True)

    def resend(self) -> None:
        """The next poll of every job goes out whatever it says (a new session: the old facts went with its lease)."""
        self._sent.clear()

    def _said(self, fact: Fact) -> tuple:
        counters = self.read_counters
        return (fact.up, fact.error_kind, tuple(
            (r.spec.name, tuple(r.labels.items()), r.value if r.value == r.value else None, r.quality)
            for r in fact.readings if r.spec.kind is not COUNTER or r.spec.name in counters))

    def fed_interval(self, job: str) -> float:
        """How often a fact of `job` arrives at the least (its poll interval, or the heartbeat when that is longer):
        what a receiver's store entry, and the windows below, count staleness in."""
        runner = self.runners.get(job)
        interval = runner.settings.interval if runner is not None else 1.0
        return max(interval, self.heartbeat)

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
        fed = self.fed_interval(job)
        window = fed * self.stale_after
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
            # fed by facts: stale once `stale_after` heartbeats are missing (set at every fact: a session's start
            # sets the safety inputs back to their own interval)
            self.store.register(fact.source, fact.device, fed, self.stale_after)
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


def detector_counters() -> frozenset[str]:
    """The counter families some detector reads: a change of one of them sends a fact at once (other counters, a
    client's requests and the like, change with every poll and wait for the heartbeat)."""
    from agent.remediation.detectors import Detectors

    return Detectors.counters()
