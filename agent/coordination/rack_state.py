"""Rack state in etcd that outlives any one agent: rack-wide guardrails and pending approvals.

Why transactions: "count, then act" without a lock lets N agents that fire
at once all see k drained nodes and all pass `max_drained_nodes`. Each
guardrail here is one key read, decided, and written back with a txn that
holds only if the key did not change in between (compare on its mod
revision); a loser reads again and decides again, so racing agents pass one
at a time and the limit holds.

Why no read first: these keys are in the agent's mirror of the rack (the
watch), and it knows its own last write, so the decision starts from that
value and the txn's compare proves it current; a lost race returns the
winner's value in the same txn (its failure branch). An uncontended update
is one round trip, which is the time between a leak's detector firing and
its first step acting (issue 13: leak -> drain within the poll + 100 ms).
The steps of one playbook start together (cap each GPU, drain the node):
their action counts go to etcd as one batch, one txn, rather than racing
each other for the key and sleeping between tries.

- `guard/drains`: drains in flight, node -> wall time. The scheduler stays the
  source of truth for who is drained (a person's drain counts); a reservation
  only covers the moments between "allowed" and the scheduler showing it,
  and lapses after `drain_reservation_seconds`.
- `guard/actions`: rack-wide action times for the circuit breaker and the
  per-kind hourly rates, and the breaker's own state (a person resets it on
  any agent).
- `approvals/<id>`: a destructive shared step waiting for a person, written
  by the leader that reached it. Approve on any agent; a new leader finds the
  record and carries on; an approval is consumed by the one step it was for,
  so a later episode of the same incident asks again.

Times in these keys are wall-clock times (the only clock agents share).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any, Callable

from agent.coordination.etcd import KV, EtcdError, cmp_create, cmp_mod, op_delete, op_get, op_put
from agent.coordination.records import ActionsDoc, Rejections, actions_doc, drains_doc

log = logging.getLogger("supernode.coordination")
CONTENTION_TRIES = 30


def rack_approval_id(incident_key: str, action: str, target: str, phase: str) -> str:
    return "rack-" + hashlib.sha1(f"{incident_key}|{action}|{target}|{phase}".encode()).hexdigest()[:12]


class RackState:
    """Mixed into EtcdCoordinator: needs self.client, self.root, self.up(), self.is_leader(), self.mirror."""

    def __init__(self, loaded):
        self.guardrails = loaded.config.remediation.guardrails
        self.reservation_seconds = loaded.config.coordination.drain_reservation_seconds
        self.skew = loaded.config.coordination.max_clock_skew_seconds
        self.inventory_nodes = frozenset(loaded.config.inventory.nodes or [loaded.config.agent.node])
        self.rejections = Rejections()
        self.local_pending: dict[str, Any] = {}  # rack approval id -> engine Pending
        self._written: dict[str, KV] = {}  # guard key -> our own last write (ahead of the mirror until its event)
        self._reservations: list[tuple[str, asyncio.Future]] = []  # action counts waiting for the next txn
        self._reserver: asyncio.Task | None = None

    # -- one guard key: read (known), decide, write if unchanged -----------------------------------------

    def _known(self, key: str) -> KV | None:
        """The newest value of `key` this agent knows without asking: its mirror's or its own last write's."""
        kvs = [kv for kv in (self.mirror.get(key), self._written.get(key)) if kv is not None]
        return max(kvs, key=lambda kv: kv.mod_revision) if kvs else None

    async def _update(self, key: str, parse: Callable[[KV | None], Any],
                      decide: Callable[[Any], tuple[Any, dict[str, Any] | None]],
                      read_first: bool = False) -> tuple[bool, Any]:
        """(True, answer) of `decide(parse(kv))` once its new doc is written over an unchanged key, or once it
        wrote nothing (None) on a value just read (a refusal is never decided on a value that may be stale);
        (False, None) when CONTENTION_TRIES racing agents won every time. EtcdError passes through.

        `parse` validates the record (agent.coordination.records): what fails is dropped and counted there, and
        the new doc written back holds only valid entries, so a garbled record is repaired by the next write."""
        fresh = read_first
        kv = await self.client.get(key) if read_first else self._known(key)
        for _ in range(CONTENTION_TRIES):
            doc = parse(kv)
            answer, new = decide(doc)
            if new is None:
                if fresh:
                    return True, answer
                kv, fresh = await self.client.get(key), True
                continue
            value = json.dumps(new, sort_keys=True)
            compare = cmp_mod(key, kv.mod_revision) if kv is not None else cmp_create(key, 0)
            ok, responses, rev = await self.client.txn([compare], [op_put(key, value)], [op_get(key)])
            if ok:
                self._written[key] = KV(key, value.encode(), kv.create_revision if kv is not None else rev, rev, 0)
                return True, answer
            try:  # lost the race: the winner's value came back with the refusal
                kvs = responses[0]["response_range"].get("kvs") or []
            except (KeyError, IndexError, TypeError):
                raise EtcdError(f"{key}: txn refused without the key's value") from None
            kv, fresh = (KV.from_json(kvs[0]) if kvs else None), True
        return False, None

    # -- drains -------------------------------------------------------------------------------------------

    async def check_drain(self, node: str, drained: list[str], rack_nodes: int, guard: Any) -> tuple[str, str] | None:
        """Blast radius counted on the scheduler's drained nodes plus the rack's drains in flight, reserved
        atomically; degraded (etcd unreachable): this agent's own count, as without coordination."""
        if not self.up():
            return guard.check_blast_radius(drained, rack_nodes, node)

        def decide(doc: dict[str, float]) -> tuple[tuple[str, str] | None, dict[str, Any] | None]:
            now = self.clock()
            held = {n: t for n, t in doc.items() if now - t < self.reservation_seconds}
            in_flight = sorted(set(held) - {node} - set(drained))
            blocked = guard.check_blast_radius(sorted(set(drained) | set(in_flight)), rack_nodes, node)
            if blocked:
                name, why = blocked
                if in_flight:
                    why += f"; counted rack-wide, in flight on other agents: {', '.join(in_flight)}"
                return (name, why), None
            held[node] = now
            return None, held

        try:
            done, answer = await self._update(f"{self.root}/guard/drains", self._drains, decide)
        except EtcdError as exc:
            log.warning("rack drain count unavailable; counting alone", extra={"error": str(exc)[:200]})
            return guard.check_blast_radius(drained, rack_nodes, node)
        except Exception:  # a bug here must never stop a drain: count alone, as without coordination
            log.exception("rack drain count failed; counting alone")
            return guard.check_blast_radius(drained, rack_nodes, node)
        if not done:
            return "rack_contention", f"could not reserve a drain of {node}: {CONTENTION_TRIES} agents raced for it"
        return answer

    def _drains(self, kv: KV | None) -> dict[str, float]:
        """The valid drain reservations of a guard/drains record (inventory nodes, times not in the future)."""
        return drains_doc(kv.value if kv is not None else None, self.inventory_nodes, self.clock(), self.skew,
                          self.rejections, kv.key if kv is not None else "", kv.mod_revision if kv is not None else 0)

    # -- breaker and rates --------------------------------------------------------------------------------

    def _actions(self, kv: KV | None, count: bool = True) -> ActionsDoc:
        return actions_doc(kv.value if kv is not None else None, self.inventory_nodes, self.clock(), self.skew,
                           self.rejections if count else None, kv.key if kv is not None else "",
                           kv.mod_revision if kv is not None else 0)

    def breaker_open(self) -> bool:
        """Asked for every incidents view: not counted again here (the record was counted when a step read it)."""
        return bool(self._actions(self.mirror.get(f"{self.root}/guard/actions"), count=False).breaker.get("open"))

    async def reserve_action(self, kind: str, guard: Any) -> tuple[str, str] | None:
        """Count one action of `kind` rack-wide (breaker window, hourly rate), or say which limit blocks it.
        Counts asked for together (one playbook's steps) go to etcd in one txn, in the order asked."""
        if not self.up():
            return None  # degraded: this agent's own guardrails only (checked already)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._reservations.append((kind, fut))
        if self._reserver is not None and self._reserver.get_loop() is not loop:  # a loop that ended
            self._reserver = None
            self._reservations = [r for r in self._reservations if r[1].get_loop() is loop]
        if self._reserver is None or self._reserver.done():
            self._reserver = loop.create_task(self._reserve_queued())
        return await fut

    async def _reserve_queued(self) -> None:
        """One txn at a time per agent, each with every count asked for since the last one went out."""
        while self._reservations:
            batch, self._reservations = self._reservations, []
            answers: list[tuple[str, str] | None]
            try:
                done, answers = await self._update(f"{self.root}/guard/actions", self._actions,
                                                   lambda doc: self._count_actions(doc, [k for k, _ in batch]))
                if not done:
                    answers = [("rack_contention", f"could not count a {k} action rack-wide: too many agents raced")
                               for k, _ in batch]
            except EtcdError as exc:
                log.warning("rack action count unavailable; counting alone", extra={"error": str(exc)[:200]})
                answers = [None] * len(batch)
            except Exception:  # a bug here must never stop a step: count alone, as without coordination
                log.exception("rack action count failed; counting alone")
                answers = [None] * len(batch)
            for (_, fut), answer in zip(batch, answers):
                if not fut.done():
                    fut.set_result(answer)

    def _count_actions(self, doc: ActionsDoc, kinds: list[str]
                       ) -> tuple[list[tuple[str, str] | None], dict[str, Any] | None]:
        """Each action's verdict in turn (the one that reaches breaker_max_actions runs and opens the breaker,
        the ones after it are blocked), and the doc to write (None when none of them was counted)."""
        s = self.guardrails
        now = self.clock()
        breaker = doc.breaker
        recent = [t for t in doc.recent if now - t <= s.breaker_window_seconds]
        counts = {k: [t for t in v if now - t <= 3600] for k, v in doc.kinds.items()}
        answers: list[tuple[str, str] | None] = []
        for kind in kinds:
            if breaker.get("open"):
                answers.append(("circuit_breaker", f"rack circuit breaker open since {breaker.get('at')} (opened by "
                                                   f"{breaker.get('by')}): a person resets it on any agent "
                                                   "(POST /api/v1/breaker/reset)"))
                continue
            limit = s.rate_per_hour.get(kind, s.rate_per_hour.get("default", 60))
            if len(counts.get(kind, [])) >= limit:
                answers.append(("rate_limit", f"rack-wide rate limit: {limit} {kind} actions per hour already taken"))
                continue
            recent.append(now)
            counts.setdefault(kind, []).append(now)
            if len(recent) >= s.breaker_max_actions:
                breaker = {"open": True, "at": now, "by": self.node}
                log.warning("rack circuit breaker opened", extra={"actions": len(recent)})
            answers.append(None)
        if all(a is not None for a in answers):
            return answers, None
        return answers, {"recent": recent, "kinds": counts, "breaker": breaker}

    async def reset_breaker(self, who: str) -> bool:
        def decide(doc: ActionsDoc) -> tuple[bool, dict[str, Any] | None]:
            if not (doc.breaker or doc.recent or doc.kinds):
                return False, None
            was = bool(doc.breaker.get("open"))
            return was, dict(doc.as_json(), recent=[], breaker={"open": False, "reset_by": who, "at": self.clock()})

        done, was = await self._update(f"{self.root}/guard/actions", self._actions, decide, read_first=True)
        return bool(done and was)

    # -- approvals ----------------------------------------------------------------------------------------

    def _approvals(self) -> dict[str, tuple[Any, dict[str, Any]]]:
        pre = f"{self.root}/approvals/"
        out = {}
        for key, kv in list(self.mirror.items()):
            if key.startswith(pre):
                try:
                    out[key[len(pre):]] = (kv, json.loads(kv.value))
                except ValueError:
                    continue
        return out

    def pending_added(self, pending: Any, incident: Any) -> None:
        """The leader reached a destructive shared step: make its approval rack state (or adopt one)."""
        if not (self.up() and self.is_leader()) or pending.action not in ("cdu_write", "pdu_outlet"):
            return
        rid = rack_approval_id(incident.key, pending.action, pending.target, pending.phase)
        pending.rack_id = rid
        self.local_pending[rid] = pending
        asyncio.get_running_loop().create_task(self._publish_pending(rid, pending, incident))

    async def _publish_pending(self, rid: str, p: Any, inc: Any) -> None:
        key = f"{self.root}/approvals/{rid}"
        doc = {"id": rid, "incident_key": inc.key, "detector": inc.detector, "targets": inc.targets,
               "playbook": p.playbook, "action": p.action, "target": p.target, "phase": p.phase,
               "approval": p.approval, "created_at": p.created_at, "expires_at": p.expires_at, "state": "pending",
               "requested_by": self.node}
        try:
            ok, responses, _ = await self.client.txn([cmp_create(key, 0)], [op_put(key, json.dumps(doc))],
                                                     [op_get(key)])
            if ok:
                return
            kvs = responses[0]["response_range"].get("kvs", [])
            if not kvs:
                return
            from agent.coordination.etcd import KV

            old = KV.from_json(kvs[0])
            existing = json.loads(old.value)
            live = existing.get("expires_at", 0) > self.clock() and existing.get("state") in ("pending", "approved")
            if live:
                self.mirror[key] = old
                self._resolve_if_approved(rid, existing)
                return
            # a consumed or lapsed record of an earlier episode: this step asks again
            await self.client.txn([cmp_mod(key, old.mod_revision)], [op_put(key, json.dumps(doc))])
        except (EtcdError, KeyError, IndexError, ValueError) as exc:
            log.warning("rack approval not recorded; approve on this agent", extra={"error": str(exc)[:200]})

    def pending_removed(self, pending: Any, approved: bool) -> None:
        rid = getattr(pending, "rack_id", None)
        if rid is None or self.local_pending.pop(rid, None) is None:
            return
        if approved and self.up():
            asyncio.get_running_loop().create_task(self._consume(rid, pending))

    async def _consume(self, rid: str, p: Any) -> None:
        key = f"{self.root}/approvals/{rid}"
        try:
            kv = await self.client.get(key)
            if kv is None:
                return
            doc = dict(json.loads(kv.value), state="consumed", consumed_by=self.node, consumed_at=self.clock())
            await self.client.txn([cmp_mod(key, kv.mod_revision)], [op_put(key, json.dumps(doc))])
        except (EtcdError, ValueError):
            pass

    def _resolve_if_approved(self, rid: str, doc: dict[str, Any]) -> None:
        p = self.local_pending.get(rid)
        if p is not None and doc.get("state") == "approved" and not p.future.done():
            log.info("rack approval seen", extra={"id": rid, "by": doc.get("approved_by")})
            p.future.set_result(True)

    def on_rack_change(self, key: str) -> None:
        pre = f"{self.root}/approvals/"
        if key.startswith(pre):
            rid = key[len(pre):]
            kv = self.mirror.get(key)
            if kv is not None:
                try:
                    self._resolve_if_approved(rid, json.loads(kv.value))
                except ValueError:
                    pass

    async def approve(self, ident: str, who: str, incidents: list[Any]) -> list[str]:
        """Approve rack-wide: by its rack id, or by this agent's own incident of the same fault (an open incident
        approves the steps that act on it, a resolved one the steps that undo it: an earlier episode's
        pending undo is not approved by approving this episode)."""
        mine = {(i.key, "apply" if i.state != "resolved" else "undo") for i in incidents if i.id == ident}
        done = []
        now = self.clock()
        for rid, (kv, doc) in self._approvals().items():
            if doc.get("state") != "pending" or doc.get("expires_at", 0) <= now:
                continue
            if ident != rid and (doc.get("incident_key"), doc.get("phase")) not in mine:
                continue
            doc = dict(doc, state="approved", approved_by=who, approved_at=now, approved_on=self.node)
            try:
                ok, _, _ = await self.client.txn([cmp_mod(kv.key, kv.mod_revision)], [op_put(kv.key, json.dumps(doc))])
            except EtcdError as exc:
                log.warning("rack approval not written", extra={"id": rid, "error": str(exc)[:200]})
                continue
            if ok:
                done.append(rid)
        return done

    def incident_closed(self, incident: Any) -> None:
        """The fault is over here: its shared steps still waiting for a person no longer need one."""
        if not self.up():
            return
        stale = [kv for kv, doc in self._approvals().values()
                 if doc.get("incident_key") == incident.key and doc.get("state") == "pending"
                 and doc.get("phase") == "apply"]
        if stale:
            asyncio.get_running_loop().create_task(self._drop(stale))

    async def _drop(self, kvs: list[Any]) -> None:
        for kv in kvs:
            try:
                await self.client.txn([cmp_mod(kv.key, kv.mod_revision)], [op_delete(kv.key)])
            except EtcdError:
                pass

    def pending_view(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [{"id": rid, "incident_id": doc.get("incident_key"), "playbook": doc.get("playbook"),
                 "action": doc.get("action"), "target": doc.get("target"), "phase": doc.get("phase"),
                 "approval": doc.get("approval"), "created_at": doc.get("created_at"),
                 "expires_at": doc.get("expires_at"), "rack": True, "requested_by": doc.get("requested_by")}
                for rid, (_, doc) in sorted(self._approvals().items())
                if doc.get("state") == "pending" and doc.get("expires_at", 0) > now]
