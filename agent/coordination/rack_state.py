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
  by the leader that reached it; the id names the episode (the leader's
  incident id). Approve on any agent: that agent writes the approval with a
  proof keyed with the person's admin token, which the leader checks with its
  own copy before it journals and acts (agent.coordination.approvals: the
  record alone proves nothing). An approval is consumed by the one step it
  was for, so a later episode of the same incident asks again.

Times in these keys are wall-clock times (the only clock agents share).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable

from agent.coordination.etcd import KV, EtcdError, cmp_create, cmp_mod, op_delete, op_get, op_put
from agent.auth import token_map
from agent.coordination import approval_evidence
from agent.coordination.approvals import Step, approval_of, approval_proof, pending_record, rack_approval_id
from agent.coordination.records import (ActionsDoc, RecordError, Rejections, actions_doc, drains_doc, parse_json,
                                        wall_time)

log = logging.getLogger("supernode.coordination")
CONTENTION_TRIES = 30


# Detection lag between two agents' incidents of one leak (a poll, a fact through etcd): with the clock skew
# allowed, the leader's incident of an episode opened within this of another agent's incident of it. Episodes of
# one fault further apart than this are told apart.
EPISODE_LAG_SECONDS = 10.0


class RackState:
    """Mixed into EtcdCoordinator: needs self.client, self.root, self.up(), self.is_leader(), self.mirror."""

    def __init__(self, loaded):
        self.guardrails = loaded.config.remediation.guardrails
        self.reservation_seconds = loaded.config.coordination.drain_reservation_seconds
        self.skew = loaded.config.coordination.max_clock_skew_seconds
        self.inventory_nodes = frozenset(loaded.config.inventory.nodes or [loaded.config.agent.node])
        self.rejections = Rejections()
        self.local_pending: dict[str, Any] = {}  # rack approval id -> engine Pending
        self._publishing: set[str] = set()  # rack approval ids whose record is being written now
        # name -> admin token: the proof of a rack approval is keyed with one (EtcdCoordinator.start follows reloads)
        self.admin_tokens: Callable[[], dict[str, Any]] = lambda: token_map(loaded.admin_tokens)
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
    # The leader writes a pending record per destructive shared step; a person approves on any agent, which
    # writes the approval with a proof made with that person's admin token (agent.coordination.approvals); the
    # leader checks the proof against its own copy of the token and journals who approved before it acts.

    def _approval_records(self) -> dict[str, tuple[KV, dict[str, Any]]]:
        """The approval records that parse (views and approvers; not counted here: the watch counts each
        revision once, in on_rack_change)."""
        pre = f"{self.root}/approvals/"
        now = self.clock()
        out = {}
        for key, kv in list(self.mirror.items()):
            if key.startswith(pre):
                try:
                    out[key[len(pre):]] = (kv, pending_record(kv.value, now, self.skew, self.approval_expiry))
                except RecordError:
                    continue
        return out

    @property
    def approval_expiry(self) -> float:
        return float(self.guardrails.approval_expiry_seconds)

    def pending_added(self, pending: Any, incident: Any) -> None:
        """The leader reached a destructive shared step: make its approval rack state (or adopt its own)."""
        if not (self.up() and self.is_leader()) or pending.action not in ("cdu_write", "pdu_outlet"):
            return
        rid = rack_approval_id(incident.key, incident.id, pending.action, pending.target, pending.phase)
        pending.rack_id = rid
        pending.rack_doc = {
            "id": rid, "incident_id": incident.id, "incident_key": incident.key,
            "incident_opened_at": incident.opened_at, "detector": incident.detector, "targets": incident.targets,
            "playbook": pending.playbook, "action": pending.action, "target": pending.target,
            "phase": pending.phase, "approval": pending.approval, "created_at": pending.created_at,
            "expires_at": pending.expires_at, "state": "pending", "requested_by": self.node}
        if pending.evidence is not None:  # a leak's dry history: shown with the record on every agent
            pending.rack_doc["evidence"] = approval_evidence.stored(pending.evidence())
        self.local_pending[rid] = pending
        loop = asyncio.get_running_loop()
        loop.create_task(self._publish_pending(rid, pending))
        if pending.evidence is not None:
            loop.create_task(self._follow_evidence(rid, pending))

    async def _follow_evidence(self, rid: str, p: Any, every: float = 0.5) -> None:
        """While the step waits, its record's evidence follows the leader's (approval_evidence: only a change of
        a detector's state rewrites it). A write that loses to a person's approval (or anything else that
        changed the record) is not retried: the record changed, and the next look starts from it."""
        key = f"{self.root}/approvals/{rid}"
        while self.local_pending.get(rid) is p and not p.future.done():
            await asyncio.sleep(every)
            kv = self.mirror.get(key)
            now = approval_evidence.stored(p.evidence())
            if now == p.rack_doc.get("evidence") or kv is None or p.rack_revision is None \
                    or kv.create_revision != p.rack_revision or not self.up():
                continue
            try:
                doc = parse_json(kv.value)
            except RecordError:
                continue
            if not isinstance(doc, dict) or doc.get("state") != "pending":
                continue  # approved (or garbled: _check_approval refuses it and writes it afresh)
            try:  # our own record, whatever else the key holds now
                ok, _, _ = await self.client.txn([cmp_mod(key, kv.mod_revision)],
                                                 [op_put(key, json.dumps(dict(p.rack_doc, evidence=now)))])
            except EtcdError:
                continue
            if ok:
                p.rack_doc["evidence"] = now

    async def _publish_pending(self, rid: str, p: Any, tries: int = 3) -> None:
        """Create the step's pending record; its create revision is what an approval must name. A record
        already there is adopted only when it is this agent's own record of this very step (a restart), pending
        or genuinely approved; anything else (planted, garbled, approved without proof) is deleted and the
        record made afresh."""
        if rid in self._publishing:
            return
        self._publishing.add(rid)
        key = f"{self.root}/approvals/{rid}"
        try:
            for _ in range(tries):
                if p.future.done() or self.local_pending.get(rid) is not p:
                    return
                ok, responses, rev = await self.client.txn([cmp_create(key, 0)],
                                                           [op_put(key, json.dumps(p.rack_doc))], [op_get(key)])
                if ok:
                    p.rack_revision, p.rack_created_at = rev, p.created_at
                    seen = self.mirror.get(key)
                    if seen is not None and seen.create_revision == rev:  # a change the watch brought meanwhile
                        self._check_approval(rid, seen, republish=False)
                    return
                kvs = responses[0]["response_range"].get("kvs") or []
                if not kvs:
                    continue
                old = KV.from_json(kvs[0])
                doc = self._own_record(rid, p, old)
                if doc is not None:
                    p.rack_revision, p.rack_created_at = old.create_revision, min(p.created_at, doc["created_at"])
                    if self._check_approval(rid, old, republish=False):
                        return
                await self.client.txn([cmp_mod(key, old.mod_revision)], [op_delete(key)])
            log.warning("rack approval not recorded: its key kept being rewritten", extra={"id": rid})
        except (EtcdError, KeyError, IndexError, TypeError, ValueError) as exc:
            log.warning("rack approval not recorded; approve on this agent", extra={"error": str(exc)[:200]})
        finally:
            self._publishing.discard(rid)

    def _own_record(self, rid: str, p: Any, kv: KV) -> dict[str, Any] | None:
        """The record at `rid` when it is this agent's own pending (or approved) record of step `p`."""
        try:
            doc = pending_record(kv.value, self.clock(), self.skew, max(self.approval_expiry, p.expires_at - p.created_at))
        except RecordError as exc:
            self.rejections.error("approval", kv.key, kv.mod_revision, exc)
            return None
        mine = (doc["id"], doc["incident_id"], doc["action"], doc["target"], doc["phase"], doc["requested_by"])
        if mine != (rid, p.incident_id, p.action, p.target, p.phase, self.node) or doc["state"] == "consumed":
            self.rejections.reject("approval", "planted", kv.key, kv.mod_revision,
                                   "a record of this step that this agent did not write")
            return None
        return doc

    def pending_removed(self, pending: Any, approved: bool) -> None:
        rid = getattr(pending, "rack_id", None)
        if rid is None or self.local_pending.pop(rid, None) is None:
            return
        if approved and self.up():
            asyncio.get_running_loop().create_task(self._consume(rid))

    async def _consume(self, rid: str) -> None:
        key = f"{self.root}/approvals/{rid}"
        try:
            kv = await self.client.get(key)
            doc = parse_json(kv.value) if kv is not None else None
            if not isinstance(doc, dict):
                return
            doc = dict(doc, state="consumed", consumed_by=self.node, consumed_at=self.clock())
            await self.client.txn([cmp_mod(key, kv.mod_revision)], [op_put(key, json.dumps(doc))])
        except (EtcdError, RecordError):
            pass

    def _check_approval(self, rid: str, kv: KV | None, republish: bool = True) -> bool:
        """A change of a step's record this agent waits on: a genuine approval is journaled and lets the step
        act; a claimed one that is not (planted, stale, other episode, no or wrong proof) is refused, counted,
        journaled with why, and the pending record is written afresh so a person can still approve.
        False: refused; True: pending still, approved, or nothing of ours to check."""
        p = self.local_pending.get(rid)
        if p is None or p.future.done() or p.rack_revision is None:
            return True
        if kv is None:  # deleted under us: ask again
            if republish:
                asyncio.get_running_loop().create_task(self._publish_pending(rid, p))
            return True
        if (kv.key, kv.mod_revision) in p.refused:
            return False
        step = Step(rid, p.incident_id, p.action, p.target, p.phase, p.rack_revision, p.rack_created_at)
        try:
            approval = approval_of(kv.value, kv.create_revision, kv.mod_revision, step, self.admin_tokens(),
                                   self.inventory_nodes, self.clock(), self.skew,
                                   max(self.approval_expiry, p.expires_at - p.created_at))
        except RecordError as exc:
            p.refused.add((kv.key, kv.mod_revision))
            self.rejections.error("approval", kv.key, kv.mod_revision, exc)
            self._journal_approval(p, "refused", {"why": exc.why, "detail": exc.detail[:300], "rack": True,
                                                  "rack_id": rid, "rack_revision": kv.mod_revision,
                                                  "pending_revision": p.rack_revision})
            if republish:
                asyncio.get_running_loop().create_task(self._publish_pending(rid, p))
            return False
        if approval is not None:
            log.info("rack approval verified", extra={"id": rid, "by": approval.approved_by,
                                                      "via": approval.approved_via})
            self._journal_approval(p, "approved", approval.journal_detail(rid, p.rack_revision))
            p.future.set_result(True)
        return True

    def _journal_approval(self, p: Any, result: str, detail: dict[str, Any]) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.journal.append("approval", action_id=p.id, incident_id=p.incident_id, playbook=p.playbook,
                                  action=p.action, target=p.target, result=result,
                                  detail={"phase": p.phase, **detail})

    def on_rack_change(self, key: str) -> None:
        """Each revision of an approval record, once: the step this agent waits on checks it; any other record
        that fails its schema (planted, garbled, a ten-year expiry) is counted and ignored by every view."""
        pre = f"{self.root}/approvals/"
        if not key.startswith(pre):
            return
        rid, kv = key[len(pre):], self.mirror.get(key)
        if rid in self.local_pending:
            self._check_approval(rid, kv)
        elif kv is not None:
            try:
                pending_record(kv.value, self.clock(), self.skew, self.approval_expiry)
            except RecordError as exc:
                self.rejections.error("approval", key, kv.mod_revision, exc)

    def _live(self, doc: dict[str, Any], now: float) -> bool:
        """A record a person may approve now: pending, unexpired, asked by the agent that leads now."""
        return doc["state"] == "pending" and doc["expires_at"] > now and doc["requested_by"] == self.leader_node()

    def _same_episode(self, inc: Any, doc: dict[str, Any], now: float) -> bool:
        """Is the leader's record a step of this agent's incident `inc` (same fault, same episode)? Each agent
        has its own incident id for one leak; the leader's incident opened while this one was open (give or
        take EPISODE_LAG_SECONDS of detection lag, and the clock skew). An open incident approves the steps that act on
        it, a resolved one those that undo it."""
        if doc["incident_key"] != inc.key or (doc["phase"] == "apply") != (inc.state != "resolved"):
            return False
        try:
            opened = wall_time(doc.get("incident_opened_at"), "incident_opened_at", now, self.skew)
        except RecordError:
            return False
        end = inc.resolved_at if inc.resolved_at is not None else now
        slack = EPISODE_LAG_SECONDS + self.skew
        return inc.opened_at - slack <= opened <= end + slack

    def approval_candidates(self, ident: str, incidents: list[Any]) -> tuple[bool, list[dict[str, Any]]]:
        """(exact, steps): the rack step whose id is `ident` (exact), else the live rack steps of the episode
        `ident` names: the leader's incident id, or this agent's own incident of the same episode."""
        now = self.clock()
        live = {rid: (kv, doc) for rid, (kv, doc) in self._approval_records().items() if self._live(doc, now)}
        if ident in live:
            return True, [self._view(ident, live[ident][1])]
        mine = [i for i in incidents if i.id == ident]
        return False, [self._view(rid, doc) for rid, (_, doc) in sorted(live.items())
                       if doc["incident_id"] == ident or any(self._same_episode(i, doc, now) for i in mine)]

    async def approve(self, rids: list[str], who: str, subject: str | None = None, all_: bool = False) -> list[str]:
        """Approve these live rack steps as the person whose admin token is named `who`: each record gets
        the approval and its proof (keyed with that token), for the leader to check."""
        secret = self.admin_tokens().get(who)
        if secret is None:
            log.warning("rack approval not written: no admin token of that name here", extra={"who": who[:60]})
            return []
        done = []
        records = self._approval_records()
        now = self.clock()
        for rid in rids:
            kv, doc = records.get(rid, (None, None))
            if kv is None or not self._live(doc, now):
                continue
            at = self.clock()
            doc = dict(doc, state="approved", approved_by=who, approved_via=self.node, approved_at=at,
                       pending_revision=kv.create_revision, all=all_,
                       proof=approval_proof(secret, rid, kv.create_revision, doc["incident_id"], who, at, self.node,
                                            all_),
                       **({"subject": subject} if subject and subject != who else {}))
            try:
                ok, _, _ = await self.client.txn([cmp_mod(kv.key, kv.mod_revision)], [op_put(kv.key, json.dumps(doc))])
            except EtcdError as exc:
                log.warning("rack approval not written", extra={"id": rid, "error": str(exc)[:200]})
                continue
            if ok:
                done.append(rid)
        return done

    def incident_closed(self, incident: Any) -> None:
        """The fault is over here: the steps this agent asked for, still waiting for a person, no longer
        need one (records of an agent that no longer leads are dropped too: nobody acts on them)."""
        if not self.up():
            return
        leader = self.leader_node()
        stale = [kv for kv, doc in self._approval_records().values()
                 if doc["incident_key"] == incident.key and doc["state"] == "pending"
                 and (doc["requested_by"] != leader or (doc["requested_by"] == self.node and doc["phase"] == "apply"))]
        if stale:
            asyncio.get_running_loop().create_task(self._drop(stale))

    async def _drop(self, kvs: list[Any]) -> None:
        for kv in kvs:
            try:
                await self.client.txn([cmp_mod(kv.key, kv.mod_revision)], [op_delete(kv.key)])
            except EtcdError:
                pass

    def _view(self, rid: str, doc: dict[str, Any]) -> dict[str, Any]:
        evidence = doc.get("evidence")  # checked with the record (pending_record); its seconds counted now
        return {"id": rid, "incident_id": doc["incident_id"], "incident_key": doc["incident_key"],
                "playbook": doc.get("playbook"), "action": doc["action"], "target": doc["target"],
                "phase": doc["phase"], "approval": doc.get("approval"), "created_at": doc["created_at"],
                "expires_at": doc["expires_at"], "rack": True, "requested_by": doc["requested_by"],
                **(approval_evidence.view(evidence, self.clock()) if evidence is not None else {})}

    def pending_view(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [self._view(rid, doc) for rid, (_, doc) in sorted(self._approval_records().items())
                if self._live(doc, now)]
