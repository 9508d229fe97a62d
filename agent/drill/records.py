"""A drill's rack records: what each agent publishes of drills through rack coordination, and the checks on
what it reads back.

Why a record and not a fact: a zone spans several nodes, each drained by its own agent, and a drill is started
on one agent. The synthetic reading could travel as a shared fact, but a fact is a poll of a shared device,
taken only from that device's poller and checked against the receiver's own source of it: the drilling agent
is usually no poller of the leak controller, and a fact proves which agent filed it, never which person
ordered it. So the agent that checked the admin token (the conductor) announces the drill rack-wide, signed
with that token, and each agent of the zone injects the same synthetic reading into its own store: its own
detector, guardrails and playbook then drain its own node, exactly as it does when the leak controller's poll
reaches it as a fact.

Each agent publishes one document about its own node (static: a line of its drill feed; etcd: the key
`drill/<node>` under its member lease, which only its role may write):

    {"v": 1, "node": <the publisher>, "announce": <announcement or null>, "progress": <its part or null>}

The announcement (`announce`, only a conductor's) carries the plan, the drill's id, who started it (`by`: the
admin token's name), the agent that checked that token (`via`: the publisher), when, its state (`running`,
then `ending`) and `proof`: HMAC-SHA256 over all of that, keyed with the admin token named `by`. Every agent
of a rack holds the rack's admin tokens (as for rack approvals, agent.coordination.approvals), so a reader
checks the proof with its own copy; etcd and the feeds never carry a token. A writer without the token (an
etcd user, whoever answers at a peer's URL) cannot make a drill, nor turn a genuine one's plan, nodes or
`real` actions into others, nor revive one past its abort deadline.

The progress (`progress`) is the publisher's own part of a drill: its incident, the times of its stages (from
its own journal and clock), whether its drain gave the checkpoint signal, what it kept dry-run. It is checked
for shape (a progress that fails is rejected and counted, never used) and can only colour the conductor's
report: nothing acts on it.

Pure functions of (raw value, context), no I/O and no clock of their own, so they are property-tested.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

from pydantic import SecretStr

from agent.coordination.approvals import claimed_proof
from agent.coordination.records import RecordError, as_object, node_name, parse_json, wall_time
from agent.remediation.incidents import STATES as INCIDENT_STATES  # every state an incident can be in

from .plan import DrillPlan, PlanError, check_against_inventory, parse_plan
from .scenarios import Rack, rack_wide

VERSION = 1
ID = re.compile(r"^[A-Za-z0-9_.@:-]{1,120}$")
STATES = ("running", "ending")
PART_STATES = ("running", "ending", "ended", "refused")
NODE_STAGES = ("detected", "decided", "drained", "capped", "notified", "job_notified", "undo_done")
MAX_TEXT = 300
MAX_ROWS = 64


def canonical(doc: Mapping[str, Any]) -> bytes:
    """The bytes a proof is computed over: the record without its proof, keys sorted, no spaces (a float's repr
    survives a JSON round trip, so the reader recomputes exactly what the writer signed)."""
    return json.dumps({k: v for k, v in doc.items() if k != "proof"}, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()


def drill_proof(secret: SecretStr | str, doc: Mapping[str, Any]) -> str:
    key = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    return hmac.new(key.encode(), canonical(doc), hashlib.sha256).hexdigest()


def announcement(plan: DrillPlan, drill_id: str, by: str, via: str, started_at: float, allow_jobs: bool,
                 secret: SecretStr | str, state: str = "running", aborted_by: str | None = None) -> dict[str, Any]:
    """The signed announcement of a drill (`by`: the admin token's name, `secret` that token)."""
    doc = {"v": VERSION, "id": drill_id, "plan": plan.model_dump(mode="json"), "by": by, "via": via,
           "started_at": started_at, "allow_jobs": allow_jobs, "state": state, "aborted_by": aborted_by}
    return {**doc, "proof": drill_proof(secret, doc)}


@dataclass(frozen=True)
class Announced:
    """A drill announcement that checked out: signed by an admin token of this agent, its plan valid here."""

    id: str
    plan: DrillPlan
    by: str
    via: str
    started_at: float
    allow_jobs: bool
    state: str
    aborted_by: str | None

    def deadline(self) -> float:
        """When the drill must have ended wherever it runs (its plan's abort)."""
        return self.started_at + self.plan.abort.after_seconds


def node_doc(node: str, announce: dict[str, Any] | None, progress: dict[str, Any] | None) -> bytes:
    return json.dumps({"v": VERSION, "node": node, "announce": announce, "progress": progress},
                      separators=(",", ":"), allow_nan=False).encode()


def parse_node_doc(raw: bytes | str, publisher: str, nodes: list[str]) -> dict[str, Any]:
    """The document `publisher` published (its stream's peer, its key's node): RecordError unless it is an
    object of this version naming that node."""
    doc = as_object(parse_json(raw), "drill")
    if doc.get("v") != VERSION:
        raise RecordError("version", f"drill record version {str(doc.get('v'))[:20]}, this agent reads {VERSION}")
    node = node_name(doc.get("node"), "node", nodes)
    if node != publisher:
        raise RecordError("mismatch", f"says node {node}, published by {publisher[:60]}")
    return doc


def printable(text: str, limit: int = MAX_TEXT) -> str:
    """A reason as a record carries it: one printable line of at most `limit` characters (an error's text may
    hold line breaks)."""
    return "".join(c if c.isprintable() else " " for c in text)[:limit]


def _text(value: Any, what: str, limit: int = MAX_TEXT) -> str:
    if not isinstance(value, str) or len(value) > limit or not value.isprintable():
        raise RecordError("type", f"{what}: expected a printable string of at most {limit} characters")
    return value


def check_announcement(value: Any, publisher: str, tokens: Mapping[str, SecretStr], rack: Rack, now: float,
                       skew: float) -> Announced:
    """The drill `publisher` announces, or RecordError (its `why` a short label):

    - `type`, `version`; `mismatch`: `via` is not the publisher (an announcement is its conductor's own);
    - `no_proof`, `unknown_token` (`by` names no admin token of this agent), `bad_proof` (not that token's
      HMAC over this very record: forged, or altered after signing);
    - `future` (`started_at` ahead of this clock by more than the skew), `expired` (past its plan's abort: a
      genuine record replayed, or a conductor that never ended it);
    - `plan`: its plan does not validate, or names nodes or a zone this rack's inventory does not have."""
    doc = as_object(value, "announce")
    if doc.get("v") != VERSION:
        raise RecordError("version", f"announcement version {str(doc.get('v'))[:20]}")
    drill_id = doc.get("id")
    if not isinstance(drill_id, str) or not ID.match(drill_id):
        raise RecordError("type", "id: expected a drill id")
    if doc.get("via") != publisher:
        raise RecordError("mismatch", f"via {str(doc.get('via'))[:60]!r}, published by {publisher[:60]}")
    by = _text(doc.get("by"), "by", 200)
    given, secret = claimed_proof(doc, tokens, by, "by", "a drill announcement")
    try:
        want = drill_proof(secret, doc)
    except ValueError:  # NaN or infinity somewhere: no writer of ours signs that
        raise RecordError("bad_proof", "a record no agent signs (not finite JSON)") from None
    if not hmac.compare_digest(want.encode(), given.encode("utf-8", "replace")):
        raise RecordError("bad_proof", f"proof does not match admin token {by[:60]!r}")
    started = wall_time(doc.get("started_at"), "started_at", now, skew)
    state, aborted_by, allow = doc.get("state"), doc.get("aborted_by"), doc.get("allow_jobs")
    if state not in STATES or not isinstance(allow, bool):
        raise RecordError("type", "state: expected running or ending; allow_jobs: true or false")
    if aborted_by is not None:
        _text(aborted_by, "aborted_by", 200)
    try:
        plan = parse_plan(doc.get("plan"), "announce.plan")
        unknown = [n for n in plan.nodes if n not in rack.nodes]
        if unknown:
            raise PlanError(f"nodes: {', '.join(unknown)[:120]} not in this rack's inventory")
        if rack_wide(plan.scenario):
            check_against_inventory(plan, rack)
    except PlanError as exc:
        raise RecordError("plan", str(exc)[:MAX_TEXT]) from None
    if now > started + plan.abort.after_seconds + skew:
        raise RecordError("expired", f"drill {drill_id[:60]} began {now - started:.0f} s ago; its plan aborts "
                                     f"after {plan.abort.after_seconds:g} s")
    return Announced(drill_id, plan, by, publisher, started, allow, state, aborted_by)


def check_progress(value: Any, now: float, skew: float) -> dict[str, Any]:
    """A node's part of a drill, checked for shape (RecordError otherwise): its drill id, a known state, a
    short reason, its incident, the known stages each with a time (not in the future) and journal rows or a
    reason, the checkpoint flag, and bounded lists of dry-run steps and targets acted on."""
    doc = as_object(value, "progress")
    drill_id = doc.get("drill")
    if not isinstance(drill_id, str) or not ID.match(drill_id):
        raise RecordError("type", "progress.drill: expected a drill id")
    if doc.get("state") not in PART_STATES:
        raise RecordError("type", f"progress.state: expected one of {', '.join(PART_STATES)}")
    _text(doc.get("why", ""), "progress.why")
    incident = doc.get("incident")
    if incident is not None:
        _text(incident, "progress.incident", 120)
    if doc.get("incident_state") not in (None, *INCIDENT_STATES) or not isinstance(doc.get("signal", False), bool):
        raise RecordError("type", "progress.incident_state, progress.signal")
    stages = as_object(doc.get("stages", {}), "progress.stages")
    for stage, line in stages.items():
        if stage not in NODE_STAGES:
            raise RecordError("type", f"progress.stages: {str(stage)[:40]!r} is no stage of a node")
        line = as_object(line, f"progress.stages.{stage}")
        if "at" in line:
            wall_time(line["at"], f"progress.stages.{stage}.at", now, skew)
            rows = line.get("journal", [])
            if not isinstance(rows, list) or len(rows) > MAX_ROWS or not all(
                    type(s) is int and s >= 0 for s in rows):
                raise RecordError("type", f"progress.stages.{stage}.journal: expected journal row numbers")
        else:
            _text(line.get("why"), f"progress.stages.{stage}.why")
    for field in ("dry_run", "touched"):
        rows = doc.get(field, [])
        if not isinstance(rows, list) or len(rows) > MAX_ROWS:
            raise RecordError("type", f"progress.{field}: expected at most {MAX_ROWS} entries")
    for d in doc.get("dry_run", []):
        d = as_object(d, "progress.dry_run[]")
        _text(d.get("action"), "progress.dry_run[].action", 64)
        _text(d.get("target"), "progress.dry_run[].target")
        if type(d.get("seq")) is not int:
            raise RecordError("type", "progress.dry_run[].seq: expected a journal row number")
    for t in doc.get("touched", []):
        _text(t, "progress.touched[]")
    return doc
