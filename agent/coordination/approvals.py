"""Rack approval records: what a pending destructive step's record must hold, and when an approval is genuine.

Why: an approval of a shared step (a valve close, a tray power-off) used to be
any unexpired etcd record saying `state: approved`. Whoever could write etcd
approved for a person, and a record planted before a leak (ten-year expiry)
closed a valve 18 ms after the leak made it pending. Here an approval counts
only when all of these hold:

- it answers the pending record the acting agent wrote itself: same rack id,
  same incident id (one episode), same step (action, target, phase), and it
  names that record's create revision R, on a key whose create revision is R
  and whose mod revision is after R (written after the step asked);
- its times are times (`records.wall_time`, skew allowed): the pending
  record's lifetime is at most the configured approval expiry (+ skew), the
  approval is not older than the step that asked;
- it names the person (`approved_by`: the admin token's name) and the agent
  that checked that person's token (`approved_via`, an inventory node);
- it carries `proof`: HMAC-SHA256 over (rack id, R, incident id, who,
  approved_at, approved_via, all) keyed with that admin token's secret. Every agent of a rack
  holds the rack's admin tokens (its config's secrets), so the acting agent
  checks the proof against its own copy of the token named `who`. Etcd never
  holds a token: an etcd writer who does not also hold an admin token cannot
  make a proof, and a proof made for one pending record (R, incident) does not
  fit another.

Under mTLS the API still takes a bearer token (agent.auth), so an approval
through it is proven the same way; the certificate subject goes into the
record as `subject`, for people to read, and is not part of the proof.

Pure functions of (raw value, context), no I/O and no clock of their own, so
they are property-tested on any input.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pydantic import SecretStr

from agent.coordination import approval_evidence
from agent.coordination.records import RecordError, as_object, node_name, parse_json, wall_time

MAX_NAME = 200  # a token name, an id, a target: longer is not one of ours
STATES = ("pending", "approved", "consumed")


def rack_approval_id(incident_key: str, incident_id: str, action: str, target: str, phase: str) -> str:
    """One step of one episode: the incident id (a new id per episode) is in it, not only the fault's key."""
    digest = hashlib.sha1(f"{incident_key}|{incident_id}|{action}|{target}|{phase}".encode()).hexdigest()
    return "rack-" + digest[:12]


