"""The etcd backend: a leased membership, an elected and fenced leader, leased poller slots, shared facts.

Keys, all under `<prefix>/<rack>/`:

| key | lease | value |
| --- | --- | --- |
| `members/<node>` | the agent's | who is alive |
| `leader` | the leader's | its node; the key's mod revision is the fencing token |
| `pollers/<device>/<slot>` | the poller's | its node (at most `pollers_per_device` slots) |
| `facts/<source>/<device>/<node>` | the poller's | its last poll of that device (agent.coordination.facts) |
| `approvals/<id>`, `guard/...` | none | rack state that outlives any one agent (agent.coordination.rack_state) |
| `maintenance/<node>` | none | a person's maintenance of that node: {by, since, until, set_via} (coordination.maintenance) |
| `links/<node>` | the node's | its NVLink state vector (agent.coordination.link_vectors), for the rack's attribution |
| `drill/<node>` | the node's | its fault drill document: a drill it conducts (signed), its part in one (agent/drill) |

A fact is taken only from the agent that holds a poller slot of that device:
the key's node holds `pollers/<device>/<slot>` (slot < pollers_per_device) and
the fact key, that slot and `members/<node>` carry one and the same lease.
The job comes from the key, never from the payload, and the payload must be
one this agent's own source of that device could publish (facts.decode).
Anything else is rejected and counted (`key_kind="fact"`). A link vector is taken only
under its node's member lease (only that node's agent holds it; its role alone may write `links/<node>`) and
when it passes link_vectors.decode (`key_kind="links"`); a drill document likewise only under its node's member
lease (`key_kind="drill"`, checked further by agent/drill/rack.py). A poller claims its
slot before its first poll, so its first fact always follows the slot in the
watch (revision order); a fresh mirror applies the facts after every other key.

One session = one lease. Everything an agent holds is under that lease, so
a dead agent's leadership, slots and facts vanish together when it stops
renewing (`lease_ttl_seconds`). Each agent mirrors the rack's keys (one range,
then one watch) and decides from the mirror: campaign when there is no
leader, claim a free slot of a device it ranks high enough for (rendezvous
order over the live members), publish a fact after a poll of a device it
holds that says something new (exchange.FactExchange.due: a change a detector
reads, a wet leak input, or the heartbeat), put every other poller's fact in
its own store.

The agent never trusts a role longer than its lease can be proven alive: a
keepalive answered at t proves the lease until t + TTL, so past that
deadline (etcd unreachable, or this process stopped and resumed) it stops
polling shared devices, stops leading, and degrades (agent.coordination
docs: each agent polls the leak inputs itself, at a bounded rate).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable

from agent.auth import token_map
from agent.coordination.etcd import (EtcdClient, EtcdError, Event, KV, LeaseGone, WatchCompacted, cmp_create,
                                     cmp_mod, cmp_value, op_delete, op_put)
from agent.coordination.exchange import FactExchange, detector_counters
from agent.coordination.facts import Fact, encode, is_wet
from agent.coordination.link_share import LinkShare
from agent.coordination.maintenance import RackMaintenance, Record
from agent.coordination.rack_state import RackState
from agent.coordination.records import RecordError
from agent.coordination.shared import SharedDevices, leader_jobs, ranked, shared_devices

log = logging.getLogger("supernode.coordination")
MONOTONIC = time.monotonic
# The decision loop's wake-up when no watch event came: the link verdict's ageing and the leaderless clock. Every
# change of members, leader or slots wakes it at once (issue 38: it ran every 0.5 s, 0.15 % of a core idle).
RECHECK_SECONDS = 1.0


class EtcdCoordinator(RackState):
    backend = "etcd"
    shared = True

    def __init__(self, loaded, clock: Callable[[], float] = time.time):
        cfg = loaded.config
        coord = cfg.coordination
        self.settings = coord
        self.node = cfg.agent.node
        self.root = f"{coord.etcd.prefix}/{cfg.agent.rack}"
        self._facts_prefix = f"{self.root}/facts/"
        self.ttl = coord.lease_ttl_seconds
        self.shared: SharedDevices = shared_devices(cfg.inventory)
        self.leader_jobs = leader_jobs(cfg)  # the other trays' BMCs: read while this agent leads (watch_rack_trays)
        self.stale_after = cfg.sources.stale_after_intervals
        nodes = list(cfg.inventory.nodes) or [self.node]
        start = nodes.index(self.node) if self.node in nodes else 0
        user = coord.etcd.user_of(cfg.agent.rack, self.node)
        password = loaded.secret(coord.etcd.password_secret).get_secret_value() if user is not None else None
        self.client = EtcdClient(coord.etcd.endpoints, coord.etcd.request_timeout_seconds, coord.etcd.tls, start,
                                 user, password)
        self.clock = clock
        self.lease = 0
        self.deadline = 0.0  # monotonic time until which the lease is proven alive
        self.connected = False
        self.mirror: dict[str, KV] = {}
        self.token = 0  # the leader key's mod revision while we lead
        self.slots: dict[str, str] = {}  # device -> slot key we hold
        self.facts = FactExchange(self.node, self.shared.jobs, cfg.sources.stale_after_intervals, clock,
                                  self.shared.safety, coord.max_clock_skew_seconds, coord.fact_heartbeat_seconds,
                                  detector_counters())
        self._slot_keys = {d: tuple(f"{self.root}/pollers/{d}/{i}" for i in range(coord.pollers_per_device))
                           for d in self.shared.devices}
        self.poll_now: Callable[[str], bool] | None = None
        self.runners: dict[str, Any] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task | None = None
        self.engine: Any = None
        self._was_leader = False
        self._degraded_last: dict[str, float] = {}
        self._seen: dict[str, dict[str, float]] = {}  # job -> poller -> when its last fact arrived
        self._puts: dict[str, bytes] = {}  # job -> the next fact to put (one put in flight per job)
        self._putting: set[str] = set()
        self._wet_out: set[str] = set()  # safety jobs whose last fact this standby published was wet
        self.align: Callable[[str, float, float], bool] | None = None
        self._aligned_at: dict[str, float] = {}  # job -> when this standby last checked its phase
        self.fenced_total = 0
        self._leaderless_since: float | None = None  # monotonic; while coordinating with no valid leader
        self.sessions = 0
        self.last_error: str | None = None
        RackState.__init__(self, loaded)
        self.maintenance = RackMaintenance(self.node, self.inventory_nodes, self.skew, self.rejections, clock)
        self.maintenance.publisher = self._publish_maintenance
        self._maint_prefix = f"{self.root}/maintenance/"
        self._maint_out: dict[str, Record | None] = {}  # node -> this agent's record to write (None: delete)
        self._maint_task: asyncio.Task | None = None
        self._links_prefix = f"{self.root}/links/"
        self.links = LinkShare.of(cfg, self.inventory_nodes, self.skew, clock)  # None: a rack of one tray
        self._links_out: bytes | None = None  # this node's next link vector to put (one put in flight)
        self._links_task: asyncio.Task | None = None
        self._drill_prefix = f"{self.root}/drill/"
        self.drill_channel: Any = None  # the fault drill's (agent/drill/rack.py), set before start
        self._drill_out: bytes | None = None  # this node's next drill document to put (one put in flight)
        self._drill_last: bytes | None = None  # the last one (put again by a new session: the old went with its lease)
        self._drill_task: asyncio.Task | None = None
        self._links_leader = False  # whether the last verdict published was published as the leader

    @property
    def rack(self) -> "EtcdCoordinator":
        return self

    # -- state the rest of the agent reads ---------------------------------------------------------------

    def up(self) -> bool:
        return self.connected and MONOTONIC() < self.deadline

    def is_leader(self) -> bool:
        if not self.up() or not self.token:
            return False
        kv = self.mirror.get(f"{self.root}/leader")
        return kv is not None and kv.lease == self.lease and kv.mod_revision == self.token

    def role(self) -> str:
        if not self.up():
            return "degraded"
        return "leader" if self.is_leader() else "follower"

    def polls(self, device: str) -> bool:
        return device in self.slots and self.up()

    def polling(self) -> dict[str, bool]:
        return {d: self.polls(d) for d in self.shared.devices}

    def leader_node(self) -> str | None:
        """The rack's leader as the mirror proves it, or None (see `_leader_problem`)."""
        kv = self.mirror.get(f"{self.root}/leader")
        return None if kv is None or self._leader_problem(kv) else kv.value.decode()

    def _leader_problem(self, kv: KV) -> tuple[str, str] | None:
        """(why, detail) when the leader key names no leader: only a current member's live lease makes one.

        A key written without a lease (a "ghost"), under a lease that is not its node's member lease, or naming a
        node outside the inventory would otherwise stop every agent from campaigning (the key exists) while no
        agent leads: shared steps (the zone valve) would silently do nothing."""
        if not kv.lease:
            return "no_lease", "the leader key is held under no lease"
        node = kv.value.decode(errors="replace")
        if node not in self.inventory_nodes:
            return "unknown_node", f"the leader key names {node[:60]!r}, not a node of the rack"
        if not self._under_member_lease(node, kv.lease):
            return "not_member", f"the leader key's lease is not {node}'s live member lease"
        return None

    def _under_member_lease(self, node: str, lease: int) -> bool:
        """Whether `lease` is the live lease of `node`'s member key: what proves a key (the leader, a fact) was
        written by that node's running agent, since only it holds that lease. Dict lookups only."""
        member = self.mirror.get(f"{self.root}/members/{node}")
        return bool(lease) and member is not None and member.lease == lease

    def no_leader_seconds(self) -> float:
        """How long this agent, coordinating, has seen no leader (0 while it sees one, or while degraded)."""
        since = self._leaderless_since
        return 0.0 if since is None or not self.up() else max(0.0, MONOTONIC() - since)

    def _track_leader(self) -> None:
        if self.up() and self.leader_node() is None:
            if self._leaderless_since is None:
                self._leaderless_since = MONOTONIC()
        else:
            self._leaderless_since = None

    def describe(self) -> dict[str, Any]:
        """What the status page says of the rack's coordination: up or degraded (and why), who leads, who is alive."""
        up = self.up()
        return {"backend": "etcd", "up": up, "leader": self.leader_node() if up else None, "leads": self.is_leader(),
                "members": self.members() if up else None, "polling": self.polling(),
                "why": "" if up else (self.last_error or "no etcd session yet")}

    def members(self) -> list[str]:
        """The rack's live agents: inventory nodes whose member key is held under a lease and names them."""
        pre = f"{self.root}/members/"
        return sorted(k[len(pre):] for k, kv in self.mirror.items()
                      if k.startswith(pre) and kv.lease and k[len(pre):] in self.inventory_nodes
                      and kv.value == k[len(pre):].encode())

    def bind(self, engine: Any) -> None:
        """The remediation engine running now: told when this agent becomes leader (carry on the shared
        steps of open incidents) and when coordination returns (steps queued while degraded go to the leader)."""
        self.engine = engine

    # -- hooks into the runtime -----------------------------------------------------------------------------

    @property
    def facts_published(self) -> int:
        return self.facts.published

    @property
    def facts_received(self) -> int:
        return self.facts.received

    def gate_runners(self, runners: dict[str, Any]) -> None:
        self.runners = self.facts.runners = runners
        for job_id, runner in runners.items():
            if job_id in self.shared.jobs:
                runner.gate = (lambda j=job_id: self._gate(j))
            elif job_id in self.leader_jobs:
                runner.gate = self._leads

    def _safety_intervals(self, degraded: bool) -> None:
        """Degraded, a leak input is polled here every degraded_poll_interval_seconds: its readings stay fresh
        for that long (else the leak watch would call the zone unknown between two bounded polls)."""
        store = self.facts.store
        if store is None:
            return
        for job in self.shared.safety:
            runner = self.runners.get(job)
            if runner is None:
                continue
            source, _, device = job.partition("/")
            interval = runner.settings.interval
            if degraded:
                interval = max(interval, self.settings.degraded_poll_interval_seconds)
            store.register(source, device, interval, self.stale_after)

    def _gate(self, job_id: str) -> bool | None:
        """May this agent poll this shared source now? Its slot's holder yes; degraded: safety inputs, bounded.
        None: not ours (another agent holds the slot): the source lets go of what it holds open on the device."""
        device = self.shared.jobs[job_id]
        if self.polls(device):
            return True
        if self.up() or job_id not in self.shared.safety:
            return None
        now = MONOTONIC()
        if now - self._degraded_last.get(job_id, -1e9) < self.settings.degraded_poll_interval_seconds:
            return False
        self._degraded_last[job_id] = now
        return True

    def _leads(self) -> bool | None:
        """The gate of another tray's BMC (watch_rack_trays): read by the elected leader only."""
        return True if self.is_leader() else None

    def idle(self) -> frozenset[tuple[str, str]]:
        """Sources this agent has but neither polls nor gets facts for now: the other trays, while not leading."""
        if not self.leader_jobs or self.is_leader():
            return frozenset()
        return frozenset(tuple(j.split("/", 1)) for j in self.leader_jobs)  # type: ignore[misc]

    def hidden(self) -> frozenset[tuple[str, str]]:
        """Shared sources whose store entry holds another agent's facts, and the idle ones: not exported here
        (a shared device's series come from its pollers, another tray's from the leader only)."""
        return self.facts.hidden() | self.idle()

    def on_publish(self, snap: Any, origin: str, beat: bool = False) -> None:
        """Store listener: after our own poll of a device we hold, publish it as that device's fact; after our
        own NVML poll, our link vector (agent.coordination.link_share)."""
        if origin.startswith("nvml/"):
            if self.links is not None:
                self._own_links(snap)
            return
        device = self.shared.jobs.get(origin)
        fact = self.facts.outgoing(snap, origin, device is not None and self.polls(device))
        if fact is None or not self._publishes(origin, device, fact) or not self.facts.due(origin, fact, beat):
            return
        self._puts[origin] = encode(fact)
        if origin not in self._putting:
            self._putting.add(origin)
            asyncio.get_running_loop().create_task(self._put_facts(origin))

    def _publishes(self, job: str, device: str, fact: Fact) -> bool:
        """The first slot's poller publishes; the second is a hot standby that publishes only while the first's
        facts are missing (one copy of each poll in etcd and at every agent, and no gap when the first dies).

        A safety input's standby also publishes a wet poll, and the first dry one after it: it polls half an
        interval out of the first's phase (`_align`), so its wet reading is the rack's earliest news of a leak
        in half the polls; the dry one leaves its key telling the truth once the leak is gone."""
        first = self.mirror.get(f"{self.root}/pollers/{device}/0")
        if first is None or first.lease == self.lease:
            return True
        if job in self.shared.safety:
            wet, was = is_wet(fact), job in self._wet_out
            (self._wet_out.add if wet else self._wet_out.discard)(job)
            if wet or was:
                return True
        window = self.facts.fed_interval(job) * self.stale_after  # the first's facts come a heartbeat apart at least
        return MONOTONIC() - self._seen.get(job, {}).get(first.value.decode(), -1e9) > window

    def _own_links(self, snap: Any) -> None:
        """Our vector counts here at once (the verdict is published now); its put follows, one in flight."""
        raw = self.links.own(snap)
        if self.up():
            self.links.publish()
        if raw is None:
            return
        self._links_out = raw
        if self._links_task is None or self._links_task.done():
            self._links_task = asyncio.get_running_loop().create_task(self._put_links())

    async def _put_links(self) -> None:
        while self.links is not None and self._links_out is not None and self.up():
            value, self._links_out = self._links_out, None
            try:
                await self.client.put(f"{self._links_prefix}{self.node}", value, self.lease)
            except EtcdError as exc:
                self._note_error(exc)
                self.links.resend()
                return

    def _link(self, ev: Event) -> None:
        """Another tray's vector: taken only under its node's member lease and when it checks out."""
        kv = ev.kv
        node = kv.key[len(self._links_prefix):]
        if self.links is None:
            return
        if ev.type == "DELETE":
            self.links.forget(node)
        else:
            try:
                if not self._under_member_lease(node, kv.lease):
                    raise RecordError("not_member", f"links/{node[:60]!r}: written under lease {kv.lease:x}, not "
                                                    "that node's live member lease")
                self.links.accept(node, kv.value)
            except RecordError as exc:
                self.links.forget(node)
                self.rejections.error("links", kv.key, kv.mod_revision, exc)
                return
        if self.up():
            self.links.publish()

    # -- fault drills -----------------------------------------------------------------------------------------

    def publish_drill(self, raw: bytes) -> None:
        """This node's drill document to `drill/<node>` (under our lease); the latest only, one put in flight."""
        self._drill_out = self._drill_last = raw
        if self.up() and (self._drill_task is None or self._drill_task.done()):
            self._drill_task = asyncio.get_running_loop().create_task(self._put_drill())

    async def _put_drill(self) -> None:
        while self._drill_out is not None and self.up():
            value, self._drill_out = self._drill_out, None
            try:
                await self.client.put(f"{self._drill_prefix}{self.node}", value, self.lease)
            except EtcdError as exc:
                self._note_error(exc)
                return

    def drill_peers(self) -> set[str]:
        """The rack's live agents (each mirrors every drill key) while this one coordinates."""
        return set(self.members()) if self.up() else set()

    def _drill(self, ev: Event) -> None:
        """Another node's drill document: handed on only under its node's member lease (only its agent holds it;
        only its role may write the key); the drill channel checks the rest."""
        kv = ev.kv
        node = kv.key[len(self._drill_prefix):]
        if self.drill_channel is None or node == self.node:
            return
        if ev.type != "DELETE" and not self._under_member_lease(node, kv.lease):
            self.rejections.reject("drill", "not_member", kv.key, kv.mod_revision,
                                   f"drill/{node[:60]!r}: written under lease {kv.lease:x}, not that node's live "
                                   "member lease")
            self.drill_channel.received(node, None, kv.key, kv.mod_revision)
            return
        self.drill_channel.received(node, None if ev.type == "DELETE" else kv.value, kv.key, kv.mod_revision)

    async def _put_facts(self, job: str) -> None:
        try:
            while job in self._puts:
                value = self._puts.pop(job)
                if not self.up():
                    return
                try:
                    await self.client.put(f"{self.root}/facts/{job}/{self.node}", value, self.lease)
                    self.facts.published += 1
                except EtcdError as exc:
                    self._note_error(exc)
        finally:
            self._putting.discard(job)

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self, agent: Any) -> None:
        self.facts.store = agent.store
        if self.links is not None:
            self.links.attach(agent.store, self.stale_after, RECHECK_SECONDS)
        self.poll_now = agent.scheduler.poll_now
        self.align = getattr(agent.scheduler, "align", None)
        self.admin_tokens = lambda: token_map(agent.loaded.admin_tokens)  # the tokens of the running config
        agent.store.add_listener(self.on_publish)
        agent.store.add_touch_listener(lambda origin: self.facts.touched(origin, self.on_publish))
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        for task in (self._task, self._maint_task, self._links_task, self._drill_task):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self.lease and self.up():
            try:  # hand everything over at once rather than after a TTL
                async with asyncio.timeout(1.0):
                    await self.client.lease_revoke(self.lease)
            except (EtcdError, asyncio.TimeoutError):
                pass
        await self.client.close()

    async def _run(self) -> None:
        delay = 0.2
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                raise
            except LeaseGone as exc:
                self._note_error(exc)
                self.lease = 0
            except EtcdError as exc:
                self._note_error(exc)
            except Exception as exc:  # a bug here must never stop the agent; it degrades instead
                log.exception("coordination session crashed")
                self._note_error(exc)
            self._lost()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.ttl / 2)
            if self.connected:
                delay = 0.2

    def _note_error(self, exc: Exception) -> None:
        msg = f"{type(exc).__name__}: {exc}"[:300]
        if msg != self.last_error:
            log.warning("coordination: etcd trouble", extra={"error": msg, "lease_valid": self.up()})
        self.last_error = msg

    def _lost(self) -> None:
        """The session ended: nothing held can be proven any more."""
        was = self.connected
        self.connected = False
        self.token = 0
        self.slots.clear()
        self._was_leader = False
        self._safety_intervals(degraded=True)
        if self.drill_channel is not None:
            self.drill_channel.lost_all()  # no peer's drill can be proven now: each ends here (a safe undo)
        if was:
            log.warning("coordination lost: degraded (own node only; leak inputs polled here, bounded)",
                        extra={"error": self.last_error})

    async def _session(self) -> None:
        c = self.client
        reused = False
        if self.lease:
            t = MONOTONIC()
            try:
                await c.lease_keepalive(self.lease)
                self.deadline, reused = t + self.ttl, True
            except LeaseGone:
                self.lease = 0
        if not self.lease:
            t = MONOTONIC()
            self.lease = await c.lease_grant(self.ttl)
            self.deadline = t + self.ttl
        await c.put(f"{self.root}/members/{self.node}", self.node, self.lease)
        kvs, rev = await c.get_prefix(self.root + "/")
        self._load(kvs)
        self.connected = True
        self.facts.resend()  # the old session's facts went with its lease
        if self.links is not None:
            self.links.resend()  # the old session's key went with its lease
        if self._drill_last is not None:
            self.publish_drill(self._drill_last)
        self._safety_intervals(degraded=False)
        self.sessions += 1
        self.last_error = None
        log.info("coordination up", extra={"lease": f"{self.lease:x}", "reused": reused,
                                           "members": len(self.members()), "endpoint": c.endpoint})
        if self.engine is not None:
            self.engine.coordination_back()
        self._flush_maintenance_soon()  # maintenance set here while etcd was away (or at start)
        tasks = [asyncio.ensure_future(x) for x in (self._keepalive(), self._watch(rev + 1), self._reconcile())]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            while True:
                t = MONOTONIC()
                try:
                    await self.client.lease_keepalive(self.lease)
                except LeaseGone:
                    raise
                except EtcdError as exc:
                    self._note_error(exc)
                    if MONOTONIC() >= self.deadline:
                        raise EtcdError(f"lease not renewed for {self.ttl:g} s: {exc}") from None
                    await asyncio.sleep(0.2)
                    continue
                self.deadline = t + self.ttl
                self.last_error = None
                break

    async def _watch(self, rev: int) -> None:
        while True:
            try:
                async for events in self.client.watch(self.root + "/", rev):
                    decide = False
                    for ev in events:
                        rev = max(rev, ev.kv.mod_revision + 1)
                        decide |= self._apply(ev)
                    if decide:  # membership, leader or slots moved: decide again (a fact changes no decision)
                        self._changed.set()
            except WatchCompacted:
                kvs, now = await self.client.get_prefix(self.root + "/")
                self._load(kvs)
                rev = now + 1
            except EtcdError as exc:
                self._note_error(exc)
                await asyncio.sleep(0.1)

    def _load(self, kvs: list[KV]) -> None:
        """A fresh mirror from one range read (a new session, or a watch past compaction): the facts last, each
        checked against the slots read with it (a range comes sorted by key, and `facts/` sorts before `members/`
        and `pollers/`), and the link vectors after the members whose lease they must carry."""
        self.mirror = {}
        self.maintenance.records.clear()
        if self.links is not None:
            self.links.forget_peers()  # what this read holds is all there is
        if self.drill_channel is not None:  # a drill whose document is not in this read has ended
            present = {kv.key[len(self._drill_prefix):] for kv in kvs if kv.key.startswith(self._drill_prefix)}
            for peer in [p for p in self.drill_channel.announced if p not in present]:
                self.drill_channel.received(peer, None, f"{self._drill_prefix}{peer}", 0)
        for kv in sorted(kvs, key=lambda kv: kv.key.startswith((self._facts_prefix, self._links_prefix,
                                                                 self._drill_prefix))):
            self._apply(Event("PUT", kv))

    def _apply(self, ev: Event) -> bool:
        """Mirror one event; True when it may change a decision (anything but a fact)."""
        key = ev.kv.key
        if key.startswith(self._facts_prefix):
            self._fact(ev)
            return False
        if key.startswith(self._links_prefix):
            self._link(ev)
            return False
        if key.startswith(self._drill_prefix):
            self._drill(ev)
            return False
        if ev.type == "DELETE":
            self.mirror.pop(key, None)
        else:
            self.mirror[key] = ev.kv
        if key.startswith(self._maint_prefix):
            node = key[len(self._maint_prefix):]
            if ev.type == "DELETE":
                self.maintenance.forget(node)
            else:
                self.maintenance.accept(node, ev.kv.value, key, ev.kv.mod_revision)
        self.on_rack_change(key)  # also on a fresh session's first read: an approval given while we were away
        return True

    # -- maintenance set on this agent ------------------------------------------------------------------------

    def _publish_maintenance(self, node: str, record: Record | None) -> None:
        """A person set (or ended) a node's maintenance here, journaled already: write it to the rack's key."""
        self._maint_out[node] = record
        if self.up():
            self._flush_maintenance_soon()

    def _flush_maintenance_soon(self) -> None:
        if not self._maint_out or (self._maint_task is not None and not self._maint_task.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop yet (engine restored before the agent runs): the session start writes it
            return
        self._maint_task = loop.create_task(self._flush_maintenance())

    async def _flush_maintenance(self) -> None:
        """Write each queued record (no lease: a person's word outlives this agent); what fails waits for the next
        session, which writes it again."""
        while self._maint_out and self.up():
            node, record = next(iter(self._maint_out.items()))
            key = f"{self._maint_prefix}{node}"
            try:
                if record is None:
                    await self.client.delete(key)
                else:
                    await self.client.put(key, json.dumps(record, sort_keys=True))
            except EtcdError as exc:
                self._note_error(exc)
                return
            if self._maint_out.get(node, ...) is record:
                del self._maint_out[node]

    # -- facts from the other pollers -----------------------------------------------------------------------

    def _fact(self, ev: Event) -> None:
        kv = ev.kv
        job, _, poller = kv.key[len(self._facts_prefix):].rpartition("/")
        if ev.type == "DELETE":
            self.facts.forget(job, poller)
            return
        try:
            self._fact_sender(job, poller, kv)
            self._seen.setdefault(job, {})[poller] = MONOTONIC()
            self._align(job, poller, kv.value)
            self.facts.ingest(job, poller, kv.value, self.polls)
        except RecordError as exc:  # logged once per key until it is deleted (a forger may rewrite it often)
            self.rejections.error("fact", kv.key, kv.create_revision, exc)

    def _fact_sender(self, job: str, poller: str, kv: KV) -> None:
        """RecordError unless the fact's key names a shared job and a node that holds a poller slot of that
        device under the very lease the fact was written with (the lease of that node's member key): only
        the slot's holder can attach it. Dict lookups only: every fact event passes here."""
        device = self.shared.jobs.get(job)
        if device is None:
            raise RecordError("unknown_job", f"{job[:80]!r} is no shared device of this rack")
        if not self._under_member_lease(poller, kv.lease):
            raise RecordError("not_member", f"{poller[:60]!r}: the fact's lease {kv.lease:x} is no live member's "
                                            "of that name")
        name = poller.encode()
        for key in self._slot_keys[device]:
            slot = self.mirror.get(key)
            if slot is not None and slot.lease == kv.lease and slot.value == name:
                return
        raise RecordError("no_slot", f"{poller[:60]!r} holds no poller slot of {device}")

    def _align(self, job: str, poller: str, raw: bytes) -> None:
        """A standby of a safety input keeps its polls `slot / pollers_per_device` of an interval after the first
        slot's (checked at most every 2 s, from the first's own fact, checked: when its poll started). The first
        never moves, so the pollers cannot chase each other."""
        device = self.shared.jobs.get(job)
        slot = self.slots.get(device or "")
        if self.align is None or job not in self.shared.safety or slot is None or not self.up():
            return
        index = int(slot.rsplit("/", 1)[1])
        first = self.mirror.get(f"{self.root}/pollers/{device}/0")
        if index == 0 or first is None or first.value.decode() != poller:
            return
        now = MONOTONIC()
        if now - self._aligned_at.get(job, -1e9) < 2.0:
            return
        self._aligned_at[job] = now
        runner = self.runners.get(job)
        if runner is None:
            return
        fact = self.facts.check(job, poller, raw)
        offset = runner.settings.interval * index / self.settings.pollers_per_device
        if self.align(job, fact.at - fact.duration, offset):
            log.info("standby poll phase moved", extra={"job": job, "offset_s": round(offset, 3)})

    # -- decisions from the mirror ---------------------------------------------------------------------------

    async def _reconcile(self) -> None:
        while True:
            await self._campaign()
            await self._claim_slots()
            self._leadership_edges()
            self._track_leader()
            if self.links is not None:  # the verdict stays fresh while coordinating; ages out as vectors go stale
                self.links.publish(force=self._was_leader != self._links_leader)
                self._links_leader = self._was_leader
            self._changed.clear()
            try:  # every change of membership, leader or slots wakes it; the timeout only re-checks the clocks
                async with asyncio.timeout(RECHECK_SECONDS):
                    await self._changed.wait()
            except asyncio.TimeoutError:
                pass

    async def _campaign(self) -> None:
        key = f"{self.root}/leader"
        kv = self.mirror.get(key)
        if kv is not None:
            if kv.lease == self.lease and kv.value.decode() == self.node:
                self.token = kv.mod_revision  # ours (a session that reused its lease)
                return
            if self.token:
                self.token = 0
            problem = self._leader_problem(kv)
            if problem is None:
                return
            # Not a leader: remove it (only if unchanged since we read it), so the next round elects one.
            self.rejections.reject("leader", problem[0], key, kv.mod_revision, problem[1])
            ok, _, _ = await self.client.txn([cmp_mod(key, kv.mod_revision)], [op_delete(key)])
            if ok:
                log.warning("rack leader key removed: it named no leader", extra={"why": problem[1]})
                self.mirror.pop(key, None)
            else:
                return
        self.token = 0
        ok, _, rev = await self.client.txn([cmp_create(key, 0)], [op_put(key, self.node, self.lease)])
        if ok:
            self.mirror[key] = KV(key, self.node.encode(), rev, rev, self.lease)
            self.token = rev
            log.info("rack leader: this agent", extra={"token": rev, "lease": f"{self.lease:x}"})

    def _leadership_edges(self) -> None:
        now = self.is_leader()
        if now and not self._was_leader:
            for job in sorted(self.leader_jobs):  # the rack's trays: read them at once, not an interval later
                if self.poll_now is not None and job in self.runners:
                    self.poll_now(job)
        if now and not self._was_leader and self.engine is not None:
            try:
                self.engine.carry_on_as_leader()
            except Exception:
                log.exception("leadership hand-over failed")
        self._was_leader = now

    async def _claim_slots(self) -> None:
        k = self.settings.pollers_per_device
        live = self.members()
        for device in self.shared.devices:
            pre = f"{self.root}/pollers/{device}/"
            holders = {key: kv for key, kv in self.mirror.items() if key.startswith(pre)}
            mine = next((key for key, kv in holders.items() if kv.lease == self.lease), None)
            if mine is not None:
                if device not in self.slots:
                    self.slots[device] = mine
                    self._gained(device)
                continue
            self.slots.pop(device, None)
            if len(holders) >= k:
                continue
            holding = {kv.value.decode() for kv in holders.values()}
            candidates = [n for n in ranked(device, live) if n not in holding]
            if self.node not in candidates[:k - len(holders)]:
                continue
            free = next(f"{pre}{i}" for i in range(k) if f"{pre}{i}" not in holders)
            ok, _, rev = await self.client.txn([cmp_create(free, 0)], [op_put(free, self.node, self.lease)])
            if ok:
                self.mirror[free] = KV(free, self.node.encode(), rev, rev, self.lease)
                self.slots[device] = free
                log.info("polling shared device", extra={"device": device, "slot": free.rsplit("/", 1)[-1]})
                self._gained(device)

    def _gained(self, device: str) -> None:
        for job in self.shared.jobs_of(device):
            if self.poll_now is not None and job in self.runners:
                self.poll_now(job)

    # -- fencing ----------------------------------------------------------------------------------------------

    async def fence(self, what: str) -> None:
        """Prove we still lead, in etcd, right before a shared actuator write; raise Fenced otherwise.

        A txn that holds only while the leader key is still ours at the revision we were elected
        with: a deposed leader (its lease expired while it was stopped or cut off) is refused here
        even if it has not noticed yet.
        """
        if not self.is_leader():
            self.fenced_total += 1
            raise Fenced(f"{what}: this agent is not the rack leader ({self.role()}; leader "
                         f"{self.leader_node() or 'none'})")
        key = f"{self.root}/leader"
        token = self.token
        try:
            ok, _, _ = await self.client.txn([cmp_mod(key, token), cmp_value(key, self.node)], [])
        except EtcdError as exc:
            self.fenced_total += 1
            raise Fenced(f"{what}: cannot prove leadership to etcd: {exc}") from None
        if not ok:
            self.fenced_total += 1
            self.token = 0
            raise Fenced(f"{what}: leadership lost (the leader key moved past revision {token})")
        self.fence_now()

    def fence_now(self) -> None:
        """The last check before the write itself: the lease still proven alive (no await after it)."""
        if MONOTONIC() >= self.deadline:
            self.fenced_total += 1
            raise Fenced("leadership lease not proven alive (etcd unreachable, or this process was stopped)")


class Fenced(Exception):
    """A shared actuator write refused: this agent cannot prove it is the rack's leader now."""