def approval_proof(secret: SecretStr | str, rid: str, pending_revision: int, incident_id: str, who: str,
                   approved_at: float, via: str, all_: bool) -> str:
    """HMAC-SHA256 of the approval's identity, keyed with the approving person's admin token. What the acting
    agent journals from the record (via, all) is in it too: an etcd writer cannot rewrite it either."""
    key = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    msg = json.dumps([rid, int(pending_revision), incident_id, who, float(approved_at), via, bool(all_)],
                     separators=(",", ":"))
    return hmac.new(key.encode(), msg.encode(), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Step:
    """What the acting agent knows of the step it waits on (its own memory, never read from etcd)."""

    rid: str
    incident_id: str
    action: str
    target: str
    phase: str
    revision: int  # create revision of the pending record this agent wrote (or adopted)
    created_at: float  # when this agent's step started waiting


@dataclass(frozen=True)
class Approval:
    """A genuine approval, as journaled by the acting agent before it acts."""

    approved_by: str
    approved_via: str
    approved_at: float
    revision: int  # the approval record's mod revision
    subject: str | None = None
    all: bool = False

    def journal_detail(self, rid: str, pending_revision: int) -> dict[str, Any]:
        return {"approved_by": self.approved_by, "approved_via": self.approved_via, "approved_at": self.approved_at,
                "rack": True, "rack_id": rid, "rack_revision": self.revision, "pending_revision": pending_revision,
                "all": self.all, **({"subject": self.subject} if self.subject else {})}


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_NAME:
        raise RecordError("type", f"{what}: expected a non-empty string of at most {MAX_NAME} characters")
    return value


def pending_record(raw: bytes | str, now: float, skew: float, expiry: float) -> dict[str, Any]:
    """The fields of a rack approval record every reader relies on, checked (RecordError otherwise):
    ids and step as short strings, a known state, `created_at` a time not in the future, `expires_at` at most
    `expiry` (+ skew) after it, and the evidence a person is shown, when there is one
    (agent.coordination.approval_evidence). A record that passes may still be a lie about who wrote it: only a proof
    (`approval_of`) makes it an approval."""
    doc = as_object(parse_json(raw), "approval")
    for f in ("id", "incident_id", "incident_key", "action", "target", "phase", "requested_by"):
        _name(doc.get(f), f)
    if doc.get("phase") not in ("apply", "undo"):
        raise RecordError("type", "phase: expected apply or undo")
    if doc.get("state") not in STATES:
        raise RecordError("state", f"state: expected one of {', '.join(STATES)}")
    created = wall_time(doc.get("created_at"), "created_at", now, skew)
    expires = wall_time(doc.get("expires_at"), "expires_at", now + expiry, skew)
    if expires - created > expiry + skew:
        raise RecordError("expiry", f"expires_at: {expires - created:.0f} s after created_at; approvals lapse "
                                    f"after {expiry:g} s")
    if doc.get("evidence") is not None:  # what the person is shown: a leak's dry history (approval_evidence)
        doc["evidence"] = approval_evidence.check(doc["evidence"], now, skew)
    return doc


def claimed_proof(doc: Mapping[str, Any], tokens: Mapping[str, SecretStr], who: str, field: str, what: str
                  ) -> tuple[str, SecretStr]:
    """(the proof a record carries, the secret of the admin token it names in `field`): RecordError `no_proof`
    without one, `unknown_token` when this agent holds no admin token of that name (rack approvals, drills)."""
    given = doc.get("proof")
    if not isinstance(given, str) or len(given) != 64:
        raise RecordError("no_proof", f"{what} without a proof from an admin token")
    secret = tokens.get(who)
    if secret is None:
        raise RecordError("unknown_token", f"{field} {who[:60]!r} is no admin token of this agent")
    return given, secret


def approval_of(raw: bytes | str, create_revision: int, mod_revision: int, step: Step,
                tokens: Mapping[str, SecretStr], nodes: Iterable[str], now: float, skew: float, expiry: float
                ) -> Approval | None:
    """The approval this record gives `step`, None while it is still pending (or consumed), RecordError (with a
    short `why`) when it claims an approval that is not genuine for this step. Never raises anything else."""
    doc = pending_record(raw, now, skew, expiry)
    if doc["state"] != "approved":
        return None
    if doc["id"] != step.rid or (doc["action"], doc["target"], doc["phase"]) != (step.action, step.target,
                                                                                   step.phase):
        raise RecordError("other_step", f"approval of {str(doc['id'])[:40]} {doc['action']} {doc['target'][:80]}")
    if doc["incident_id"] != step.incident_id:
        raise RecordError("other_episode", f"approval for incident {doc['incident_id'][:60]}, "
                                           f"this step is {step.incident_id}")
    rev = doc.get("pending_revision")
    if isinstance(rev, bool) or not isinstance(rev, int) or rev != step.revision or create_revision != step.revision:
        raise RecordError("stale", f"approval of pending revision {rev!r}; the step asked at revision {step.revision}")
    if not mod_revision > create_revision:
        raise RecordError("stale", "approval written with the record itself, not after the step asked")
    at = wall_time(doc.get("approved_at"), "approved_at", now, skew)
    if at < step.created_at - skew or at > doc["expires_at"]:
        raise RecordError("stale", f"approved_at {at:.0f} outside the step's wait "
                                   f"({step.created_at:.0f} .. {doc['expires_at']:.0f})")
    who = _name(doc.get("approved_by"), "approved_by")
    via = node_name(doc.get("approved_via"), "approved_via", nodes)
    given, secret = claimed_proof(doc, tokens, who, "approved_by", "approval")
    flag = doc.get("all", False)
    if not isinstance(flag, bool):
        raise RecordError("type", "all: expected true or false")
    want = approval_proof(secret, step.rid, step.revision, step.incident_id, who, at, via, flag)
    if not hmac.compare_digest(want.encode(), given.encode("utf-8", "replace")):
        raise RecordError("bad_proof", f"proof does not match admin token {who[:60]!r}")
    subject = doc.get("subject")
    return Approval(who, via, at, mod_revision, subject[:MAX_NAME] if isinstance(subject, str) else None, flag)
